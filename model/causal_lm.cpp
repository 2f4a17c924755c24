#include "model/causal_lm.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>

#include "kernels/checked_mul.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/dropout_hash.h"
#include "kernels/error.h"
#include "model/layer_stream.h"
#include "model/lora_linear.h"
#include "model/lora_pattern.h"
#include "model/quant/formats.h"
#include "model/rope.h"
#include "model/safetensors.h"
#include "model/tensor_parallel.h"

namespace ft {

// The decoder layer a module belongs to ("model.layers.3.mlp.up_proj": 3), -1 for none.
static int64_t decoder_layer_of(const std::string& module) {
  const std::string marker = ".layers.";
  const size_t at = module.find(marker);
  if (at == std::string::npos) return -1;
  const size_t first = at + marker.size(), end = module.find('.', first);
  const std::string digits = module.substr(first, end == std::string::npos ? std::string::npos : end - first);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

LanguageModel::LanguageModel(const ModelConfig& config, Backend& backend, const ModelOptions& options)
    : config_(config), backend_(backend), options_(options) {
  FT_CHECK(options.loss_chunk_tokens >= 0, "loss_chunk_tokens must be >= 0 (0: unchunked), got ",
           options.loss_chunk_tokens);
  FT_CHECK(options.mlp_chunk_tokens >= 0, "mlp_chunk_tokens must be >= 0 (0: unchunked), got ",
           options.mlp_chunk_tokens);
  LayerRange& layers = options_.layers;
  if (layers.end_layer == 0) layers.end_layer = config.num_hidden_layers;
  FT_CHECK(layers.first_layer >= 0 && layers.first_layer < layers.end_layer &&
               layers.end_layer <= config.num_hidden_layers,
           config.model_type, ": a stage's layers must be a non-empty range within the model's ",
           config.num_hidden_layers, ", got [", layers.first_layer, ", ", layers.end_layer, ")");
  FT_CHECK(!options.stream_base || (first_stage() && last_stage()), config.model_type,
           ": a streamed base (offload.base: host) runs in one pipeline stage");
  FT_CHECK(!options.offload_activations || options.activation_checkpointing == ActivationCheckpointing::per_layer,
           config.model_type, ": offload.activations: host keeps the per-layer checkpoints in host memory: it needs ",
           "activation_checkpointing: per_layer");
  FT_CHECK(!options.offload_activations || (first_stage() && last_stage()), config.model_type,
           ": offload.activations: host runs in one pipeline stage (micro-batches in flight would share its buffers)");
  FT_CHECK(!options.offload_activations || backend.device() != Device::cpu, config.model_type,
           ": offload.activations: host moves the checkpoints from a GPU to host memory; on the CPU they are in host ",
           "memory already (set offload.activations: device)");
  if (!options_.lora) return;
  LoraOptions& lora = *options_.lora;
  FT_CHECK(lora.r > 0, "lora.r must be > 0, got ", lora.r);
  check_lora_patterns(lora, config.model_type + ": lora.");
  FT_CHECK(lora.lora_dropout >= 0.0 && lora.lora_dropout < 1.0, "lora.lora_dropout must be in [0, 1), got ",
           lora.lora_dropout);
  FT_CHECK(!lora.target_modules.empty() || !lora.target_modules_regex.empty(), config.model_type,
           ": lora.target_modules is empty (make_language_model fills in the family's default)");
  check_lora_targets(lora, config.model_type + ": lora.");
  FT_CHECK(!lora.use_dora || !options.tensor_parallel || options.tensor_parallel->ranks() == 1,
           "lora.use_dora: true is not supported with parallel.tensor above 1 (a row-parallel weight's row norms "
           "span the ranks)");
  FT_CHECK(!lora.use_dora || !options.stream_base, "lora.use_dora: true is not supported with offload.base: host "
           "(the magnitude starts as the base weight's row norms, which a streamed base does not hold at start)");
}

LanguageModel::~LanguageModel() = default;

void LanguageModel::check_built(const std::string& module_names) {
  FT_CHECK((embedding_ || !first_stage()) && ((final_norm_.weight && lm_head_) || !last_stage()), config_.model_type,
           ": the architecture must set its embedding (first stage), final norm and lm_head (last stage)");
  const int64_t C = config_.hidden_size;
  if (last_stage() && options_.output_head == OutputHead::score)
    output_head_.weight = &add_parameter(kScoreWeightName, {1, C}, options_.weight_dtype);
  if (last_stage() && options_.output_head == OutputHead::value) {
    output_head_.weight = &add_parameter(kValueWeightName, {1, C}, options_.weight_dtype);
    output_head_.bias = &add_parameter(kValueBiasName, {1}, options_.weight_dtype);
  }
  if (streamed_layers() > 0) {
    std::vector<std::vector<Parameter*>> layers(static_cast<size_t>(streamed_layers()));
    for (Parameter& p : parameters_) {
      const int64_t layer = decoder_layer_of(p.name);
      if (layer >= 0 && layer < streamed_layers() && p.is_quantized())
        layers[size_t(layer)].push_back(&p);
    }
    layer_stream_ = std::make_unique<LayerStream>(backend_, std::move(layers),
                                                  std::min(options_.stream_slots, streamed_layers()));
  }
  if (!options_.lora) return;
  check_targets(module_names);
  std::vector<std::string>& targets = options_.lora->target_modules;
  if (targets == std::vector<std::string>{kAllLinear}) {
    // As PEFT: "all-linear" becomes the names of the linear modules (every
    // decoder linear, not the output head, exclude_modules or not: it stays
    // beside them), which adapter_config.json lists. Every pipeline stage
    // holds the same kinds, so each writes the same list.
    targets = linear_module_leaves();
  }
}

std::vector<std::string> LanguageModel::linear_module_leaves() const {
  std::vector<std::string> leaves;
  for (const std::string& module : linear_modules_) {
    const std::string leaf = module.substr(module.rfind('.') + 1);
    if (std::find(leaves.begin(), leaves.end(), leaf) == leaves.end()) leaves.push_back(leaf);
  }
  return leaves;
}

// A list target is not the output head or an embedding (a name that matches
// no module is skipped, as PEFT skips it: a run's config refuses it,
// check_target_names in trainer/setup.cpp); a string one fully matches none
// of the modules LoRA does not adapt here (PEFT would adapt an embedding or
// the output head, and refuses a norm or a block); and something is adapted.
void LanguageModel::check_targets(const std::string& module_names) {
  const LoraOptions& lora = *options_.lora;
  for (const std::string& target : lora.target_modules) {
    if (target == kAllLinear) continue;
    // PEFT can put LoRA on the output head or an embedding; this trainer adapts the decoder's linear modules only.
    static const char* const kHeadsAndEmbeddings[] = {"lm_head", "embed_out", "embed_tokens", "embed_in", "shared"};
    for (const char* name : kHeadsAndEmbeddings)
      FT_CHECK(target != name, "lora.target_modules: \"", target, "\" is the output head or an embedding: LoRA on it "
               "is not supported here (PEFT's modules_to_save trains it whole; the linear modules are ", module_names, ")");
  }
  if (!lora.target_modules_regex.empty()) {
    auto refuse_match = [&](const std::string& module) {
      FT_CHECK(!regex_fullmatch(lora.target_modules_regex, module, "lora.target_modules"),
               "lora.target_modules: \"", lora.target_modules_regex, "\" matches ", module,
               ", which is not a linear module: LoRA adapts the decoder's linear modules here (", module_names, ")");
    };
    std::set<std::string> seen;
    for (const Parameter& p : parameters_) {
      // Every module above a parameter (model, model.layers, model.layers.0,
      // ...) down to a linear one, which holds the parameter; each once.
      for (size_t dot = p.name.find('.'); dot != std::string::npos; dot = p.name.find('.', dot + 1)) {
        const std::string module = p.name.substr(0, dot);
        if (std::find(linear_modules_.begin(), linear_modules_.end(), module) != linear_modules_.end()) break;
        if (seen.insert(module).second) refuse_match(module);
      }
    }
    for (const std::string& module : weightless_modules_) refuse_match(module);
  }
  // A pipeline stage may hold only layers left without adapters (and the
  // planner builds stages of one or two layers to cost them).
  if (!adapters_.empty() || !first_stage() || !last_stage()) return;
  std::string targets = "\"" + lora.target_modules_regex + "\" (a string: a regular expression the whole module "
                        "name must match, as in PEFT; module names go in a list, such as [q_proj, v_proj])";
  if (lora.target_modules_regex.empty()) {
    targets = "[";
    for (const std::string& target : lora.target_modules) targets += (targets.size() > 1 ? ", " : "") + target;
    targets += "]";
  }
  const bool excluded = !lora.exclude_modules.empty() || !lora.exclude_modules_regex.empty();
  const bool layers = !lora.layers_to_transform.empty();
  // Starts "lora.", as the model's other LoRA errors: a run names its config before it.
  fail("lora.target_modules ", targets, excluded ? " with lora.exclude_modules" : "",
       excluded && layers ? " and" : layers ? " with" : "", layers ? " lora.layers_to_transform" : "",
       " leaves no module of this ", config_.model_type, " model to adapt (its linear modules are ", module_names, ")");
}

bool module_matches_target(const std::string& module_name, const std::string& target) {
  if (module_name == target) return true;
  return module_name.size() > target.size() &&
         module_name.compare(module_name.size() - target.size(), target.size(), target) == 0 &&
         module_name[module_name.size() - target.size() - 1] == '.';
}

Parameter& LanguageModel::add_parameter(const std::string& name, const Shape& shape, DType dtype,
                                        Allocator* allocator) {
  Parameter parameter;
  parameter.name = name;
  parameter.value = Tensor::empty(shape, dtype, allocator ? *allocator : backend_.allocator(), MemCategory::weights);
  parameters_.push_back(std::move(parameter));
  return parameters_.back();
}

int64_t LanguageModel::streamed_layers() const {
  return options_.stream_base ? config_.num_hidden_layers - options_.resident_layers : 0;
}

// A decoder linear: dense or in the quantized base's format, wrapped in LoRA
// when it is a target. A streamed layer's quantized tensors go to pinned
// host memory. Under tensor parallelism a column-parallel layer holds its
// share of the output rows (and of the bias), a row-parallel one its share
// of the input columns; its bias is whole on every rank (so every rank
// holds the same parameters, as init_random numbers them) but added on rank
// 0 only: the sum adds it once.
std::unique_ptr<Linear> LanguageModel::make_linear(const std::string& module, int64_t out_features,
                                                   int64_t in_features, bool bias, ParallelLinear split,
                                                   int64_t shares) {
  const int64_t ranks = tensor_ranks(), rank = ranks > 1 ? options_.tensor_parallel->rank() : 0;
  if (ranks == 1) split = ParallelLinear::replicated;
  const int dim = split == ParallelLinear::column ? 0 : split == ParallelLinear::row ? 1 : -1;
  const int64_t full = dim == 0 ? out_features : in_features;
  if (shares == 0 || dim != 0) shares = ranks;
  FT_CHECK(dim < 0 || (full % shares == 0 && ranks % shares == 0), module, ": ", dim == 0 ? "out" : "in",
           "_features ", full, " do not split over parallel.tensor: ", ranks, " ranks");
  const int64_t replicas = ranks / shares;  // neighbouring ranks holding the same part
  const TensorSlice slice =
      dim < 0 ? TensorSlice{} : TensorSlice{dim, rank / replicas * (full / shares), full, replicas};
  const Shape whole{out_features, in_features};
  if (dim == 0) out_features /= shares;
  if (dim == 1) in_features /= ranks;
  std::unique_ptr<Linear> base;
  const int64_t layer = decoder_layer_of(module);
  Allocator& codes_allocator = layer >= 0 && layer < streamed_layers() ? backend_.pinned_host_allocator()
                                                                       : backend_.allocator();
  Parameter* weight = nullptr;
  const bool quantized = options_.quantized_base != QuantizedBase::none &&
                         std::none_of(unquantized_modules_.begin(), unquantized_modules_.end(),
                                      [&](const std::string& suffix) { return module.ends_with(suffix); });
  if (quantized) {
    const QuantizedFormat& format = quantized_format(options_.quantized_base);
    weight = &parameters_.emplace_back();
    weight->name = module + ".weight";
    weight->slice = slice;
    ModelOptions options = options_;
    if (dim >= 0) {  // a shard's NF4 blocks keep an f32 absmax (QuantizedFormat::cut)
      options.nf4_double_quant = false;
      format.check_slice(weight->name, whole, slice, full / shares);
    }
    format.allocate(*weight, {out_features, in_features}, codes_allocator, options);
  } else {
    weight = &add_parameter(module + ".weight", {out_features, in_features}, options_.weight_dtype);
    weight->slice = slice;
  }
  Parameter* b = bias ? &add_parameter(module + ".bias", {out_features}, options_.weight_dtype) : nullptr;
  if (b && dim == 0) b->slice = slice;
  Parameter* added = dim == 1 && rank != 0 ? nullptr : b;
  if (quantized)
    base = quantized_format(options_.quantized_base).make_linear(*weight, added, options_);
  else
    base = std::make_unique<DenseLinear>(*weight, added);
  linear_modules_.push_back(module);
  if (!options_.lora) return base;
  const LoraOptions& lora = *options_.lora;
  if (!lora_targets_module(lora, module)) return base;
  auto add_adapter = [&](const std::string& name, const Shape& shape) -> Parameter& {
    Parameter adapter;
    adapter.name = name;
    adapter.value = backend_.empty(shape, options_.adapter_dtype, MemCategory::adapters);
    adapters_.push_back(std::move(adapter));
    return adapters_.back();
  };
  // r and scaling are the module's own (rank_pattern, alpha_pattern); a
  // tensor-parallel slice splits out or in, never r.
  const ModuleLora own = module_lora(lora, module);
  const LoraShapes shapes = lora_shapes(out_features, in_features, own.r);
  Parameter& A = add_adapter(module + ".lora_A.weight", shapes.a);
  Parameter& B = add_adapter(module + ".lora_B.weight", shapes.b);
  // Column-parallel: B splits as the output rows, A is whole; row-parallel:
  // A splits as the input columns, B is whole (model/tensor_parallel.h).
  if (dim == 0) B.slice = slice;
  if (dim == 1) A.slice = slice;
  A.partial_grad = dim == 0;
  B.partial_grad = dim == 1;
  Parameter* magnitude = lora.use_dora ? &add_adapter(module + kDoraMagnitudeSuffix, {out_features}) : nullptr;
  auto adapted = std::make_unique<LoraLinear>(std::move(base), A, B,
                                              own.scaling,
                                              float(lora.lora_dropout), magnitude, added);
  if (dim == 1) adapted->set_input_columns(slice.offset, slice.full);
  lora_layers_.push_back(adapted.get());
  return adapted;
}

int64_t LanguageModel::tensor_ranks() const {
  return options_.tensor_parallel ? options_.tensor_parallel->ranks() : 1;
}

void LanguageModel::tensor_sum(Tensor& t) {
  if (tensor_ranks() > 1) options_.tensor_parallel->sum(backend_, t);
}

Parameter& LanguageModel::parameter(const std::string& name) {
  for (std::deque<Parameter>* list : {&parameters_, &adapters_})
    for (Parameter& p : *list)
      if (p.name == name) return p;
  fail("no parameter named \"", name, "\"");
}

// A tensor-parallel shard from the whole weight as one process holds it: a
// host copy filled on the CPU (loaded, or quantised from the whole tensor),
// then cut to p's slice. One whole weight at a time is in host memory.
void LanguageModel::fill_shard(Parameter& p, const std::function<void(Backend&, Parameter&)>& fill_whole) {
  HostAllocator host;
  CpuBackend cpu(host);
  Parameter whole;
  whole.name = p.name;
  if (p.is_quantized()) {
    const QuantizedFormat& format = quantized_format(p.quantized.format);
    format.allocate(whole, whole_shape(p), host, options_);
    fill_whole(cpu, whole);
    format.cut(backend_, whole, p);
    return;
  }
  whole.value = Tensor::empty(whole_shape(p), p.value.dtype, host, MemCategory::workspace);
  fill_whole(cpu, whole);
  backend_.copy(p.value, host_slice(whole.value, p.slice.dim, p.slice.offset, p.value.dim(p.slice.dim), host));
}

void LanguageModel::fill_parameter(Parameter& p, const std::function<void(Parameter&)>& fill) {
  if (p.value.device == backend_.device()) return fill(p);
  Parameter staged = p;
  for (Tensor* t : weight_tensors(staged)) *t = backend_.empty(t->shape, t->dtype, MemCategory::workspace);
  fill(staged);
  const std::vector<Tensor*> host = weight_tensors(p), device = weight_tensors(staged);
  for (size_t i = 0; i < host.size(); ++i) backend_.copy(*host[i], *device[i]);
  p.quantized.offset = staged.quantized.offset;
}

// transformers 5 unties a tied module (a tied config's lm_head, T5's
// embed_tokens) when the checkpoint holds its tensor with other values than
// the embedding, and uses both; a tied model here cannot, and reading the
// embedding in its place would be silently another model.
void LanguageModel::check_tied_copies(const Checkpoint& checkpoint) const {
  if (!embedding_ || !checkpoint.contains(embedding_->name)) return;
  const SafetensorsEntry& embedding = checkpoint.entry(embedding_->name);
  for (const std::string& module : weightless_modules_) {
    const std::string name = module + ".weight";
    if (!checkpoint.contains(name)) continue;
    const SafetensorsEntry& copy = checkpoint.entry(name);
    const bool same = copy.dtype == embedding.dtype && copy.shape == embedding.shape &&
                      std::memcmp(copy.data, embedding.data, copy.size_bytes) == 0;
    const bool head = lm_head_ == embedding_ && name == untied_head_name_;
    FT_CHECK(same, copy.file, ": tensor \"", name, "\" differs from \"", embedding_->name, "\", but ",
             head ? "config.json ties them (tie_word_embeddings: true)" : "the model ties them",
             "; transformers then unties them and uses both, which this model cannot",
             head ? ": set \"tie_word_embeddings\": false in config.json" : "");
  }
}

Parameter& LanguageModel::untie_head() {
  FT_CHECK(lm_head_ && lm_head_ == embedding_ && !untied_head_name_.empty(), config_.model_type,
           ": untie_head needs a last stage whose lm_head is tied to the embedding");
  Parameter& head = add_parameter(untied_head_name_, embedding_->value.shape, embedding_->value.dtype);
  backend_.copy(head.value, embedding_->value);
  lm_head_ = &head;
  return head;
}

// Each tensor is hashed just before it loads: its pages are read from disk
// once, for both.
void LanguageModel::load(const Checkpoint& checkpoint) {
  check_stored_quantization(config_.stored_quantization, options_);
  check_tied_copies(checkpoint);
  XXH64_hash_t fingerprint = 0;
  output_head_loaded_ = output_head_.defined() && checkpoint.contains(output_head_.weight->name);
  for (Parameter& parameter : parameters_) {
    // A head the checkpoint lacks (a causal LM's checkpoint for a reward
    // model) is made by init_output_head.
    const bool head = &parameter == output_head_.weight || &parameter == output_head_.bias;
    if (head && !output_head_loaded_) continue;
    // A sequence classifier's checkpoint has no LM head: a reward model never reads it.
    if (&parameter == lm_head_ && options_.output_head == OutputHead::score && !checkpoint.contains(parameter.name)) {
      backend_.fill(parameter.value, 0.0f);
      continue;
    }
    const SafetensorsEntry& entry = checkpoint.entry(parameter.name);
    fingerprint = XXH3_64bits_withSeed(parameter.name.data(), parameter.name.size(), fingerprint);
    fingerprint = XXH3_64bits_withSeed(entry.data, entry.size_bytes, fingerprint);
    if (parameter.slice.whole())
      fill_parameter(parameter, [&](Parameter& p) { load_parameter(backend_, checkpoint, p); });
    else
      fill_shard(parameter, [&](Backend& cpu, Parameter& p) { load_parameter(cpu, checkpoint, p); });
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fingerprint));
  base_fingerprint_ = std::string("xxh3 ") + hex;
}

// Normal(0, std) values. Counter-based (pair j draws outputs 2j and 2j+1 of
// its stream), so the values do not depend on the thread count and a 20B
// base fills in seconds, not minutes.
static void fill_normal(float* out, int64_t n, uint64_t stream, double std) {
#pragma omp parallel for schedule(static)
  for (int64_t pair = 0; pair < (n + 1) / 2; ++pair) {
    // Box-Muller: two normals from two uniforms in (0, 1].
    const double u1 = (double(splitmix64(stream, uint64_t(2 * pair)) >> 11) + 1.0) / 9007199254740992.0;
    const double u2 = double(splitmix64(stream, uint64_t(2 * pair + 1)) >> 11) / 9007199254740992.0;
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double normals[2] = {radius * std::cos(2 * M_PI * u2), radius * std::sin(2 * M_PI * u2)};
    for (int64_t k = 0; k < 2 && 2 * pair + k < n; ++k) out[2 * pair + k] = float(std * normals[k]);
  }
}

void LanguageModel::init_random(uint64_t seed) {
  HostAllocator host;
  uint64_t index = 0;
  for (Parameter& p : parameters_) {
    Tensor values = Tensor::empty(whole_shape(p), DType::f32, host, MemCategory::workspace);
    const uint64_t stream = splitmix64(seed, index++);
    // As transformers: biases (linear and LayerNorm) 0, norm weights 1, the rest normal.
    const bool is_bias = p.name.size() > 5 && p.name.compare(p.name.size() - 5, 5, ".bias") == 0;
    const bool is_norm = p.value.ndim() == 1 && !is_bias;
    if (is_bias || is_norm) std::fill_n(values.ptr<float>(), values.numel(), is_norm ? 1.0f : 0.0f);
    else fill_normal(values.ptr<float>(), values.numel(), stream, config_.initializer_range);
    // A quantized base is quantised from the f32 values, as load() does a 16-bit checkpoint.
    if (p.slice.whole()) fill_parameter(p, [&](Parameter& q) { assign_weight(backend_, q, values); });
    else fill_shard(p, [&](Backend& cpu, Parameter& q) { assign_weight(cpu, q, values); });
  }
}

void LanguageModel::init_output_head(uint64_t seed) {
  if (!output_head_.defined() || output_head_loaded_) return;
  HostAllocator host;
  Parameter& weight = *output_head_.weight;
  Tensor values = Tensor::empty(weight.shape(), DType::f32, host, MemCategory::workspace);
  // A stream apart from the adapters' (splitmix64(seed, i) for small i).
  fill_normal(values.ptr<float>(), values.numel(), splitmix64(seed, 0x68656164ULL), config_.initializer_range);
  assign_weight(backend_, weight, values);
  if (output_head_.bias) backend_.fill(output_head_.bias->value, 0.0f);
}

// A pipeline stage numbers its adapters from its first layer's, as the whole
// model does (every decoder layer has as many), so each stage draws the same
// initial values and dropout masks as the whole model.
static size_t stage_offset(const LayerRange& layers, size_t count) {
  return size_t(layers.first_layer) * (count / size_t(layers.end_layer - layers.first_layer));
}

// Adapted linear k draws A from splitmix64(seed, 2k) (2k: its A's index
// among the adapters before DoRA added a magnitude to each).
void LanguageModel::init_adapters(uint64_t seed) {
  const size_t first = stage_offset(options_.layers, 2 * lora_layers_.size());
  for (size_t k = 0; k < lora_layers_.size(); ++k) {
    init_lora_parameters(backend_, lora_layers_[k]->lora_A(), lora_layers_[k]->lora_B(),
                         options_.lora->init_lora_weights, splitmix64(seed, first + 2 * k));
    lora_layers_[k]->init_magnitude(backend_);
  }
}

void LanguageModel::adapters_changed() {
  for (LoraLinear* layer : lora_layers_) layer->adapters_changed();
}

float neftune_noise_magnitude(double alpha, int64_t length, int64_t hidden_size) {
  // The hook's torch.sqrt(torch.tensor(L * d)) is an f32 square root of the
  // product converted to f32, and alpha / it is torch's Tensor.__rtruediv__:
  // the f32 reciprocal times alpha, which can differ from the quotient by an ulp.
  const float root = std::sqrt(float(checked_mul(length, hidden_size)));
  return float(alpha) * (1.0f / root);
}

// "noise" in ASCII: far from the LoRA layers' indices (splitmix64(seed, i)
// for small i), so the noise and the masks are independent draws.
uint64_t embedding_noise_seed(uint64_t dropout_seed) { return splitmix64(dropout_seed, 0x6e6f697365ULL); }

void LanguageModel::set_dropout_seed(uint64_t seed) {
  const size_t first = stage_offset(options_.layers, lora_layers_.size());
  for (size_t i = 0; i < lora_layers_.size(); ++i) lora_layers_[i]->set_dropout_seed(splitmix64(seed, first + i));
  embedding_noise_seed_ = embedding_noise_seed(seed);
}

void LanguageModel::add_embedding_noise(Tensor& embedded, int64_t length) {
  if (options_.neftune_noise_alpha <= 0) return;
  const float magnitude = neftune_noise_magnitude(options_.neftune_noise_alpha, length, config_.hidden_size);
  backend_.add_uniform_noise(embedded, magnitude, embedding_noise_seed_);
}

void LanguageModel::set_adapters_enabled(bool enabled) {
  for (LoraLinear* layer : lora_layers_) layer->set_enabled(enabled);
}

void LanguageModel::acquire_layer(size_t index, int direction) {
  if (layer_stream_ && index < layer_stream_->layer_count()) layer_stream_->acquire(index, direction);
}

void LanguageModel::release_layer(size_t index) {
  if (layer_stream_ && index < layer_stream_->layer_count()) layer_stream_->release(index);
}

void LanguageModel::set_training(bool training) {
  for (LoraLinear* layer : lora_layers_) layer->set_training(training);
}

ActivationOffload& CausalLM::activation_offload() {
  if (!activation_offload_) activation_offload_ = std::make_unique<ActivationOffload>(backend_);
  return *activation_offload_;
}

// ---- attention -----------------------------------------------------------

void CausalLM::attention_forward(AttentionActivations& saved, const TokenLayout& layout) {
  Backend& be = backend_;
  const int64_t B = saved.q.dim(0), T = saved.q.dim(1), Hq = saved.q.dim(2), D = config_.head_dim;
  const std::vector<float> inv_freq = rope_inv_freq(config_, cached_step_ ? cached_step_->seq_tokens : T);
  be.rope_forward(saved.q, layout.positions, inv_freq);
  be.rope_forward(saved.k, layout.positions, inv_freq);
  if (cached_step_) return attend_cached(saved);
  saved.attn = be.empty({B, T, Hq, D}, options_.activation_dtype, MemCategory::activations);
  saved.lse = be.empty({B, Hq, T}, DType::f32, MemCategory::activations);
  be.attention_forward(saved.attn, saved.lse, saved.q, saved.k, saved.v, 1.0f / std::sqrt(float(D)),
                       config_.sliding_window, layout.cu_seqlens.defined() ? &layout.cu_seqlens : nullptr);
}

void CausalLM::attention_backward(const AttentionActivations& saved, const Tensor& dattn, const TokenLayout& layout,
                                  const AttentionGradients& grads) {
  Backend& be = backend_;
  const int64_t T = saved.q.dim(1), D = config_.head_dim;
  be.attention_backward(grads.dq, grads.dk, grads.dv, dattn, saved.q, saved.k, saved.v, saved.attn, saved.lse,
                        1.0f / std::sqrt(float(D)), config_.sliding_window,
                        layout.cu_seqlens.defined() ? &layout.cu_seqlens : nullptr);
  const std::vector<float> inv_freq = rope_inv_freq(config_, T);
  be.rope_backward(grads.dq, layout.positions, inv_freq);
  be.rope_backward(grads.dk, layout.positions, inv_freq);
}

// ---- generation with a key/value cache -------------------------------------

KvCache CausalLM::make_kv_cache(int64_t batch, int64_t capacity_tokens) {
  FT_CHECK(batch > 0 && capacity_tokens > 0, "make_kv_cache: batch and capacity must be > 0, got ", batch, " and ",
           capacity_tokens);
  KvCache cache;
  const Shape shape{batch, capacity_tokens, local_kv_heads(), config_.head_dim};
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    cache.keys.push_back(backend_.empty(shape, options_.activation_dtype, MemCategory::activations));
    cache.values.push_back(backend_.empty(shape, options_.activation_dtype, MemCategory::activations));
  }
  cache.lengths_tokens.assign(size_t(batch), 0);
  return cache;
}

// The view's heads as a contiguous tensor: its rows where they are, else a copy.
static Tensor contiguous_heads(Backend& be, const HeadsView& x) {
  if (x.contiguous()) return x.rows;
  Tensor heads = be.empty(x.shape(), x.dtype(), MemCategory::activations);
  Tensor head_rows = heads.reshaped({heads.rows(), x.width});
  be.copy_columns(head_rows, 0, x.rows.reshaped({x.rows.rows(), x.pitch()}), x.first_column, x.width);
  return heads;
}

// Writes the step's rotated keys and values into the layer's cache rows at
// their positions, then attends over the cache. Decoding moves a token or a
// prompt per call, so views (GPT-NeoX's fused rows) are copied out first.
void CausalLM::attend_cached(AttentionActivations& saved) {
  Backend& be = backend_;
  KvCache& cache = *cached_step_->cache;
  const int64_t B = saved.q.dim(0), T = saved.q.dim(1), Hq = saved.q.dim(2), D = config_.head_dim;
  const int64_t S = cache.capacity_tokens(), kv_features = saved.k.dim(2) * D;
  const Tensor q = contiguous_heads(be, saved.q);
  Tensor k_rows = contiguous_heads(be, saved.k).reshaped({B * T, kv_features});
  Tensor v_rows = contiguous_heads(be, saved.v).reshaped({B * T, kv_features});
  Tensor k_slots = cache.keys[cached_step_->layer].reshaped({B * S, kv_features});
  Tensor v_slots = cache.values[cached_step_->layer].reshaped({B * S, kv_features});
  for (int64_t b = 0; b < B; ++b) {
    const int64_t slot = b * S + cached_step_->first_positions[size_t(b)];
    Tensor k_dst = k_slots.slice_rows(slot, T), v_dst = v_slots.slice_rows(slot, T);
    be.copy(k_dst, k_rows.slice_rows(b * T, T));
    be.copy(v_dst, v_rows.slice_rows(b * T, T));
  }
  saved.attn = be.empty({B, T, Hq, D}, options_.activation_dtype, MemCategory::activations);
  be.attention_cached(saved.attn, q, cache.keys[cached_step_->layer], cache.values[cached_step_->layer],
                      cached_step_->layout.positions, 1.0f / std::sqrt(float(D)), config_.sliding_window);
}

// The positions of a cached step's tokens: row b's token t at
// lengths_tokens[b] + t, or at t for an idle row (valid_tokens 0).
static std::vector<int64_t> first_positions(const KvCache& cache, const std::vector<int64_t>& valid_tokens) {
  std::vector<int64_t> first(valid_tokens.size(), 0);
  for (size_t b = 0; b < first.size(); ++b)
    if (valid_tokens[b] > 0) first[b] = cache.lengths_tokens[b];
  return first;
}

Tensor CausalLM::forward_cached(KvCache& cache, const Tensor& input_ids, const std::vector<int64_t>& valid_tokens) {
  Backend& be = backend_;
  const std::string& type = config_.model_type;
  FT_CHECK(input_ids.ndim() == 2 && input_ids.dim(0) == int64_t(cache.lengths_tokens.size()) &&
               valid_tokens.size() == cache.lengths_tokens.size(),
           type, ": forward_cached needs input_ids [", cache.lengths_tokens.size(), ", T] and as many valid_tokens, got ",
           shape_string(input_ids.shape), " and ", valid_tokens.size());
  const int64_t B = input_ids.dim(0), T = input_ids.dim(1), C = config_.hidden_size, V = config_.vocab_size;
  FT_CHECK(first_stage() && last_stage(), type, ": generation needs the whole model, not a pipeline stage");
  CachedStep step{&cache, 0, 0, TokenLayout{}, first_positions(cache, valid_tokens)};
  HostAllocator host;
  Tensor host_positions = Tensor::empty({B, T}, DType::i32, host, MemCategory::activations);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t valid = valid_tokens[size_t(b)], first = step.first_positions[size_t(b)];
    FT_CHECK(valid >= 0 && valid <= T && first + T <= cache.capacity_tokens(), type, ": forward_cached row ", b,
             " (", valid, " of ", T, " tokens valid, from position ", first, ") does not fit the cache's ",
             cache.capacity_tokens(), " positions");
    if (valid > 0) step.seq_tokens = std::max(step.seq_tokens, first + valid);
    for (int64_t t = 0; t < T; ++t) host_positions.ptr<int32_t>()[b * T + t] = int32_t(first + t);
  }
  step.layout.positions = upload_tokens(host_positions);
  const Tensor ids = upload_tokens(input_ids);

  set_training(false);
  Tensor x = be.empty({B, T, C}, options_.activation_dtype, MemCategory::activations);
  Tensor next = be.empty({B, T, C}, options_.activation_dtype, MemCategory::activations);
  Tensor x2d = x.reshaped({B * T, C});
  be.embedding_forward(x2d, ids, embedding_->value);
  NormOutput norm = norm_forward(input_norm(0), x2d);
  cached_step_ = &step;
  try {
    for (size_t i = 0; i < size_t(config_.num_hidden_layers); ++i) {
      step.layer = i;
      acquire_layer(i, 1);
      forward_layer(i, x, norm, &next, step.layout);  // its saved activations are freed at once
      release_layer(i);
      std::swap(x, next);
    }
  } catch (...) {
    cached_step_ = nullptr;
    throw;
  }
  cached_step_ = nullptr;

  // Each row's last valid token under the final norm (an idle row's first), then the LM head.
  Tensor last_hidden = be.empty({B, C}, options_.activation_dtype, MemCategory::activations);
  for (int64_t b = 0; b < B; ++b) {
    Tensor dst = last_hidden.slice_rows(b, 1);
    be.copy(dst, norm.out.slice_rows(b * T + std::max<int64_t>(valid_tokens[size_t(b)], 1) - 1, 1));
  }
  Tensor logits = be.empty({B, V}, DType::f32, MemCategory::activations);
  be.matmul(logits, last_hidden, lm_head_->value, false, true);
  for (int64_t b = 0; b < B; ++b) cache.lengths_tokens[size_t(b)] += valid_tokens[size_t(b)];
  return logits;
}

// ---- norms ---------------------------------------------------------------

NormParameters LanguageModel::add_norm(const std::string& name, bool bias, float eps) {
  const int64_t C = config_.hidden_size;
  NormParameters norm;
  norm.weight = &add_parameter(name + ".weight", {C}, options_.weight_dtype);
  if (bias) norm.bias = &add_parameter(name + ".bias", {C}, options_.weight_dtype);
  norm.eps = eps;
  return norm;
}

// out, then mean (LayerNorm only), then rstd.
static NormOutput empty_norm_output(Backend& be, const NormParameters& norm, const Tensor& x, DType act) {
  NormOutput output;
  output.out = be.empty(x.shape, act, MemCategory::activations);
  if (norm.bias) output.mean = be.empty({x.rows()}, DType::f32, MemCategory::activations);
  output.rstd = be.empty({x.rows()}, DType::f32, MemCategory::activations);
  return output;
}

NormOutput LanguageModel::norm_forward(const NormParameters& norm, const Tensor& x) {
  NormOutput output = empty_norm_output(backend_, norm, x, options_.activation_dtype);
  if (norm.bias)
    backend_.layernorm_forward(output.out, output.mean, output.rstd, x, norm.weight->value, norm.bias->value,
                               norm.eps);
  else
    backend_.rmsnorm_forward(output.out, output.rstd, x, norm.weight->value, norm.eps);
  return output;
}

NormOutput LanguageModel::add_norm_forward(const NormParameters& norm, Tensor& sum, const Tensor& a,
                                           const Tensor& b) {
  NormOutput output = empty_norm_output(backend_, norm, a, options_.activation_dtype);
  if (norm.bias)
    backend_.add_layernorm_forward(sum, output.out, output.mean, output.rstd, a, b, norm.weight->value,
                                   norm.bias->value, norm.eps);
  else
    backend_.add_rmsnorm_forward(sum, output.out, output.rstd, a, b, norm.weight->value, norm.eps);
  return output;
}

// A stage's last layer before the model's last: the next stage norms its
// input itself, so this one only adds.
void CausalLM::add_next_norm(size_t index, Tensor& out, NormOutput& norm, const Tensor& a, const Tensor& b) {
  const bool last = index + 1 == size_t(config_.num_hidden_layers);
  if (!last && int64_t(index) + 1 == options_.layers.end_layer) {
    backend_.add(out, a, b);
    norm = NormOutput{};
    return;
  }
  norm = add_norm_forward(last ? final_norm_ : input_norm(index + 1), out, a, b);
}

// A norm parameter's gradient, or null when it is frozen.
static Tensor* grad_of(Parameter* p) { return p->trainable() ? &p->grad : nullptr; }

void LanguageModel::norm_backward(Tensor& dx, const NormParameters& norm, const Tensor& dout, const Tensor& x,
                                  const NormOutput& saved) {
  if (norm.bias)
    backend_.layernorm_backward(dx, grad_of(norm.weight), grad_of(norm.bias), dout, x, norm.weight->value, saved.mean,
                                saved.rstd);
  else
    backend_.rmsnorm_backward(dx, grad_of(norm.weight), dout, x, norm.weight->value, saved.rstd);
}

void LanguageModel::norm_backward_add(Tensor& dresidual, const NormParameters& norm, const Tensor& dout,
                                      const Tensor& x, const NormOutput& saved) {
  if (norm.bias)
    backend_.layernorm_backward_add(dresidual, grad_of(norm.weight), grad_of(norm.bias), dout, dresidual, x,
                                    norm.weight->value, saved.mean, saved.rstd);
  else
    backend_.rmsnorm_backward_add(dresidual, grad_of(norm.weight), dout, dresidual, x, norm.weight->value,
                                  saved.rstd);
}

// ---- the step --------------------------------------------------------------

float CausalLM::forward(const Tensor& input_ids, const Tensor& targets, const Tensor* position_ids) {
  set_training(false);
  return run_step(input_ids, targets, position_ids, nullptr);
}

float CausalLM::forward_backward(const Tensor& input_ids, const Tensor& targets, float grad_scale,
                                 const Tensor* position_ids) {
  set_training(true);
  return run_step(input_ids, targets, position_ids, &grad_scale);
}

float CausalLM::run_step(const Tensor& input_ids, const Tensor& targets, const Tensor* position_ids,
                         const float* grad_scale) {
  FT_CHECK(first_stage() && last_stage(), config_.model_type,
           ": a pipeline stage runs stage_forward and stage_backward");
  DecoderStep step;
  forward_decoder(step, input_ids, targets, position_ids, Tensor{}, grad_scale != nullptr);
  const float loss = lm_head_loss(step.final_norm.out, step.tokens, grad_scale ? &step.dnorm : nullptr,
                                  grad_scale ? *grad_scale : 0.0f);
  step.final_norm.out = Tensor{};  // its backward reads only the statistics
  if (grad_scale && step.tokens.counted > 0) backward_decoder(step, Tensor{});
  return loss;
}

std::unique_ptr<CausalLM::DecoderStep> CausalLM::stage_forward(const Tensor& input_ids, const Tensor& targets,
                                                               const Tensor* position_ids, Tensor input,
                                                               Tensor* output, float grad_scale, float* loss) {
  set_training(true);
  auto step = std::make_unique<DecoderStep>();
  forward_decoder(*step, input_ids, targets, position_ids, std::move(input), true);
  *loss = 0.0f;
  if (!last_stage()) {
    *output = std::move(step->residuals.back());
    step->residuals.back() = Tensor{};
    return step;
  }
  *loss = lm_head_loss(step->final_norm.out, step->tokens, &step->dnorm, grad_scale);
  step->final_norm.out = Tensor{};
  return step;
}

float CausalLM::stage_eval_forward(const Tensor& input_ids, const Tensor& targets, const Tensor* position_ids,
                                   Tensor input, Tensor* output) {
  set_training(false);
  DecoderStep step;
  forward_decoder(step, input_ids, targets, position_ids, std::move(input), false);
  if (!last_stage()) {
    *output = std::move(step.residuals.back());
    return 0.0f;
  }
  return lm_head_loss(step.final_norm.out, step.tokens, nullptr, 0.0f);
}

// No counted token: no stage runs a backward (each counts the same targets),
// so nothing passes between them either.
Tensor CausalLM::stage_backward(DecoderStep& step, Tensor doutput) {
  if (step.tokens.counted == 0) return Tensor{};
  FT_CHECK(last_stage() != doutput.defined(), config_.model_type,
           ": stage_backward takes d(output) on every stage but the last");
  Tensor dinput = backward_decoder(step, std::move(doutput));
  return first_stage() ? Tensor{} : dinput;
}

SequenceLogps CausalLM::sequence_logps(const Tensor& input_ids, const Tensor& targets, const Tensor* position_ids) {
  const std::vector<float> tokens = token_logps(input_ids, targets, position_ids);
  return sum_by_sequence(tokens, targets, position_ids);
}

// The sequences' gradient spread over their tokens: every token of sequence
// s gets d(loss)/d(logps[s]) (a sum's derivative in each of its terms).
SequenceLogps CausalLM::sequence_logps_backward(const Tensor& input_ids, const Tensor& targets,
                                                const LogpsGradient& gradient, const Tensor* position_ids) {
  SequenceLogps sums;
  const std::vector<int64_t> starts = sequence_starts(targets, position_ids);
  const TokenLogpsGradient by_token = [&](const std::vector<float>& tokens) {
    sums = sum_by_sequence(tokens, targets, position_ids);
    const std::vector<double> dlogps = gradient(sums);
    const size_t S = sums.logps.size();
    FT_CHECK(dlogps.size() == S, "sequence_logps_backward: the gradient has ", dlogps.size(),
             " sequences, the batch ", S);
    std::vector<float> dtokens(tokens.size(), 0.0f);
    for (size_t s = 0; s < S; ++s) {
      const int64_t end = s + 1 < S ? starts[s + 1] : int64_t(tokens.size());
      for (int64_t n = starts[s]; n < end; ++n) dtokens[size_t(n)] = float(dlogps[s]);
    }
    return dtokens;
  };
  token_logps_backward(input_ids, targets, by_token, position_ids);
  return sums;
}

std::vector<int64_t> CausalLM::sequence_starts(const Tensor& targets, const Tensor* position_ids) {
  const int64_t B = targets.dim(0), T = targets.dim(1);
  std::vector<int64_t> starts;
  for (int64_t n = 0; n < B * T; ++n)
    if (n % T == 0 || (position_ids && position_ids->ptr<const int32_t>()[n] == 0)) starts.push_back(n);
  return starts;
}

SequenceLogps CausalLM::sum_by_sequence(const std::vector<float>& token_logps, const Tensor& targets,
                                        const Tensor* position_ids) {
  const std::vector<int64_t> starts = sequence_starts(targets, position_ids);
  const size_t S = starts.size();
  const int64_t N = int64_t(token_logps.size()), T = targets.dim(1);
  SequenceLogps result{std::vector<double>(S, 0.0), std::vector<int64_t>(S, 0), std::vector<int64_t>(S, 0)};
  for (size_t s = 0; s < S; ++s) {
    result.rows[s] = starts[s] / T;
    for (int64_t n = starts[s]; n < (s + 1 < S ? starts[s + 1] : N); ++n) {
      result.logps[s] += token_logps[size_t(n)];
      result.counted_tokens[s] += targets.ptr<const int32_t>()[n] != -100;
    }
  }
  return result;
}

std::vector<float> CausalLM::token_logps(const Tensor& input_ids, const Tensor& targets, const Tensor* position_ids,
                                         const HiddenHead* head) {
  return run_heads_step(input_ids, targets, position_ids, false, true, nullptr, head);
}

std::vector<float> CausalLM::token_logps_backward(const Tensor& input_ids, const Tensor& targets,
                                                  const TokenLogpsGradient& gradient, const Tensor* position_ids,
                                                  const HiddenHead* head) {
  return run_heads_step(input_ids, targets, position_ids, true, true, &gradient, head);
}

void CausalLM::head_step(const Tensor& input_ids, const Tensor* position_ids, bool training, const HiddenHead& head) {
  HostAllocator host;
  Tensor no_targets = Tensor::empty(input_ids.shape, DType::i32, host, MemCategory::activations);
  std::fill_n(no_targets.ptr<int32_t>(), no_targets.numel(), -100);
  run_heads_step(input_ids, no_targets, position_ids, training, false, nullptr, &head);
}

// The decoder's forward, then the LM head's token log-probabilities (with
// lm_head) and the other head, each from the final norm's output; in
// training the LM head's d(loss)/d(hidden) first (zeros without it), the
// head's added to it, then the decoder's backward.
std::vector<float> CausalLM::run_heads_step(const Tensor& input_ids, const Tensor& targets,
                                            const Tensor* position_ids, bool training, bool lm_head,
                                            const TokenLogpsGradient* gradient, const HiddenHead* head) {
  FT_CHECK(first_stage() && last_stage(), config_.model_type, ": log-probabilities and heads need the whole model");
  set_training(training);
  DecoderStep step;
  forward_decoder(step, input_ids, targets, position_ids, Tensor{}, training);
  std::vector<float> logps;
  if (lm_head) logps = lm_head_token_logps(step.final_norm.out, step.tokens, training ? &step.dnorm : nullptr, gradient);
  const bool head_trains = training && head;
  if (head_trains && !step.dnorm.defined()) {
    step.dnorm = backend_.empty(step.final_norm.out.shape, step.final_norm.out.dtype, MemCategory::activations);
    backend_.fill(step.dnorm, 0.0f);
  }
  if (head) (*head)(step.final_norm.out, head_trains ? &step.dnorm : nullptr);
  step.final_norm.out = Tensor{};
  if (step.dnorm.defined()) backward_decoder(step, Tensor{});
  return logps;
}

// Host only: the targets are also counted on the host (upload_ids_and_targets).
Tensor LanguageModel::upload_tokens(const Tensor& host_tokens) {
  FT_CHECK(host_tokens.dtype == DType::i32 && host_tokens.ndim() == 2 && host_tokens.device == Device::cpu,
           config_.model_type, ": token tensors must be host i32 [B, T], got ", dtype_name(host_tokens.dtype), " ",
           shape_string(host_tokens.shape), host_tokens.device == Device::cpu ? "" : " on the device");
  Tensor tokens = backend_.empty({host_tokens.numel()}, DType::i32, MemCategory::activations);
  backend_.copy(tokens, host_tokens.reshaped({host_tokens.numel()}));
  return tokens;
}

LanguageModel::StepTokens LanguageModel::upload_ids_and_targets(const Tensor& input_ids, const Tensor& targets) {
  const std::string& type = config_.model_type;
  FT_CHECK(input_ids.shape == targets.shape, type, ": input_ids ", shape_string(input_ids.shape), " and targets ",
           shape_string(targets.shape), " differ in shape");
  StepTokens tokens;
  tokens.ids = upload_tokens(input_ids);
  tokens.targets = upload_tokens(targets);
  tokens.batch = input_ids.dim(0);
  tokens.seq = input_ids.dim(1);
  for (int64_t n = 0; n < tokens.batch * tokens.seq; ++n) tokens.counted += targets.ptr<int32_t>()[n] != -100;
  return tokens;
}

CausalLM::StepTokens CausalLM::upload_step_tokens(const Tensor& input_ids, const Tensor& targets,
                                                  const Tensor* position_ids) {
  StepTokens tokens = upload_ids_and_targets(input_ids, targets);
  const std::string& type = config_.model_type;
  FT_CHECK(tokens.seq <= config_.position_limit(), type,
           ": sequence of ", tokens.seq, " tokens exceeds max_position_embeddings ",
           config_.max_position_embeddings);
  tokens.layout = upload_layout(position_ids, tokens.batch, tokens.seq);
  return tokens;
}

// A row of packed examples reads 0 1 2 0 1 0 1 2 3 ...: a sequence starts at
// each 0 (and at each row start), as transformers derives FlashAttention's
// cu_seqlens from position_ids. Rows of one sequence each need no offsets.
CausalLM::TokenLayout CausalLM::upload_layout(const Tensor* position_ids, int64_t B, int64_t T) {
  const std::string& type = config_.model_type;
  HostAllocator host;
  Tensor host_positions = Tensor::empty({B, T}, DType::i32, host, MemCategory::activations);
  int32_t* position = host_positions.ptr<int32_t>();
  if (!position_ids) {
    for (int64_t n = 0; n < B * T; ++n) position[n] = int32_t(n % T);
    return TokenLayout{upload_tokens(host_positions), Tensor{}};
  }
  FT_CHECK(position_ids->dtype == DType::i32 && position_ids->shape == Shape({B, T}) &&
               position_ids->device == Device::cpu,
           type, ": position_ids must be host i32 ", shape_string({B, T}), " as input_ids, got ",
           dtype_name(position_ids->dtype), " ", shape_string(position_ids->shape));
  std::vector<int32_t> cu_seqlens = {0};
  for (int64_t n = 0; n < B * T; ++n) {
    const int32_t p = position_ids->ptr<const int32_t>()[n];
    const bool row_start = n % T == 0;
    const int32_t next = row_start ? 0 : position[n - 1] + 1;
    FT_CHECK(p == 0 || p == next, type, ": position_ids[", n / T, ", ", n % T, "] is ", p,
             ", expected 0 (an example starts)", row_start ? std::string() : " or " + std::to_string(next));
    position[n] = p;
    if (p == 0 && n > 0) cu_seqlens.push_back(int32_t(n));
  }
  TokenLayout layout{upload_tokens(host_positions), Tensor{}};
  cu_seqlens.push_back(int32_t(B * T));
  if (int64_t(cu_seqlens.size()) == B + 1) return layout;  // one sequence a row
  Tensor host_cu = Tensor::empty({int64_t(cu_seqlens.size())}, DType::i32, host, MemCategory::activations);
  std::copy(cu_seqlens.begin(), cu_seqlens.end(), host_cu.ptr<int32_t>());
  layout.cu_seqlens = backend_.empty(host_cu.shape, DType::i32, MemCategory::activations);
  backend_.copy(layout.cu_seqlens, host_cu);
  return layout;
}

// Uploads the tokens, embeds them (the first stage; a later stage starts
// from input) and runs this model's layers, the model's last layer leaving
// the final norm's output in step.final_norm. A training step keeps each
// layer's activations unless options_.activation_checkpointing says
// per_layer; an eval step (training false) keeps none.
void CausalLM::forward_decoder(DecoderStep& step, const Tensor& input_ids, const Tensor& targets,
                               const Tensor* position_ids, Tensor input, bool training) {
  Backend& be = backend_;
  step.tokens = upload_step_tokens(input_ids, targets, position_ids);
  const int64_t B = step.tokens.batch, T = step.tokens.seq, C = config_.hidden_size;
  const DType act = options_.activation_dtype;
  const size_t first = size_t(options_.layers.first_layer), end = size_t(options_.layers.end_layer);
  FT_CHECK(first_stage() != input.defined(), config_.model_type,
           ": a stage after the first takes its input from the previous stage, the first embeds the tokens");
  if (first_stage()) {
    step.residuals.push_back(be.empty({B, T, C}, act, MemCategory::activations));
    Tensor embedded = step.residuals[0].reshaped({B * T, C});
    be.embedding_forward(embedded, step.tokens.ids, embedding_->value);
    // transformers embeds each row's last token too (its labels are shifted
    // inside the model), so its L is T + 1. The noisy embedding is the first
    // layer's kept input, which a checkpointed layer's recomputation reads.
    if (training) add_embedding_noise(embedded, T + 1);
  } else {
    FT_CHECK(input.shape == Shape({B, T, C}) && input.dtype == act, config_.model_type, ": a stage's input must be ",
             dtype_name(act), " ", shape_string({B, T, C}), ", got ", dtype_name(input.dtype), " ",
             shape_string(input.shape));
    step.residuals.push_back(std::move(input));
  }
  const bool keep = training && options_.activation_checkpointing == ActivationCheckpointing::none;
  ActivationOffload* offload = training && options_.offload_activations ? &activation_offload() : nullptr;
  step.layers.resize(end - first);
  NormOutput norm;  // each layer's input under its input norm, made by the layer before
  for (size_t k = 0; k < step.layers.size(); ++k) {
    step.residuals.push_back(be.empty({B, T, C}, act, MemCategory::activations));
    if (k == 0) norm = norm_forward(input_norm(first), step.residuals[0].reshaped({B * T, C}));
    acquire_layer(first + k, 1);
    std::unique_ptr<SavedActivations> saved =
        forward_layer(first + k, step.residuals[k], norm, &step.residuals[k + 1], step.tokens.layout);
    release_layer(first + k);
    if (keep) step.layers[k] = std::move(saved);  // else freed here, before the next layer runs
    // The layer's checkpoint (its input) leaves for host memory; the last
    // layer's stays, as the backward starts with it.
    if (offload && k + 1 < step.layers.size()) offload->store(k, step.residuals[k]);
  }
  if (offload) offload->finish_forward();
  step.final_norm = std::move(norm);
}

// From dresidual = d(loss)/d(this stage's output) on a stage before the
// last, or on the last from step.dnorm = d(loss)/d(final norm output) through
// the final norm's backward: every layer's backward, last to first
// (rerunning the forward of a checkpointed layer first), freeing each
// layer's tensors as it goes; then the embedding's gradient when it trains
// (first stage). Returns d(loss)/d(the stage's input).
Tensor CausalLM::backward_decoder(DecoderStep& step, Tensor dresidual) {
  Backend& be = backend_;
  const int64_t N = step.tokens.batch * step.tokens.seq, C = config_.hidden_size;
  const size_t first = size_t(options_.layers.first_layer);
  if (last_stage()) {
    dresidual = be.empty({step.tokens.batch, step.tokens.seq, C}, options_.activation_dtype, MemCategory::activations);
    Tensor dresidual2d = dresidual.reshaped({N, C});
    norm_backward(dresidual2d, final_norm_, step.dnorm, step.residuals.back().reshaped({N, C}), step.final_norm);
    step.dnorm = Tensor{};
  }
  for (size_t k = step.layers.size(); k-- > 0;) {
    const size_t i = first + k;
    // An offloaded checkpoint comes back (prefetched while the layer after
    // it ran), and the next one is sent for while this layer runs.
    if (!step.residuals[k].defined()) step.residuals[k] = activation_offload_->fetch(k);
    if (k > 0 && !step.residuals[k - 1].defined()) activation_offload_->prefetch(k - 1);
    acquire_layer(i, -1);  // once for the recomputation and the backward
    // A checkpointed layer runs its forward again from its kept input,
    // without the output (residuals[k + 1] still holds it) or the next norm.
    if (!step.layers[k]) {
      NormOutput norm = norm_forward(input_norm(i), step.residuals[k].reshaped({N, C}));
      step.layers[k] = forward_layer(i, step.residuals[k], norm, nullptr, step.tokens.layout);
    }
    step.residuals[k + 1] = Tensor{};
    // The first stage's input gradient feeds only a trainable embedding.
    const bool input_grad = k > 0 || !first_stage() || embedding_->trainable();
    backward_layer(i, *step.layers[k], dresidual, step.residuals[k], step.tokens.layout, input_grad);
    release_layer(i);
    step.layers[k] = nullptr;
  }
  if (first_stage() && embedding_->trainable())
    be.embedding_backward(embedding_->grad, step.tokens.ids, dresidual.reshaped({N, C}));
  return dresidual;
}

// The end of every forward: logits = logits_scale_ * hidden [N, C] lm_head^T
// (the scale folded into each product's alpha) and the mean
// cross-entropy over counted tokens (returned). Eval (dhidden null): the
// logits [N, V] are kept for last_logits(), f32 whatever hidden's dtype (the
// activation dtype). A training step's logits are in hidden's dtype, as
// under autocast (bf16 activations: the bf16 product with f32 sums rounded
// once to bf16), and cross_entropy overwrites them with dlogits in that
// dtype, the one both gradient products take; the loss is f32 either way
// (f32 log-sum-exp of the logits read as f32). Training: logits are made
// options_.loss_chunk_tokens rows at a time, each chunk overwritten by its
// d(grad_scale * loss)/d(logits) and consumed at once -- dhidden [N, C]
// (hidden's dtype, allocated here unless no token counts) = dlogits lm_head,
// and lm_head.grad += dlogits^T hidden when it trains -- so no [N, V] tensor
// exists in a training step with chunking.
float LanguageModel::lm_head_loss(const Tensor& hidden, const StepTokens& tokens, Tensor* dhidden,
                                  float grad_scale) {
  Backend& be = backend_;
  Parameter& lm_head = *lm_head_;
  const int64_t N = hidden.rows(), V = config_.vocab_size;
  const bool training = dhidden != nullptr, backward = training && tokens.counted > 0;
  const int64_t chunk = training && options_.loss_chunk_tokens > 0 ? std::min(options_.loss_chunk_tokens, N) : N;
  Tensor losses = be.empty({N}, DType::f32, MemCategory::activations);
  if (backward) *dhidden = be.empty(hidden.shape, hidden.dtype, MemCategory::activations);
  const float dloss = backward ? grad_scale / float(tokens.counted) : 0.0f;
  for (int64_t first = 0; first < N; first += chunk) {
    const int64_t rows = std::min(chunk, N - first);
    const Tensor hidden_rows = hidden.slice_rows(first, rows);
    Tensor logits = be.empty({rows, V}, backward ? hidden.dtype : DType::f32, MemCategory::activations);
    be.matmul(logits, hidden_rows, lm_head.value, false, true, logits_scale_);
    Tensor chunk_losses = losses.slice_rows(first, rows);
    be.cross_entropy(chunk_losses, backward ? &logits : nullptr, logits, tokens.targets.slice_rows(first, rows),
                     dloss);
    if (!training) last_logits_ = logits;  // eval: one chunk, all N rows
    if (!backward) continue;
    Tensor dhidden_rows = dhidden->slice_rows(first, rows);
    lm_head_backward_chunk(logits, hidden_rows, dhidden_rows);
  }

  HostAllocator host;
  Tensor host_losses = Tensor::empty({N}, DType::f32, host, MemCategory::activations);
  be.copy(host_losses, losses);
  double loss_sum = 0.0;
  for (int64_t n = 0; n < N; ++n) loss_sum += host_losses.ptr<float>()[n];
  return tokens.counted ? float(loss_sum / double(tokens.counted)) : 0.0f;
}

// logits hold dlogits (from the f32 loss): the chunk's share of both
// gradients, then it is freed. An f32 dlogits with narrower activations (RL's
// per-token log-probabilities keep f32 logits) is rounded to their dtype
// first, as autocast's backward does: an f32 dlogits times a bf16 lm_head
// would make CudaBackend::matmul widen the whole [V, C] weight to f32
// scratch, and the chunk copy is far smaller.
void LanguageModel::lm_head_backward_chunk(Tensor& logits, const Tensor& hidden_rows, Tensor& dhidden_rows) {
  Backend& be = backend_;
  Parameter& lm_head = *lm_head_;
  Tensor dlogits = logits;
  if (logits.dtype != hidden_rows.dtype) {
    dlogits = be.empty(logits.shape, hidden_rows.dtype, MemCategory::activations);
    be.copy(dlogits, logits);
  }
  logits = Tensor{};
  be.matmul(dhidden_rows, dlogits, lm_head.value, false, false, logits_scale_);
  if (lm_head.trainable()) be.matmul(lm_head.grad, dlogits, hidden_rows, true, false, logits_scale_, 1.0f);
}

// The log-probabilities first (each token's -cross-entropy), chunk by
// chunk without a backward; then, with gradient, the per-token weights
// g[n] = d(loss)/d(logps[n]), and a second pass in which cross_entropy's
// backward scaled by -g[n] on row n (d logp / d logits = onehot - softmax)
// gives dlogits for lm_head_backward_chunk. A single chunk keeps its logits
// between the passes; with several chunks each chunk's logits are made again
// (one more LM-head product), so no [N, V] tensor exists when
// loss_chunk_tokens is set. No counted token: no backward (dhidden stays
// undefined).
std::vector<float> LanguageModel::lm_head_token_logps(const Tensor& hidden, const StepTokens& tokens,
                                                      Tensor* dhidden, const TokenLogpsGradient* gradient) {
  Backend& be = backend_;
  const int64_t N = hidden.rows(), V = config_.vocab_size;
  const int64_t chunk = options_.loss_chunk_tokens > 0 ? std::min(options_.loss_chunk_tokens, N) : N;
  auto chunk_logits = [&](int64_t first, int64_t rows) {
    Tensor logits = be.empty({rows, V}, DType::f32, MemCategory::activations);
    be.matmul(logits, hidden.slice_rows(first, rows), lm_head_->value, false, true, logits_scale_);
    return logits;
  };
  Tensor losses = be.empty({N}, DType::f32, MemCategory::activations);
  Tensor kept_logits;  // the single chunk's, for the backward pass
  for (int64_t first = 0; first < N; first += chunk) {
    const int64_t rows = std::min(chunk, N - first);
    Tensor logits = chunk_logits(first, rows);
    Tensor chunk_losses = losses.slice_rows(first, rows);
    be.cross_entropy(chunk_losses, nullptr, logits, tokens.targets.slice_rows(first, rows), 0.0f);
    if (gradient && rows == N) kept_logits = logits;
  }
  HostAllocator host;
  Tensor host_losses = Tensor::empty({N}, DType::f32, host, MemCategory::activations);
  be.copy(host_losses, losses);
  std::vector<float> logps(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) logps[size_t(n)] = -host_losses.ptr<float>()[n];
  if (!gradient || tokens.counted == 0) return logps;

  const std::vector<float> dlogps = (*gradient)(logps);
  FT_CHECK(int64_t(dlogps.size()) == N, "lm_head_token_logps: the gradient has ", dlogps.size(), " tokens, the batch ",
           N);
  Tensor host_scales = Tensor::empty({N}, DType::f32, host, MemCategory::activations);
  for (int64_t n = 0; n < N; ++n) host_scales.ptr<float>()[n] = -dlogps[size_t(n)];
  Tensor scales = be.empty({N}, DType::f32, MemCategory::activations);
  be.copy(scales, host_scales);
  *dhidden = be.empty(hidden.shape, hidden.dtype, MemCategory::activations);
  for (int64_t first = 0; first < N; first += chunk) {
    const int64_t rows = std::min(chunk, N - first);
    Tensor logits = kept_logits.defined() ? kept_logits : chunk_logits(first, rows);
    kept_logits = Tensor{};
    Tensor chunk_losses = losses.slice_rows(first, rows), chunk_scales = scales.slice_rows(first, rows);
    be.cross_entropy(chunk_losses, &logits, logits, tokens.targets.slice_rows(first, rows), 1.0f, &chunk_scales);
    Tensor dhidden_rows = dhidden->slice_rows(first, rows);
    lm_head_backward_chunk(logits, hidden.slice_rows(first, rows), dhidden_rows);
  }
  return logps;
}

void LanguageModel::set_trainable(const std::function<bool(const std::string&)>& is_trainable) {
  for (Parameter& p : parameters_) {
    FT_CHECK(!is_trainable(p.name) || !p.is_quantized(), "\"", p.name, "\" is frozen in ",
             quantized_format(p.quantized.format).names.format,
             " and cannot be trained (use quantization.mode none for full fine-tuning)");
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

void LanguageModel::zero_grads() {
  for (std::deque<Parameter>* list : {&parameters_, &adapters_})
    for (Parameter& p : *list)
      if (p.trainable()) backend_.fill(p.grad, 0.0f);
}

}  // namespace ft
