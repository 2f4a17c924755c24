#include "trainer/adapter_merge.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "kernels/error.h"
#include "kernels/allocator.h"
#include "kernels/meta/meta_backend.h"
#include "model/families.h"
#include "model/quant/formats.h"
#include "model/quantized_format.h"

namespace ft {
namespace {

bool is_float(DType dtype) { return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16; }

// The quantised format a checkpoint tensor is saved in, or null for a floating one.
const QuantizedFormat* stored_format(const SafetensorsEntry& entry) {
  for (QuantizedBase base : kQuantizedBases)
    if (base != QuantizedBase::none && quantized_format(base).holds(entry)) return &quantized_format(base);
  return nullptr;
}

// The weight a quantised weight's constant would belong to: "<module>.weight"
// of "<module>.weight.absmax" (".quant_state...", ".SCB" of earlier saves) or
// of bitsandbytes' "<module>.SCB" and "<module>.weight_format"; "" for any other name.
std::string constant_owner(const std::string& name) {
  const size_t weight = name.rfind(".weight.");
  if (weight != std::string::npos) return name.substr(0, weight + std::string(".weight").size());
  for (const std::string suffix : {".SCB", ".weight_format"})
    if (name.ends_with(suffix)) return name.substr(0, name.size() - suffix.size()) + ".weight";
  return "";
}

// The adapter pair of a base tensor: name is <module>.weight for an adapted module.
const LoraPair* pair_of(const std::map<std::string, LoraPair>& pairs, const std::string& name) {
  const std::string suffix = ".weight";
  if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return nullptr;
  auto it = pairs.find(name.substr(0, name.size() - suffix.size()));
  return it == pairs.end() ? nullptr : &it->second;
}

Tensor view_of(const SafetensorsEntry& entry) {
  return Tensor::view_of(const_cast<void*>(entry.data), entry.shape, entry.dtype);
}

// read(model) of config's model, built on the meta device (no bytes).
template <typename Read>
auto read_meta_model(const ModelConfig& config, Read read, const ModelOptions& options = {}) {
  MetaAllocator no_bytes;
  MetaBackend meta(no_bytes, MemoryPolicy::cpu);
  const std::unique_ptr<LanguageModel> model = make_language_model(config, meta, options);
  return read(*model);
}
template <typename Read>
auto read_meta_model(const std::string& config_path, Read read) {
  return read_meta_model(read_model_config(config_path), read);
}

}  // namespace

std::set<std::string> check_base_matches_config(const Checkpoint& base, const std::string& config_path) {
  return read_meta_model(config_path, [&](LanguageModel& model) {
    std::set<std::string> names;
    for (const Parameter& p : model.parameters()) {
      FT_CHECK(base.contains(p.name), base.path(), ": missing tensor \"", p.name, "\", which ", config_path,
               " implies (does it describe these weights?)");
      // A weight saved quantised: its format's load checks its layout (NF4's codes are packed).
      if (!stored_format(base.entry(p.name))) require_shape(base.entry(p.name), p.name, whole_shape(p));
      names.insert(p.name);
    }
    return names;
  });
}

std::vector<std::string> unused_tensors(const Checkpoint& base, const ModelConfig& config, OutputHead head) {
  ModelOptions options;
  options.output_head = head;
  std::set<std::string> used = read_meta_model(config, [&](LanguageModel& model) {
    std::set<std::string> names;
    for (const Parameter& p : model.parameters()) names.insert(p.name);
    // A tied copy's tensor (a tied lm_head, T5's embed_tokens), which older transformers saved beside the original.
    for (const std::string& module : model.weightless_modules()) names.insert(module + ".weight");
    return names;
  }, options);
  std::vector<std::string> unused;
  for (const std::string& name : base.names())
    if (!used.contains(name) && !used.contains(constant_owner(name)))
      unused.push_back(name);
  return unused;
}

bool adds_untied_head(const AdapterMerge& adapter, const std::string& config_path) {
  return read_meta_model(config_path, [&](LanguageModel& model) {
    if (!model.config().tie_word_embeddings) return false;
    const std::vector<std::string>& added = adapter.added_names();
    return std::find(added.begin(), added.end(), model.untied_head_name()) != added.end();
  });
}

void check_float_base(const Checkpoint& base, const std::string& needs) {
  for (const std::string& name : base.names()) {
    const SafetensorsEntry& entry = base.entry(name);
    FT_CHECK(is_float(entry.dtype), entry.file, ": tensor \"", name, "\" is ", dtype_name(entry.dtype),
             " (a quantised base, as quantization.save_base writes); ", needs);
  }
}

void AdapterMerge::read_base_layout(const std::string& config_path) {
  read_meta_model(config_path, [&](LanguageModel& model) {
    bool first_float = true;
    for (const Parameter& p : model.parameters()) {
      if (!base_.contains(p.name)) continue;  // check_base_matches_config names it
      const SafetensorsEntry& entry = base_.entry(p.name);
      if (const QuantizedFormat* format = stored_format(entry)) {
        quantized_[p.name] = {format, whole_shape(p)};
      } else if (first_float) {
        float_dtype_ = entry.dtype;
        first_float = false;
      }
    }
    return 0;
  });
  for (const std::string& name : base_.names()) {
    const bool constant = quantized_.count(constant_owner(name)) > 0;
    if (constant) constants_.insert(name);
    const SafetensorsEntry& entry = base_.entry(name);
    FT_CHECK(constant || quantized_.count(name) || is_float(entry.dtype), entry.file, ": tensor \"", name, "\" is ",
             dtype_name(entry.dtype), ", neither a floating weight nor a decoder weight saved INT8 or NF4 (with ",
             "its constants beside it) of the model ", config_path, " describes");
  }
}

AdapterMerge::AdapterMerge(const std::string& folder, const Checkpoint& base, const std::string& config_path)
    : base_(base),
      config_(read_peft_adapter_config(folder)),
      file_(adapter_weights(folder)) {
  verify_checksum(file_);
  pairs_ = read_lora_pairs(file_, config_);
  read_base_layout(config_path);
  for (const auto& [module, pair] : pairs_) {
    const std::string weight = module + ".weight";
    FT_CHECK(base.contains(weight), file_.path(), ": module \"", module, "\" has no weight \"", weight, "\" in ",
             base.path(), " (is this the adapter's base model?)");
    const auto stored = quantized_.find(weight);
    const Shape shape = stored != quantized_.end() ? stored->second.shape : base.entry(weight).shape;
    FT_CHECK(shape == Shape({pair.B->shape[0], pair.A->shape[1]}), file_.path(), ": module \"", module,
             "\": lora_B ", shape_string(pair.B->shape), " x lora_A ", shape_string(pair.A->shape),
             " does not fit \"", weight, "\" ", shape_string(shape), " of ", base.entry(weight).file);
  }
  saved_ = read_meta_model(config_path, [&](LanguageModel& model) { return saved_modules(file_, config_, model); });
  check_base_layer_copies();
  for (const auto& [name, entry] : saved_) {
    if (!base.contains(name)) {
      added_.push_back(name);
      continue;
    }
    FT_CHECK(base.entry(name).shape == entry->shape, file_.path(), ": tensor \"", entry->name, "\" ",
             shape_string(entry->shape), " does not fit \"", name, "\" ", shape_string(base.entry(name).shape),
             " of ", base.entry(name).file);
  }
}

// PEFT loads its copy of a LoRA module's base weight over the base's; a copy
// of this base's own weight (as PEFT saved it, maybe in a narrower dtype)
// changes nothing, and any other is refused rather than merged.
void AdapterMerge::check_base_layer_copies() const {
  HostAllocator host;
  CpuBackend be(host);
  for (const auto& [name, copy] : base_layer_copies(file_)) {
    const std::string module = name.substr(0, name.size() - std::string(".weight").size());
    FT_CHECK(pairs_.contains(module), file_.path(), ": tensor \"", copy->name, "\" is a LoRA module's base weight, "
             "but the file holds no LoRA of \"", module, "\"");
    const Shape shape = base_shape(name);  // the constructor checked the pair's shape against it
    FT_CHECK(copy->shape == shape, file_.path(), ": tensor \"", copy->name, "\" ", shape_string(copy->shape),
             " does not fit \"", name, "\" ", shape_string(shape), " (was the adapter saved over a resized vocabulary?)");
    const Tensor base = base_weight(be, name);
    Tensor rounded = be.empty(shape, copy->dtype, MemCategory::workspace);
    Tensor base_values = be.empty(shape, DType::f32, MemCategory::workspace);
    Tensor copy_values = be.empty(shape, DType::f32, MemCategory::workspace);
    be.copy(rounded, base);
    be.copy(base_values, rounded);
    be.copy(copy_values, view_of(*copy));
    FT_CHECK(std::memcmp(base_values.ptr<float>(), copy_values.ptr<float>(), size_t(base.numel()) * sizeof(float)) == 0,
             file_.path(), ": tensor \"", copy->name, "\" (the base weight PEFT saves beside LoRA on an embedding or "
             "a head) differs from \"", name, "\" of ", base_.path(), "; PEFT would load it over the base's, which "
             "merge does not: merge the adapter with PEFT, or save it with save_embedding_layers=False over this base");
  }
}

std::vector<std::string> AdapterMerge::base_names() const {
  std::vector<std::string> names;
  for (const std::string& name : base_.names())
    if (!constants_.count(name)) names.push_back(name);
  return names;
}

Shape AdapterMerge::base_shape(const std::string& name) const {
  const auto stored = quantized_.find(name);
  return stored != quantized_.end() ? stored->second.shape : base_.entry(name).shape;
}

Tensor AdapterMerge::base_weight(CpuBackend& be, const std::string& name) const {
  const auto stored = quantized_.find(name);
  if (stored == quantized_.end()) {
    Tensor weight = be.empty(base_.entry(name).shape, DType::f32, MemCategory::workspace);
    be.copy(weight, base_.view(name));
    return weight;
  }
  const StoredWeight& s = stored->second;
  Parameter p;
  p.name = name;
  ModelOptions options;
  options.nf4_double_quant = base_.contains(name + ".nested_absmax");
  s.format->allocate(p, s.shape, be.allocator(), options);
  s.format->load(be, base_, p);
  Tensor weight = be.empty(s.shape, DType::f32, MemCategory::workspace);
  s.format->dequantize(be, p, weight);
  return weight;
}

Tensor AdapterMerge::tensor(CpuBackend& be, const std::string& name, DType dtype) const {
  auto whole = saved_.find(name);
  if (whole != saved_.end()) {
    Tensor out = be.empty(whole->second->shape, dtype, MemCategory::weights);
    be.copy(out, view_of(*whole->second));
    return out;
  }
  const LoraPair* pair = pair_of(pairs_, name);
  if (!pair && !quantized_.count(name)) {
    Tensor out = be.empty(base_.entry(name).shape, dtype, MemCategory::weights);
    be.copy(out, base_.view(name));
    return out;
  }
  Tensor weight = base_weight(be, name);
  Tensor out = be.empty(weight.shape, dtype, MemCategory::weights);
  if (!pair) {
    be.copy(out, weight);
    return out;
  }
  Tensor A = be.empty(pair->A->shape, DType::f32, MemCategory::workspace);
  Tensor B = be.empty(pair->B->shape, DType::f32, MemCategory::workspace);
  be.copy(A, view_of(*pair->A));
  be.copy(B, view_of(*pair->B));
  be.matmul(weight, B, A, false, false, pair->scaling, 1.0f);
  if (pair->magnitude) apply_dora_magnitude(be, weight, *pair->magnitude);
  be.copy(out, weight);
  return out;
}

// PEFT's DoRA merge: each row of W' = W + scaling B A times m / ||W'||_row.
void AdapterMerge::apply_dora_magnitude(CpuBackend& be, Tensor& weight, const SafetensorsEntry& magnitude) const {
  Tensor m = be.empty(magnitude.shape, DType::f32, MemCategory::workspace);
  be.copy(m, view_of(magnitude));
  Tensor sum_squares = be.empty({weight.rows()}, DType::f32, MemCategory::workspace);
  be.row_sum_squares(sum_squares, weight, false);
  const int64_t in = weight.cols();
  for (int64_t o = 0; o < weight.rows(); ++o) {
    const float scale = m.ptr<float>()[o] / std::sqrt(sum_squares.ptr<float>()[o]);
    for (float* w = weight.ptr<float>() + o * in; w < weight.ptr<float>() + (o + 1) * in; ++w) *w *= scale;
  }
}

}  // namespace ft
