#include "trainer/cli/merge.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/error.h"
#include "kernels/op_checks.h"
#include "model/atomic_file.h"
#include "model/json_input.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "trainer/adapter_merge.h"
#include "trainer/cli/options.h"
#include "trainer/plan.h"

namespace ft {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// --dtype's spellings: fp16 as torch says it, not dtype_name()'s f16.
// Both spellings of each (the config's precision says fp32, export's --outtype f16).
const EnumName<DType> kOutputDtypes[] = {
    {"bf16", DType::bf16}, {"fp16", DType::f16}, {"f16", DType::f16}, {"f32", DType::f32}, {"fp32", DType::f32}};

// The files of a model folder besides config.json and the weights that
// transformers reads: tokenizers, their settings, generation defaults.
const char* const kCopiedFiles[] = {"tokenizer.json",     "tokenizer.model", "tokenizer_config.json",
                                    "special_tokens_map.json", "added_tokens.json", "vocab.json",
                                    "merges.txt",         "chat_template.jinja", "generation_config.json"};

void check_output_folder(const MergeCommand& command) {
  std::error_code error;
  FT_CHECK(!fs::exists(command.out) || !fs::equivalent(command.out, command.model, error), command.out,
           ": --out is MODEL itself; merge writes a new folder");
  if (!fs::exists(command.out)) return;
  FT_CHECK(fs::is_directory(command.out), command.out, ": --out must be a folder");
  const std::string model_file = model_file_in(command.out);
  FT_CHECK(model_file.empty(), command.out, ": already holds a model (", model_file, "); give a folder without one");
  for (const char* file : kCopiedFiles)
    FT_CHECK(!fs::exists(fs::path(command.out) / file), command.out, ": already holds ", file,
             ", which merge would replace; give a folder without one");
}

// A merged weight rounded to a narrower dtype must stay finite: f16 holds
// |x| <= 65504, and an Inf written would make the folder unloadable.
void check_representable(const Tensor& merged, const std::string& name, const std::string& out) {
  const size_t count = size_t(merged.numel());
  const size_t bad = first_non_finite_value(merged.data, merged.dtype, count);
  FT_CHECK(bad == count, out, ": tensor \"", name, "\" does not fit ", dtype_name(merged.dtype), ": element ", bad,
           " rounds to infinity (f16 holds |x| <= 65504); give --dtype bf16 or fp32");
}

// Tensor names in shards of at most max_bytes, each in its dtype_of (a larger tensor alone), in checkpoint order.
std::vector<std::vector<std::string>> plan_shards(const AdapterMerge& adapter,
                                                 const std::function<DType(const std::string&)>& dtype_of,
                                                 size_t max_bytes, bool sequence_classifier) {
  // transformers' *ForSequenceClassification has a score head instead of the
  // language-model head (Llama's lm_head, GPT-NeoX's embed_out): not written.
  static const std::set<std::string> kLanguageModelHeads = {"lm_head.weight", "embed_out.weight"};
  std::vector<std::vector<std::string>> shards(1);
  size_t shard_bytes = 0;
  for (const std::string& name : adapter.base_names()) {
    if (sequence_classifier && kLanguageModelHeads.count(name)) continue;
    const size_t bytes = size_t(shape_numel(adapter.base_shape(name))) * dtype_size_bytes(dtype_of(name));
    if (shard_bytes > 0 && shard_bytes + bytes > max_bytes) shards.emplace_back(), shard_bytes = 0;
    shards.back().push_back(name);
    shard_bytes += bytes;
  }
  return shards;
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

// config.json with its dtype fields naming the output dtype (given with
// --dtype, or the weights a quantised base dequantises to; otherwise kept),
// untied where the adapter saves its own lm_head, without the
// quantization_config of a base saved quantised (the merged weights are floating).
void write_config(const MergeCommand& command, std::optional<DType> dtype, bool sequence_classifier, bool untie,
                  std::ostream& log) {
  const std::string source = (fs::path(command.model) / "config.json").string();
  json config = dtype ? config_saved_as(source, *dtype) : read_json_object(source, "a Hugging Face config.json");
  config.erase("quantization_config");
  if (untie) config["tie_word_embeddings"] = false;
  if (sequence_classifier) make_sequence_classifier(config, source, log);
  write_file_atomically((fs::path(command.out) / "config.json").string(), config.dump(2) + "\n");
}

std::string shard_name(size_t index, size_t count) {
  if (count == 1) return "model.safetensors";
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return name;
}

// "bf16", or "bf16 and f32" for a checkpoint of mixed dtypes.
std::string dtype_list(const std::set<std::string>& names) {
  std::string text;
  for (const std::string& name : names) text += (text.empty() ? "" : " and ") + name;
  return text;
}

// "scaling 2", or "scalings 0.5 to 8" where rank_pattern or alpha_pattern
// gives modules their own.
std::string scalings(const std::map<std::string, LoraPair>& pairs) {
  float low = pairs.begin()->second.scaling, high = low;
  for (const auto& [module, pair] : pairs) low = std::min(low, pair.scaling), high = std::max(high, pair.scaling);
  std::ostringstream text;
  if (low == high) text << "scaling " << low;
  else text << "scalings " << low << " to " << high;
  return text.str();
}

}  // namespace

CLI::App* add_merge_command(CLI::App& app, MergeCommand& c) {
  CLI::App* merge =
      app.add_subcommand("merge", "Folds a PEFT LoRA adapter into MODEL's original weights: a Hugging Face folder");
  merge->footer(
      "W + scaling * B A in f32, rounded once to --dtype (PEFT's merge_and_unload), written to --out (a folder\n"
      "without a checkpoint in it; other files stay) in safetensors shards of at most --max-shard-size, with\n"
      "config.json and the tokenizer files. A base saved INT8 or NF4 (bitsandbytes) merges into its weights\n"
      "dequantised as bitsandbytes dequantises them, written floating.");
  merge->add_option("MODEL", c.model, "the Hugging Face checkpoint the adapter was trained over")->required();
  merge->add_option("--adapter", c.adapter, "a PEFT LoRA adapter folder")->type_name("DIR")->required();
  merge->add_option("--out", c.out, "the merged checkpoint's folder")->type_name("DIR")->required();
  add_choice_option(*merge, "--dtype", c.dtype, EnumNames<DType>(kOutputDtypes),
                    "the merged weights' dtype (default: each tensor's own)");
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
  const Checkpoint base(command.model);
  const std::string config_path = (fs::path(command.model) / "config.json").string();
  const AdapterMerge adapter(command.adapter, base, config_path);
  const std::string other_base = other_base_warning(adapter.config(), command.adapter, command.model);
  if (!other_base.empty()) log << "warning: " << other_base << "\n";
  check_base_matches_config(base, config_path);
  const bool untie = adds_untied_head(adapter, config_path);
  // Each tensor in --dtype, else its own, as PEFT's merge_and_unload keeps it: a quantised base's
  // dequantised weights and tensors the base lacks (a score head) in the model's floating dtype.
  const DType model_dtype =
      adapter.dequantises() ? adapter.float_dtype() : base.entry(adapter.pairs().begin()->first + ".weight").dtype;
  const auto dtype_of = [&](const std::string& name) {
    const bool own = base.contains(name) && checks::is_floating(base.entry(name).dtype);
    return command.dtype.value_or(own ? base.entry(name).dtype : model_dtype);
  };
  std::set<std::string> written_dtypes;

  const bool new_folder = !fs::exists(command.out);
  create_folder(command.out, "merge --out");
  const bool sequence_classifier = adapter.config().task_type == "SEQ_CLS";
  std::vector<std::vector<std::string>> shards =
      plan_shards(adapter, dtype_of, command.max_shard_bytes, sequence_classifier);
  // Added tensors (a score head over a causal LM's checkpoint) after the base's, in the last shard.
  shards.back().insert(shards.back().end(), adapter.added_names().begin(), adapter.added_names().end());
  json weight_map = json::object();
  size_t total_bytes = 0;
  try {
    for (size_t s = 0; s < shards.size(); ++s) {
      HostAllocator host;  // before the tensors it backs: one shard's worth
      CpuBackend be(host);
      std::vector<std::pair<std::string, Tensor>> tensors;
      for (const std::string& name : shards[s]) {
        tensors.emplace_back(name, adapter.tensor(be, name, dtype_of(name)));
        check_representable(tensors.back().second, name, command.out);
        written_dtypes.insert(dtype_name(dtype_of(name)));
        if (base.contains(name)) base.release(name);
        weight_map[name] = shard_name(s, shards.size());
        total_bytes += tensors.back().second.size_bytes();
      }
      save_safetensors((fs::path(command.out) / shard_name(s, shards.size())).string(), tensors, {{"format", "pt"}});
    }
  } catch (const Error&) {
    // A refused tensor leaves no half merge behind: the shards written (check_output_folder saw none
    // before) and the folder merge made go.
    std::error_code error;
    for (size_t s = 0; s < shards.size(); ++s) fs::remove(fs::path(command.out) / shard_name(s, shards.size()), error);
    if (new_folder) fs::remove(command.out, error);
    throw;
  }
  if (shards.size() > 1) {
    const json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
    write_file_atomically((fs::path(command.out) / "model.safetensors.index.json").string(), index.dump(2) + "\n");
  }
  // config.json's dtype: --dtype's, or that of a quantised base's weights dequantised; else kept.
  const std::optional<DType> config_dtype = command.dtype ? command.dtype
                                            : adapter.dequantises() ? std::optional(model_dtype)
                                                                    : std::nullopt;
  write_config(command, config_dtype, sequence_classifier, untie, log);
  for (const char* file : kCopiedFiles)
    if (fs::exists(fs::path(command.model) / file))
      copy_file_atomically((fs::path(command.model) / file).string(), (fs::path(command.out) / file).string());
  log << "merged " << adapter.pairs().size() << " LoRA modules (" << scalings(adapter.pairs()) << ")"
      << (adapter.saved().empty() ? "" : " and " + std::to_string(adapter.saved().size()) + " modules_to_save tensors")
      << " into " << weight_map.size() << " " << dtype_list(written_dtypes) << " tensors"
      << (adapter.dequantises() ? " (the base's INT8 or NF4 weights dequantised)" : "") << ", " << shards.size() << " shard" << (shards.size() > 1 ? "s" : "")
      << ": " << command.out << "\n";
}

}  // namespace ft
