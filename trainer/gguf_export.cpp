#include "trainer/gguf_export.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "kernels/error.h"
#include "model/families.h"
#include "model/gguf_quant.h"
#include "model/safetensors.h"
#include "tokenizer/load_tokenizer.h"
#include "trainer/adapter_merge.h"
#include "trainer/gguf_vocab.h"

namespace ft {
namespace fs = std::filesystem;

namespace {

// general.file_type: llama.cpp's llama_ftype of the bulk of the tensors.
uint32_t file_type(GgmlType type) {
  switch (type) {
    case GgmlType::f32: return 0;   // ALL_F32
    case GgmlType::f16: return 1;   // MOSTLY_F16
    case GgmlType::q8_0: return 7;  // MOSTLY_Q8_0
    case GgmlType::bf16: return 32; // MOSTLY_BF16
  }
  return 0;
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Rows reordered: row r of the result is row source_row(r) of values ([rows, cols]).
template <class SourceRow>
std::vector<float> reorder_rows(const std::vector<float>& values, int64_t rows, SourceRow source_row) {
  const int64_t cols = int64_t(values.size()) / rows;
  std::vector<float> out(values.size());
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(&out[size_t(r * cols)], &values[size_t(source_row(r) * cols)], size_t(cols) * sizeof(float));
  return out;
}

// convert_hf_to_gguf.py's LlamaModel.permute: within each of heads heads,
// rows [2, head_dim / 2] become [head_dim / 2, 2].
std::vector<float> permute_rope_rows(const std::vector<float>& values, int64_t rows, int64_t heads) {
  const int64_t head_dim = rows / heads, half = head_dim / 2;
  return reorder_rows(values, rows, [&](int64_t r) {
    const int64_t head = r / head_dim, i = (r % head_dim) / 2, j = r % 2;
    return head * head_dim + j * half + i;
  });
}

// GPT-NeoX's query_key_value rows, per head [q; k; v], regrouped as [all q; all k; all v].
std::vector<float> regroup_qkv_rows(const std::vector<float>& values, int64_t rows, int64_t heads) {
  const int64_t head_dim = rows / (3 * heads);
  return reorder_rows(values, rows, [&](int64_t r) {
    const int64_t part = r / (heads * head_dim), head = (r / head_dim) % heads, k = r % head_dim;
    return head * 3 * head_dim + part * head_dim + k;
  });
}

// convert_hf_to_gguf.py's rope_freqs for rope_type "llama3": per frequency
// the divisor llama.cpp applies (1, factor, or the smooth blend between),
// computed in f32 as its torch code does.
std::vector<float> llama3_rope_freqs(const ModelConfig& config) {
  const RopeScaling& rope = config.rope_scaling;
  const float old_context = float(rope.original_max_position_embeddings), factor = float(rope.factor);
  const float low = float(rope.low_freq_factor), high = float(rope.high_freq_factor);
  const float low_wavelen = old_context / low, high_wavelen = old_context / high;
  const float two_pi = float(2 * 3.14159265358979323846);
  std::vector<float> factors;
  for (int64_t i = 0; i < config.head_dim; i += 2) {
    const float freq = 1.0f / std::pow(config.rope_theta, float(i) / float(config.head_dim));
    const float wavelen = two_pi / freq;
    if (wavelen < high_wavelen) {
      factors.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      factors.push_back(factor);
    } else {
      const float smooth = (old_context / wavelen - low) / (high - low);
      factors.push_back(1.0f / ((1.0f - smooth) / factor + smooth));
    }
  }
  return factors;
}

// The hyper-parameter keys llama.cpp reads for the architecture.
GgufMetadata hyper_parameters(const ModelConfig& config, const GgufArchitecture& arch, GgmlType type,
                              const std::string& name) {
  const std::string prefix = std::string(arch.name) + ".";
  auto u32 = [](int64_t value) { return GgufValue::u32(uint32_t(value)); };
  GgufMetadata metadata = {
      {"general.architecture", GgufValue::string(arch.name)},
      {"general.type", GgufValue::string("model")},
      {"general.name", GgufValue::string(name)},
      {prefix + "context_length", u32(config.max_position_embeddings)},
      {prefix + "embedding_length", u32(config.hidden_size)},
      {prefix + "block_count", u32(config.num_hidden_layers)},
      {prefix + "feed_forward_length", u32(config.intermediate_size)},
      {prefix + "attention.head_count", u32(config.num_attention_heads)},
      {prefix + "rope.freq_base", GgufValue::f32(config.rope_theta)},
      {prefix + "rope.dimension_count", u32(config.rotary_dim())},
  };
  if (arch.layout == GgufLayout::llama) {
    metadata.emplace_back(prefix + "attention.head_count_kv", u32(config.num_key_value_heads));
    metadata.emplace_back(prefix + "attention.layer_norm_rms_epsilon", GgufValue::f32(config.rms_norm_eps));
    metadata.emplace_back(prefix + "attention.key_length", u32(config.head_dim));
    metadata.emplace_back(prefix + "attention.value_length", u32(config.head_dim));
    metadata.emplace_back(prefix + "vocab_size", u32(config.vocab_size));
  } else {
    metadata.emplace_back(prefix + "use_parallel_residual", GgufValue::boolean(config.use_parallel_residual));
    metadata.emplace_back(prefix + "attention.layer_norm_epsilon", GgufValue::f32(config.layer_norm_eps));
  }
  if (config.rope_scaling.type == "linear") {
    metadata.emplace_back(prefix + "rope.scaling.type", GgufValue::string("linear"));
    metadata.emplace_back(prefix + "rope.scaling.factor", GgufValue::f32(float(config.rope_scaling.factor)));
  }
  metadata.emplace_back("general.file_type", GgufValue::u32(file_type(type)));
  metadata.emplace_back("general.quantization_version", GgufValue::u32(2));  // GGML_QNT_VERSION
  return metadata;
}

// What llama.cpp cannot run as the checkpoint says: an Error naming source.
void check_supported(const ModelConfig& config, const ModelFamily& family, const std::string& source) {
  std::string exported;
  for (const ModelFamily& candidate : model_families())
    if (candidate.gguf) exported += std::string(exported.empty() ? "" : ", ") + "\"" + candidate.model_type + "\"";
  FT_CHECK(family.gguf, source, ": model_type \"", config.model_type,
           "\" has no llama.cpp architecture this export writes (model_type values it exports: ", exported, ")");
  const std::string& rope = config.rope_scaling.type;
  FT_CHECK(rope == "default" || rope == "linear" || (rope == "llama3" && family.gguf->rope_freqs), source,
           ": rope_type \"", rope, "\" is not one llama.cpp's \"", family.gguf->name,
           "\" applies (it reads default and linear", family.gguf->rope_freqs ? ", and llama3" : "", ")");
}

// The values of a checkpoint tensor (or one the adapter adds) in f32, with
// the adapter folded in when there is one.
std::vector<float> tensor_values(const Checkpoint& base, const AdapterMerge* adapter, const std::string& name) {
  if (adapter) {
    HostAllocator host;
    CpuBackend be(host);
    const Tensor merged = adapter->tensor(be, name, DType::f32);
    return std::vector<float>(merged.ptr<float>(), merged.ptr<float>() + merged.numel());
  }
  std::vector<float> values(static_cast<size_t>(shape_numel(base.entry(name).shape)));
  {
    const Tensor view = base.view(name);
    for (size_t i = 0; i < values.size(); ++i) values[i] = load_as_f32(view.data, view.dtype, int64_t(i));
  }
  base.release(name);
  return values;
}

// The type convert_hf_to_gguf.py gives a tensor at --outtype type.
GgmlType tensor_type(const std::string& gguf_name, const Shape& shape, GgmlType type) {
  if (shape.size() <= 1 || ends_with(gguf_name, "_norm.weight") || !ends_with(gguf_name, ".weight"))
    return GgmlType::f32;
  if (type == GgmlType::q8_0 && shape.back() % kQ8BlockValues != 0) return GgmlType::f16;
  return type;
}

GgufTensor make_tensor(std::string name, Shape shape, const std::vector<float>& values, GgmlType type) {
  const GgmlType stored = tensor_type(name, shape, type);
  return {std::move(name), shape, stored, to_ggml(values.data(), int64_t(values.size()), stored)};
}

}  // namespace

void export_gguf(const GgufExportCommand& command, std::ostream& log) {
  const std::string config_path = (fs::path(command.model) / "config.json").string();
  FT_CHECK(fs::is_regular_file(config_path), command.model,
           ": MODEL must be a Hugging Face checkpoint folder with a config.json");
  FT_CHECK(!command.out.empty(), "export: --gguf is empty; give the .gguf file to write");
  FT_CHECK(!fs::is_directory(command.out), command.out, ": --gguf names a folder; give the .gguf file to write");
  // An existing file is replaced only when asked, and only when it is a GGUF:
  // a --gguf that names the checkpoint's own weights or a data file never
  // destroys it.
  if (fs::exists(command.out)) {
    FT_CHECK(starts_as_gguf(command.out), command.out, ": --gguf names an existing file that is not a GGUF file; "
             "give a new path (export replaces only a GGUF file, with --overwrite)");
    FT_CHECK(command.overwrite, command.out, ": --gguf names an existing GGUF file; give --overwrite to replace it");
  }
  const ModelConfig config = read_model_config(config_path);
  const ModelFamily& family = model_family(config.model_type, config_path);
  check_supported(config, family, config_path);
  const GgufArchitecture& arch = *family.gguf;

  const std::string name = fs::path(command.model).lexically_normal().filename().string();
  GgufMetadata metadata = hyper_parameters(config, arch, command.type, name.empty() ? "model" : name);
  // llama.cpp's converter reads a SentencePiece vocabulary from tokenizer.model (added tokens from
  // tokenizer_config.json), also where a tokenizer.json beside it is the one transformers uses.
  const fs::path sentencepiece = fs::path(command.model) / "tokenizer.model";
  const std::string tokenizer = command.tokenizer.empty() && fs::is_regular_file(sentencepiece)
                                    ? sentencepiece.string()
                                    : command_tokenizer_path(command.tokenizer, command.model);
  add_gguf_vocab(tokenizer, config_path, config.vocab_size, metadata);

  const Checkpoint base(command.model);
  check_float_base(base, "export needs the original F32, BF16 or F16 weights the base was quantised from (or "
                   "the folder `finetune merge` writes from a quantised base and an adapter: its weights dequantised)");
  FT_CHECK(!base.contains("score.weight"), command.model, ": holds \"score.weight\", a sequence classifier's score "
           "head (a reward model merged by finetune merge); export --gguf writes language models");
  const std::set<std::string> model_tensors = check_base_matches_config(base, config_path);
  std::unique_ptr<AdapterMerge> adapter;
  if (!command.adapter.empty()) adapter = std::make_unique<AdapterMerge>(command.adapter, base, config_path);
  const std::string other_base = adapter ? other_base_warning(adapter->config(), command.adapter, command.model) : "";
  if (!other_base.empty()) log << "warning: " << other_base << "\n";
  // modules_to_save replace base tensors or add one (the head of a tied base, untied): llama.cpp reads
  // output.weight when the file has it. A score head has no GGUF name.
  std::vector<std::string> names = base.names();
  if (adapter) names.insert(names.end(), adapter->added_names().begin(), adapter->added_names().end());
  for (const auto& [saved, entry] : adapter ? adapter->saved() : std::map<std::string, const SafetensorsEntry*>{})
    FT_CHECK(!gguf_tensor_name(arch.layout, saved).empty(), command.adapter, ": the adapter saves \"", saved,
             "\" whole (modules_to_save: a reward model's score head), which a GGUF language model has no place for");

  std::vector<GgufTensor> tensors;
  if (config.rope_scaling.type == "llama3") {
    const std::vector<float> freqs = llama3_rope_freqs(config);
    tensors.push_back(make_tensor("rope_freqs.weight", {int64_t(freqs.size())}, freqs, command.type));
  }
  for (const std::string& hf_name : names) {
    const std::string gguf_name = gguf_tensor_name(arch.layout, hf_name);
    FT_CHECK(!gguf_name.empty(), base.entry(hf_name).file, ": tensor \"", hf_name,
             "\" has no name in llama.cpp's \"", arch.name, "\" architecture");
    // A layer's tensor beyond the model's (more layers than num_hidden_layers) would not match block_count.
    FT_CHECK(!base.contains(hf_name) || model_tensors.contains(hf_name) || !gguf_name.starts_with("blk."),
             base.entry(hf_name).file, ": tensor \"", hf_name, "\" is not in the model ", config_path, " describes (",
             config.num_hidden_layers, " layers)");
    const Shape shape = base.contains(hf_name) ? base.entry(hf_name).shape : adapter->saved().at(hf_name)->shape;
    std::vector<float> values = tensor_values(base, adapter.get(), hf_name);
    const bool q = ends_with(gguf_name, "attn_q.weight") || ends_with(gguf_name, "attn_q.bias");
    const bool k = ends_with(gguf_name, "attn_k.weight") || ends_with(gguf_name, "attn_k.bias");
    if (arch.permute_rope_rows && (q || k))
      values = permute_rope_rows(values, shape[0], q ? config.num_attention_heads : config.num_key_value_heads);
    if (arch.layout == GgufLayout::gpt_neox && (ends_with(gguf_name, "attn_qkv.weight") ||
                                                ends_with(gguf_name, "attn_qkv.bias")))
      values = regroup_qkv_rows(values, shape[0], config.num_attention_heads);
    tensors.push_back(make_tensor(gguf_name, shape, values, command.type));
  }
  write_gguf(command.out, metadata, tensors);
  log << "exported " << tensors.size() << " tensors (" << ggml_type_name(command.type) << ", llama.cpp architecture \""
      << arch.name << "\"" << (adapter ? ", " + std::to_string(adapter->pairs().size()) + " LoRA modules merged" : "")
      << ") to " << command.out << "\n";
}

}  // namespace ft
