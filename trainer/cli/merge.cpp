#include "trainer/cli/merge.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/error.h"
#include "model/atomic_file.h"
#include "model/json_input.h"
#include "model/lora_linear.h"
#include "model/peft_adapter.h"
#include "model/safetensors.h"
#include "trainer/cli/options.h"
#include "trainer/plan.h"

namespace ft {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// --dtype's spellings: fp16 as torch says it, not dtype_name()'s f16.
const EnumName<DType> kOutputDtypes[] = {{"bf16", DType::bf16}, {"fp16", DType::f16}, {"f32", DType::f32}};

// The files of a model folder besides config.json and the weights that
// transformers reads: tokenizers, their settings, generation defaults.
const char* const kCopiedFiles[] = {"tokenizer.json",     "tokenizer.model", "tokenizer_config.json",
                                    "special_tokens_map.json", "added_tokens.json", "vocab.json",
                                    "merges.txt",         "chat_template.jinja", "generation_config.json"};

// config.json's spelling of a dtype (torch's).
const char* torch_dtype_name(DType dtype) {
  return dtype == DType::bf16 ? "bfloat16" : dtype == DType::f16 ? "float16" : "float32";
}

bool is_float(DType dtype) { return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16; }

void check_output_folder(const MergeCommand& command) {
  std::error_code error;
  FT_CHECK(!fs::exists(command.out) || !fs::equivalent(command.out, command.model, error), command.out,
           ": --out is MODEL itself; merge writes a new folder");
  if (!fs::exists(command.out)) return;
  FT_CHECK(fs::is_directory(command.out), command.out, ": --out must be a folder");
  for (const fs::directory_entry& entry : fs::directory_iterator(command.out)) {
    const std::string name = entry.path().filename().string();
    FT_CHECK(!(name.rfind("model", 0) == 0 && name.find(".safetensors") != std::string::npos), command.out,
             ": already holds a checkpoint (", name, "); give a new or empty folder");
  }
}

// Every adapted module must be a floating [out, in] weight of MODEL that A
// [r, in] and B [out, r] fit; every tensor of MODEL must be floating (an INT8
// or NF4 base saved by a run is not the original weights).
void check_targets(const Checkpoint& base, const std::map<std::string, LoraPair>& pairs,
                   const std::string& adapter_file) {
  for (const std::string& name : base.names()) {
    const SafetensorsEntry& entry = base.entry(name);
    FT_CHECK(is_float(entry.dtype), entry.file, ": tensor \"", name, "\" is ", dtype_name(entry.dtype),
             " (a quantised base); merge needs the original F32, BF16 or F16 weights the adapter was trained over");
  }
  for (const auto& [module, pair] : pairs) {
    const std::string weight = module + ".weight";
    FT_CHECK(base.contains(weight), adapter_file, ": module \"", module, "\" has no weight \"", weight, "\" in ",
             base.path(), " (is this the adapter's base model?)");
    const SafetensorsEntry& entry = base.entry(weight);
    FT_CHECK(entry.shape == Shape({pair.B->shape[0], pair.A->shape[1]}), adapter_file, ": module \"", module,
             "\": lora_B ", shape_string(pair.B->shape), " x lora_A ", shape_string(pair.A->shape),
             " does not fit \"", weight, "\" ", shape_string(entry.shape), " of ", entry.file);
  }
}

// Tensor names in shards of at most max_bytes in dtype (a larger tensor alone), in checkpoint order.
std::vector<std::vector<std::string>> plan_shards(const Checkpoint& base, DType dtype, size_t max_bytes) {
  std::vector<std::vector<std::string>> shards(1);
  size_t shard_bytes = 0;
  for (const std::string& name : base.names()) {
    const size_t bytes = size_t(shape_numel(base.entry(name).shape)) * dtype_size_bytes(dtype);
    if (shard_bytes > 0 && shard_bytes + bytes > max_bytes) shards.emplace_back(), shard_bytes = 0;
    shards.back().push_back(name);
    shard_bytes += bytes;
  }
  return shards;
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

// name in dtype: the base tensor, plus scaling * B A where an adapter targets it (in f32, rounded once).
Tensor output_tensor(CpuBackend& be, const Checkpoint& base, const std::string& name, const LoraPair* pair,
                     float scaling, DType dtype) {
  Tensor out = be.empty(base.entry(name).shape, dtype, MemCategory::weights);
  if (!pair) {
    be.copy(out, base.view(name));
    return out;
  }
  Tensor weight = be.empty(out.shape, DType::f32, MemCategory::workspace);
  Tensor A = be.empty(pair->A->shape, DType::f32, MemCategory::workspace);
  Tensor B = be.empty(pair->B->shape, DType::f32, MemCategory::workspace);
  be.copy(weight, base.view(name));
  be.copy(A, view_of(*pair->A));
  be.copy(B, view_of(*pair->B));
  be.matmul(weight, B, A, false, false, scaling, 1.0f);
  be.copy(out, weight);
  return out;
}

// A SEQ_CLS adapter (a reward model): the config of transformers'
// *ForSequenceClassification with one label, as AutoModelForSequenceClassification
// loads it. It reads the score at the last token that is not pad_token_id:
// a base without one gets eos_token_id, the padding a run used then
// (trainer/data/data.h's padding_id).
void make_sequence_classifier(json& config, const std::string& source, std::ostream& log) {
  FT_CHECK(config.contains("architectures") && config["architectures"].is_array() &&
               !config["architectures"].empty() && config["architectures"][0].is_string(),
           source, ": a SEQ_CLS adapter's merge needs \"architectures\" (e.g. [\"LlamaForCausalLM\"])");
  std::string architecture = config["architectures"][0].get<std::string>();
  const std::string causal = "ForCausalLM";
  if (architecture.size() > causal.size() &&
      architecture.compare(architecture.size() - causal.size(), causal.size(), causal) == 0)
    architecture = architecture.substr(0, architecture.size() - causal.size()) + "ForSequenceClassification";
  config["architectures"] = json::array({architecture});
  config["id2label"] = {{"0", "LABEL_0"}};
  config["label2id"] = {{"LABEL_0", 0}};
  if (!config.contains("pad_token_id") || config["pad_token_id"].is_null()) {
    FT_CHECK(config.contains("eos_token_id") && config["eos_token_id"].is_number_integer(), source,
             ": a SEQ_CLS adapter's merge needs pad_token_id or eos_token_id (where the score is read)");
    config["pad_token_id"] = config["eos_token_id"];
    log << "pad_token_id: " << config["pad_token_id"] << " (eos_token_id; " << source << " has none)\n";
  }
}

// config.json with its dtype fields naming the output dtype.
void write_config(const MergeCommand& command, DType dtype, bool sequence_classifier, std::ostream& log) {
  const std::string source = (fs::path(command.model) / "config.json").string();
  json config = read_json_object(source, "a Hugging Face config.json");
  bool named = false;
  for (const char* key : {"torch_dtype", "dtype"})
    if (config.contains(key)) config[key] = torch_dtype_name(dtype), named = true;
  if (!named) config["torch_dtype"] = torch_dtype_name(dtype);
  if (sequence_classifier) make_sequence_classifier(config, source, log);
  write_file_atomically((fs::path(command.out) / "config.json").string(), config.dump(2) + "\n");
}

std::string shard_name(size_t index, size_t count) {
  if (count == 1) return "model.safetensors";
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return name;
}

}  // namespace

CLI::App* add_merge_command(CLI::App& app, MergeCommand& c) {
  CLI::App* merge =
      app.add_subcommand("merge", "Folds a PEFT LoRA adapter into MODEL's original weights: a Hugging Face folder");
  merge->footer(
      "W + scaling * B A in f32, rounded once to --dtype (PEFT's merge_and_unload), written to --out (a new or\n"
      "empty folder) in safetensors shards of at most --max-shard-size, with config.json and the tokenizer files.");
  merge->add_option("MODEL", c.model, "the Hugging Face checkpoint the adapter was trained over")->required();
  merge->add_option("--adapter", c.adapter, "a PEFT LoRA adapter folder")->type_name("DIR")->required();
  merge->add_option("--out", c.out, "the merged checkpoint's folder")->type_name("DIR")->required();
  add_choice_option(*merge, "--dtype", c.dtype, EnumNames<DType>(kOutputDtypes),
                    "the merged weights' dtype (default: the base weights')");
  auto shard_bytes = [](const std::string& text) {
    const size_t bytes = parse_byte_size(text);
    FT_CHECK(bytes > 0, "expected a size > 0, got \"", text, "\"");
    return bytes;
  };
  add_parsed_option(*merge, "--max-shard-size", c.max_shard_bytes, shard_bytes, "default 5GB")->type_name("SIZE");
  return merge;
}

void merge_adapter(const MergeCommand& command, std::ostream& log) {
  FT_CHECK(fs::is_regular_file(fs::path(command.model) / "config.json"), command.model,
           ": MODEL must be a Hugging Face checkpoint folder with a config.json");
  check_output_folder(command);
  const PeftAdapterConfig adapter = read_peft_adapter_config(command.adapter);
  SafetensorsFile adapter_file((fs::path(command.adapter) / "adapter_model.safetensors").string());
  verify_checksum(adapter_file);
  const std::map<std::string, LoraPair> pairs = read_lora_pairs(adapter_file, adapter);
  // modules_to_save (a reward model's score): saved whole, replacing or adding the base's tensor.
  const std::map<std::string, const SafetensorsEntry*> saved = saved_modules(adapter_file, adapter);
  const Checkpoint base(command.model);
  check_targets(base, pairs, adapter_file.path());
  std::vector<std::string> added;  // saved tensors the base lacks: after its own, in the last shard
  for (const auto& [name, entry] : saved) {
    if (!base.contains(name)) added.push_back(name);
    else
      FT_CHECK(base.entry(name).shape == entry->shape, adapter_file.path(), ": tensor \"", entry->name, "\" ",
               shape_string(entry->shape), " does not fit \"", name, "\" ", shape_string(base.entry(name).shape),
               " of ", base.entry(name).file);
  }
  const DType dtype = command.dtype.value_or(base.entry(pairs.begin()->first + ".weight").dtype);
  const float scaling = lora_scaling(adapter.lora.lora_alpha, adapter.lora.r, adapter.lora.use_rslora);

  fs::create_directories(command.out);
  std::vector<std::vector<std::string>> shards = plan_shards(base, dtype, command.max_shard_bytes);
  shards.back().insert(shards.back().end(), added.begin(), added.end());
  json weight_map = json::object();
  size_t total_bytes = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    HostAllocator host;  // before the tensors it backs: one shard's worth
    CpuBackend be(host);
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const std::string& name : shards[s]) {
      auto whole = saved.find(name);
      if (whole != saved.end()) {
        tensors.emplace_back(name, be.empty(whole->second->shape, dtype, MemCategory::weights));
        be.copy(tensors.back().second, view_of(*whole->second));
      } else {
        tensors.emplace_back(name, output_tensor(be, base, name, pair_of(pairs, name), scaling, dtype));
        base.release(name);
      }
      weight_map[name] = shard_name(s, shards.size());
      total_bytes += tensors.back().second.size_bytes();
    }
    save_safetensors((fs::path(command.out) / shard_name(s, shards.size())).string(), tensors, {{"format", "pt"}});
  }
  if (shards.size() > 1) {
    const json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
    write_file_atomically((fs::path(command.out) / "model.safetensors.index.json").string(), index.dump(2) + "\n");
  }
  write_config(command, dtype, adapter.task_type == "SEQ_CLS", log);
  for (const char* file : kCopiedFiles)
    if (fs::exists(fs::path(command.model) / file))
      copy_file_atomically((fs::path(command.model) / file).string(), (fs::path(command.out) / file).string());
  log << "merged " << pairs.size() << " LoRA modules (scaling " << scaling << ")"
      << (saved.empty() ? "" : " and " + std::to_string(saved.size()) + " modules_to_save tensors") << " into "
      << base.names().size() + added.size()
      << " " << dtype_name(dtype) << " tensors, " << shards.size() << " shard" << (shards.size() > 1 ? "s" : "")
      << ": " << command.out << "\n";
}

}  // namespace ft
