#include "model/causal_lm.h"

#include <cmath>

#include "kernels/error.h"
#include "model/int8_linear.h"
#include "model/llama.h"
#include "model/lora_linear.h"
#include "model/safetensors.h"

namespace ft {

CausalLM::CausalLM(const ModelConfig& config, Backend& backend, const ModelOptions& options)
    : config_(config), backend_(backend), options_(options) {}

CausalLM::~CausalLM() = default;

std::unique_ptr<CausalLM> make_causal_lm(const ModelConfig& config, Backend& backend, const ModelOptions& options) {
  if (config.model_type == "llama") return std::make_unique<LlamaModel>(config, backend, options);
  fail("model_type \"", config.model_type, "\" is not supported (expected \"llama\")");
}

void CausalLM::check_lora_targets(const std::string& module_names) const {
  if (options_.lora.r <= 0) return;
  for (const std::string& target : options_.lora.target_modules) {
    bool matched = false;
    for (const Parameter& adapter : adapters_)
      matched |= module_matches_target(adapter.name.substr(0, adapter.name.find(".lora_")), target);
    FT_CHECK(matched, "lora.target_modules: \"", target, "\" matches no module of this ", config_.model_type,
             " model (its linear modules are ", module_names, ")");
  }
}

bool module_matches_target(const std::string& module_name, const std::string& target) {
  if (module_name == target) return true;
  return module_name.size() > target.size() &&
         module_name.compare(module_name.size() - target.size(), target.size(), target) == 0 &&
         module_name[module_name.size() - target.size() - 1] == '.';
}

Parameter& CausalLM::add_parameter(const std::string& name, const Shape& shape, DType dtype) {
  Parameter parameter;
  parameter.name = name;
  parameter.value = backend_.empty(shape, dtype, MemCategory::weights);
  parameters_.push_back(std::move(parameter));
  return parameters_.back();
}

// A decoder linear: dense or LLM.int8(), wrapped in LoRA when it is a target.
std::unique_ptr<Linear> CausalLM::make_linear(const std::string& module, int64_t out_features,
                                                int64_t in_features) {
  std::unique_ptr<Linear> base;
  if (options_.int8_base) {
    Parameter& weight = add_parameter(module + ".weight", {out_features, in_features}, DType::i8);
    weight.scales = backend_.empty({out_features}, DType::f32, MemCategory::weights);
    base = std::make_unique<Int8Linear>(weight, options_.int8_threshold);
  } else {
    base = std::make_unique<DenseLinear>(add_parameter(module + ".weight", {out_features, in_features},
                                                       options_.weight_dtype));
  }
  const LoraOptions& lora = options_.lora;
  bool targeted = false;
  for (const std::string& target : lora.target_modules) targeted |= module_matches_target(module, target);
  if (lora.r <= 0 || !targeted) return base;
  FT_CHECK(lora.lora_dropout >= 0.0 && lora.lora_dropout < 1.0, "lora.lora_dropout must be in [0, 1), got ",
           lora.lora_dropout);
  auto add_adapter = [&](const std::string& name, const Shape& shape) -> Parameter& {
    Parameter adapter;
    adapter.name = name;
    adapter.value = backend_.empty(shape, DType::f32, MemCategory::adapters);
    adapters_.push_back(std::move(adapter));
    return adapters_.back();
  };
  Parameter& A = add_adapter(module + ".lora_A.weight", {lora.r, in_features});
  Parameter& B = add_adapter(module + ".lora_B.weight", {out_features, lora.r});
  auto adapted = std::make_unique<LoraLinear>(std::move(base), A, B,
                                              lora_scaling(lora.lora_alpha, lora.r, lora.use_rslora),
                                              float(lora.lora_dropout));
  lora_layers_.push_back(adapted.get());
  return adapted;
}

Parameter& CausalLM::parameter(const std::string& name) {
  for (std::deque<Parameter>* list : {&parameters_, &adapters_})
    for (Parameter& p : *list)
      if (p.name == name) return p;
  fail("no parameter named \"", name, "\"");
}

void CausalLM::load(const Checkpoint& checkpoint) {
  for (Parameter& p : parameters_) {
    const SafetensorsEntry& entry = checkpoint.entry(p.name);
    FT_CHECK(entry.shape == p.value.shape, entry.file, ": tensor \"", p.name, "\" has shape ",
             shape_string(entry.shape), " but config.json implies ", shape_string(p.value.shape));
    if (p.value.dtype == DType::i8)
      quantize_parameter(backend_, p, checkpoint.view(p.name));
    else
      backend_.copy(p.value, checkpoint.view(p.name));
  }
}

// splitmix64 finaliser: decorrelates seeds derived from (seed, index).
static uint64_t mix_seed(uint64_t seed, uint64_t index) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (index + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void CausalLM::init_random(uint64_t seed) {
  HostAllocator host;
  uint64_t index = 0;
  for (Parameter& p : parameters_) {
    FT_CHECK(p.value.dtype != DType::i8, "random initialisation needs quantization.mode none");
    Tensor values = Tensor::empty(p.value.shape, DType::f32, host, MemCategory::workspace);
    uint64_t state = mix_seed(seed, index++);
    const bool is_norm = p.value.ndim() == 1;
    for (int64_t i = 0; i < values.numel(); i += 2) {
      // Box-Muller: two normals from two uniforms in (0, 1].
      state = mix_seed(state, 0);
      const double u1 = (double(state >> 11) + 1.0) / 9007199254740992.0;
      state = mix_seed(state, 0);
      const double u2 = double(state >> 11) / 9007199254740992.0;
      const double radius = std::sqrt(-2.0 * std::log(u1));
      const double normals[2] = {radius * std::cos(2 * M_PI * u2), radius * std::sin(2 * M_PI * u2)};
      for (int64_t k = 0; k < 2 && i + k < values.numel(); ++k)
        values.ptr<float>()[i + k] = is_norm ? 1.0f : float(config_.initializer_range * normals[k]);
    }
    backend_.copy(p.value, values);
  }
}

void CausalLM::init_adapters(uint64_t seed) {
  for (size_t i = 0; i + 1 < adapters_.size(); i += 2)
    init_lora_parameters(backend_, adapters_[i], adapters_[i + 1], mix_seed(seed, i));
}

void CausalLM::set_dropout_seed(uint64_t seed) {
  for (size_t i = 0; i < lora_layers_.size(); ++i) lora_layers_[i]->set_dropout_seed(mix_seed(seed, i));
}

void CausalLM::set_training(bool training) {
  for (LoraLinear* layer : lora_layers_) layer->set_training(training);
}

void CausalLM::set_trainable(const std::function<bool(const std::string&)>& is_trainable) {
  for (Parameter& p : parameters_) {
    FT_CHECK(!is_trainable(p.name) || p.value.dtype != DType::i8, "\"", p.name,
             "\" is frozen in int8 and cannot be trained (use quantization.mode none for full fine-tuning)");
  }
  for (std::deque<Parameter>* list : {&parameters_, &adapters_})
  for (Parameter& p : *list) {
    if (!is_trainable(p.name)) {
      p.grad = Tensor{};
    } else if (!p.trainable()) {
      p.grad = backend_.empty(p.value.shape, DType::f32, MemCategory::gradients);
      backend_.fill(p.grad, 0.0f);
    }
  }
}

void CausalLM::zero_grads() {
  for (std::deque<Parameter>* list : {&parameters_, &adapters_})
    for (Parameter& p : *list)
      if (p.trainable()) backend_.fill(p.grad, 0.0f);
}

}  // namespace ft
