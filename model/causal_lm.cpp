#include "model/causal_lm.h"

#include <algorithm>
#include <cmath>

#include "kernels/error.h"
#include "model/gpt_neox.h"
#include "model/int8_linear.h"
#include "model/llama.h"
#include "model/lora_linear.h"
#include "model/safetensors.h"

namespace ft {

CausalLM::CausalLM(const ModelConfig& config, Backend& backend, const ModelOptions& options)
    : config_(config), backend_(backend), options_(options) {
  FT_CHECK(options.loss_chunk_tokens >= 0, "loss_chunk_tokens must be >= 0 (0: unchunked), got ",
           options.loss_chunk_tokens);
}

CausalLM::~CausalLM() = default;

float CausalLM::forward(const Tensor& input_ids, const Tensor& targets) {
  set_training(false);
  return run_step(input_ids, targets, nullptr);
}

float CausalLM::forward_backward(const Tensor& input_ids, const Tensor& targets, float grad_scale) {
  set_training(true);
  return run_step(input_ids, targets, &grad_scale);
}

std::unique_ptr<CausalLM> make_causal_lm(const ModelConfig& config, Backend& backend, const ModelOptions& options) {
  if (config.model_type == "llama") return std::make_unique<LlamaModel>(config, backend, options);
  if (config.model_type == "gpt_neox") return std::make_unique<GptNeoxModel>(config, backend, options);
  fail("model_type \"", config.model_type, "\" is not supported (expected \"llama\" or \"gpt_neox\")");
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
                                                int64_t in_features, bool bias) {
  std::unique_ptr<Linear> base;
  if (options_.int8_base) {
    Parameter& weight = add_parameter(module + ".weight", {out_features, in_features}, DType::i8);
    weight.scales = backend_.empty({out_features}, DType::f32, MemCategory::weights);
    Parameter* b = bias ? &add_parameter(module + ".bias", {out_features}, options_.weight_dtype) : nullptr;
    base = std::make_unique<Int8Linear>(weight, options_.int8_threshold, b);
  } else {
    Parameter& weight = add_parameter(module + ".weight", {out_features, in_features}, options_.weight_dtype);
    Parameter* b = bias ? &add_parameter(module + ".bias", {out_features}, options_.weight_dtype) : nullptr;
    base = std::make_unique<DenseLinear>(weight, b);
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
    if (entry.dtype == DType::i8) {
      // A saved quantised base (save_quantized_base): codes plus bitsandbytes'
      // row scales "<name>.SCB", taken as they are instead of requantising.
      const std::string scb = p.name + ".SCB";
      FT_CHECK(p.value.dtype == DType::i8, entry.file, ": tensor \"", p.name,
               "\" is stored int8 (a quantised base) and loads only with quantization.mode int8");
      const SafetensorsEntry& scales = checkpoint.entry(scb);
      FT_CHECK(scales.dtype == DType::f32 && scales.shape == p.scales.shape, scales.file, ": tensor \"", scb,
               "\" must be F32 ", shape_string(p.scales.shape), ", got ", dtype_name(scales.dtype), " ",
               shape_string(scales.shape));
      backend_.copy(p.value, checkpoint.view(p.name));
      backend_.copy(p.scales, checkpoint.view(scb));
      checkpoint.release(scb);
    } else if (p.value.dtype == DType::i8) {
      quantize_parameter(backend_, p, checkpoint.view(p.name));
    } else {
      backend_.copy(p.value, checkpoint.view(p.name));
    }
    // Done with the source bytes: drop their pages so the mapped checkpoint
    // holds about one tensor resident, not the whole file, at peak.
    checkpoint.release(p.name);
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
    Tensor values = Tensor::empty(p.value.shape, DType::f32, host, MemCategory::workspace);
    uint64_t state = mix_seed(seed, index++);
    // As transformers: biases (linear and LayerNorm) 0, norm weights 1, the rest normal.
    const bool is_bias = p.name.size() > 5 && p.name.compare(p.name.size() - 5, 5, ".bias") == 0;
    const bool is_norm = p.value.ndim() == 1 && !is_bias;
    for (int64_t i = 0; i < values.numel(); i += 2) {
      // Box-Muller: two normals from two uniforms in (0, 1].
      state = mix_seed(state, 0);
      const double u1 = (double(state >> 11) + 1.0) / 9007199254740992.0;
      state = mix_seed(state, 0);
      const double u2 = double(state >> 11) / 9007199254740992.0;
      const double radius = std::sqrt(-2.0 * std::log(u1));
      const double normals[2] = {radius * std::cos(2 * M_PI * u2), radius * std::sin(2 * M_PI * u2)};
      for (int64_t k = 0; k < 2 && i + k < values.numel(); ++k)
        values.ptr<float>()[i + k] = is_bias ? 0.0f : is_norm ? 1.0f : float(config_.initializer_range * normals[k]);
    }
    // An INT8 base is quantised from the f32 values, as load() does a 16-bit checkpoint.
    if (p.value.dtype == DType::i8) quantize_parameter(backend_, p, values);
    else backend_.copy(p.value, values);
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

// Uploads a host i32 [B, T] tensor as i32 [B*T] on the backend. Host only:
// the targets are also counted on the host (upload_step_tokens).
static Tensor upload_tokens(Backend& backend, const Tensor& host_tokens, const std::string& model_type) {
  FT_CHECK(host_tokens.dtype == DType::i32 && host_tokens.ndim() == 2 && host_tokens.device == Device::cpu,
           model_type, ": token tensors must be host i32 [B, T], got ", dtype_name(host_tokens.dtype), " ",
           shape_string(host_tokens.shape), host_tokens.device == Device::cpu ? "" : " on the device");
  Tensor tokens = backend.empty({host_tokens.numel()}, DType::i32, MemCategory::activations);
  backend.copy(tokens, host_tokens.reshaped({host_tokens.numel()}));
  return tokens;
}

CausalLM::StepTokens CausalLM::upload_step_tokens(const Tensor& input_ids, const Tensor& targets) {
  const std::string& type = config_.model_type;
  FT_CHECK(input_ids.shape == targets.shape, type, ": input_ids ", shape_string(input_ids.shape), " and targets ",
           shape_string(targets.shape), " differ in shape");
  StepTokens tokens;
  tokens.ids = upload_tokens(backend_, input_ids, type);
  tokens.targets = upload_tokens(backend_, targets, type);
  tokens.batch = input_ids.dim(0);
  tokens.seq = input_ids.dim(1);
  FT_CHECK(tokens.seq <= config_.max_position_embeddings, type, ": sequence of ", tokens.seq,
           " tokens exceeds max_position_embeddings ", config_.max_position_embeddings);
  const int64_t N = tokens.batch * tokens.seq;
  HostAllocator host;
  Tensor host_positions = Tensor::empty({tokens.batch, tokens.seq}, DType::i32, host, MemCategory::activations);
  for (int64_t n = 0; n < N; ++n) host_positions.ptr<int32_t>()[n] = int32_t(n % tokens.seq);
  tokens.positions = upload_tokens(backend_, host_positions, type);
  for (int64_t n = 0; n < N; ++n) tokens.counted += targets.ptr<int32_t>()[n] != -100;
  return tokens;
}

void CausalLM::forward_decoder(DecoderStep& step, const Tensor& input_ids, const Tensor& targets,
                               const Parameter& embedding, bool training) {
  Backend& be = backend_;
  step.tokens = upload_step_tokens(input_ids, targets);
  const int64_t B = step.tokens.batch, T = step.tokens.seq, C = config_.hidden_size;
  const DType act = options_.activation_dtype;
  step.residuals.push_back(be.empty({B, T, C}, act, MemCategory::activations));
  Tensor embedded = step.residuals[0].reshaped({B * T, C});
  be.embedding_forward(embedded, step.tokens.ids, embedding.value);
  const bool keep = training && options_.activation_checkpointing == ActivationCheckpointing::none;
  step.layers.resize(size_t(config_.num_hidden_layers));
  NormOutput norm;  // each layer's input under its input norm, made by the layer before
  for (size_t i = 0; i < step.layers.size(); ++i) {
    step.residuals.push_back(be.empty({B, T, C}, act, MemCategory::activations));
    std::unique_ptr<SavedActivations> saved =
        forward_layer(i, step.residuals[i], norm, &step.residuals[i + 1], step.tokens.positions);
    if (keep) step.layers[i] = std::move(saved);  // else freed here, before the next layer runs
  }
  step.final_norm = std::move(norm);
}

void CausalLM::backward_decoder(DecoderStep& step, Tensor& dresidual, Parameter& embedding) {
  for (size_t i = step.layers.size(); i-- > 0;) {
    // A checkpointed layer runs its forward again from its kept input,
    // without the output (residuals[i + 1] still holds it) or the next norm.
    if (!step.layers[i]) {
      NormOutput input_norm;
      step.layers[i] = forward_layer(i, step.residuals[i], input_norm, nullptr, step.tokens.positions);
    }
    step.residuals[i + 1] = Tensor{};
    backward_layer(i, *step.layers[i], dresidual, step.residuals[i], step.tokens.positions);
    step.layers[i] = nullptr;
  }
  const int64_t N = step.tokens.batch * step.tokens.seq;
  if (embedding.trainable())
    backend_.embedding_backward(embedding.grad, step.tokens.ids, dresidual.reshaped({N, config_.hidden_size}));
}

float CausalLM::lm_head_loss(const Tensor& hidden, Parameter& lm_head, const StepTokens& tokens, Tensor* dhidden,
                             float grad_scale) {
  Backend& be = backend_;
  const int64_t N = hidden.rows(), V = config_.vocab_size;
  const bool training = dhidden != nullptr, backward = training && tokens.counted > 0;
  const int64_t chunk = training && options_.loss_chunk_tokens > 0 ? std::min(options_.loss_chunk_tokens, N) : N;
  Tensor losses = be.empty({N}, DType::f32, MemCategory::activations);
  if (backward) *dhidden = be.empty(hidden.shape, hidden.dtype, MemCategory::activations);
  const float dloss = backward ? grad_scale / float(tokens.counted) : 0.0f;
  for (int64_t first = 0; first < N; first += chunk) {
    const int64_t rows = std::min(chunk, N - first);
    const Tensor hidden_rows = hidden.slice_rows(first, rows);
    Tensor logits = be.empty({rows, V}, DType::f32, MemCategory::activations);
    be.matmul(logits, hidden_rows, lm_head.value, false, true);
    Tensor chunk_losses = losses.slice_rows(first, rows);
    be.cross_entropy(chunk_losses, backward ? &logits : nullptr, logits, tokens.targets.slice_rows(first, rows),
                     dloss);
    if (!training) last_logits_ = logits;  // eval: one chunk, all N rows
    if (!backward) continue;
    // logits now hold dlogits (f32, from the f32 loss): the chunk's share of
    // both gradients, then it is freed. With narrower activations dlogits is
    // rounded to their dtype first, as autocast's backward does: an f32
    // dlogits times a bf16 lm_head would make CudaBackend::matmul widen the
    // whole [V, C] weight to f32 scratch, and the chunk copy is far smaller.
    Tensor dlogits = logits;
    if (hidden.dtype != DType::f32) {
      dlogits = be.empty({rows, V}, hidden.dtype, MemCategory::activations);
      be.copy(dlogits, logits);
      logits = Tensor{};
    }
    Tensor dhidden_rows = dhidden->slice_rows(first, rows);
    be.matmul(dhidden_rows, dlogits, lm_head.value, false, false);
    if (lm_head.trainable()) be.matmul(lm_head.grad, dlogits, hidden_rows, true, false, 1.0f, 1.0f);
  }

  HostAllocator host;
  Tensor host_losses = Tensor::empty({N}, DType::f32, host, MemCategory::activations);
  be.copy(host_losses, losses);
  double loss_sum = 0.0;
  for (int64_t n = 0; n < N; ++n) loss_sum += host_losses.ptr<float>()[n];
  return tokens.counted ? float(loss_sum / double(tokens.counted)) : 0.0f;
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
