#include "trainer/run_identity.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "model/checksum.h"
#include "model/safetensors.h"

namespace ft {
namespace {

// How the frozen base is held: its values differ with each of these.
std::string held_as(const QuantizationConfig& quantization) {
  switch (quantization.mode) {
    case QuantizedBase::int8: return "int8, threshold " + nlohmann::json(quantization.threshold).dump();
    case QuantizedBase::nf4: return std::string("nf4, double_quant ") + (quantization.double_quant ? "true" : "false");
    case QuantizedBase::none: return "not quantized";
  }
  return "";
}

// The frozen tensors' names, dtypes and shapes: what the safetensors headers
// say, not the data, so a large base costs nothing to identify.
std::string base_tensors(const TrainConfig& config) {
  if (config.init == InitMode::random) return "random init, seed " + std::to_string(config.seed);
  Checkpoint checkpoint(config.model);
  Checksum checksum;
  const std::vector<std::string> names = checkpoint.names();  // sorted
  for (const std::string& name : names) {
    const SafetensorsEntry& entry = checkpoint.entry(name);
    checksum.add_text(name);
    checksum.add_text(dtype_name(entry.dtype));
    checksum.add_text(shape_string(entry.shape));
  }
  return std::to_string(names.size()) + " tensors, checksum " + checksum.hex() + ", " + held_as(config.quantization);
}

std::string adapter_config(const TrainConfig& config, const LanguageModel& model) {
  if (config.trainable == Trainable::all) return "trainable: all (no adapters)";
  const LoraOptions& lora = *model.options().lora;
  std::vector<std::string> targets = lora.target_modules;
  std::sort(targets.begin(), targets.end());
  nlohmann::json described = {{"r", lora.r},
                              {"lora_alpha", lora.lora_alpha},
                              {"lora_dropout", lora.lora_dropout},
                              {"target_modules", targets},
                              {"use_rslora", lora.use_rslora}};
  if (lora.use_dora) described["use_dora"] = true;  // absent otherwise: earlier runs' identities unchanged
  if (lora.init_lora_weights == LoraInit::gaussian) described["init_lora_weights"] = "gaussian";  // likewise
  if (lora.init_lora_weights == LoraInit::random) described["init_lora_weights"] = false;
  if (!lora.target_modules_regex.empty()) described["target_modules"] = lora.target_modules_regex;
  // Absent when unset, as above.
  if (!lora.exclude_modules.empty()) described["exclude_modules"] = lora.exclude_modules;
  if (!lora.exclude_modules_regex.empty()) described["exclude_modules"] = lora.exclude_modules_regex;
  if (!lora.layers_to_transform.empty()) described["layers_to_transform"] = lora.layers_to_transform;
  if (!lora.layers_pattern.empty()) described["layers_pattern"] = lora.layers_pattern;
  // Lists of [pattern, value] in order (the first match wins), absent when empty as above.
  if (!lora.rank_pattern.empty()) described["rank_pattern"] = lora.rank_pattern;
  if (!lora.alpha_pattern.empty()) described["alpha_pattern"] = lora.alpha_pattern;
  return described.dump();
}

// What the saved data position (epoch, micro-batch or prompts drawn) stands
// for: another seed shuffles other rows there; another micro-batch size or
// packing (and seq_len, which packing fills) puts other rows in a micro-batch.
std::string data_order(const TrainConfig& config) {
  std::string order = "seed " + std::to_string(config.seed);
  if (config.objective == Objective::grpo || config.objective == Objective::ppo) return order;  // counts prompts
  order += ", micro_batch_size " + std::to_string(config.micro_batch_size);
  if (config.data.packing == Packing::none) return order;
  return order + ", packing " + enum_name(config.data.packing) + ", seq_len " + std::to_string(config.seq_len);
}

}  // namespace

RunIdentity run_identity(const TrainConfig& config, const LanguageModel& model, const std::string& base_weights) {
  const std::string config_json = (std::filesystem::path(config.model) / "config.json").string();
  RunIdentity identity = {
      {"base_model.config", "the base model's config.json (" + config_json + ")", file_fingerprint(config_json)},
      {"base_model.tensors",
       "the base model's tensors (names, dtypes and shapes in " + config.model + "; quantization)",
       base_tensors(config)},
      {"adapter", "the adapter config", adapter_config(config, model)},
      {"tokenizer", "the tokenizer (" + config.tokenizer + ")", file_fingerprint(config.tokenizer)},
      {"data.train", "the train data (" + config.data.train + ")", file_fingerprint(config.data.train), true},
  };
  // The weights' bytes, hashed as they loaded: same names and shapes but other
  // values is another base.
  if (!base_weights.empty())
    identity.push_back(
        {"base_model.weights", "the base model's weights (xxHash of every tensor's bytes, " + config.model + ")",
         base_weights});
  identity.push_back({"data.order",
                      "the data order (seed, micro_batch_size, data.packing: the saved position counts its "
                      "micro-batches)",
                      data_order(config), true});
  if (!config.data.eval.empty())
    identity.push_back(
        {"data.eval", "the eval data (" + config.data.eval + ")", file_fingerprint(config.data.eval), true});
  return identity;
}

}  // namespace ft
