// The model families this trainer reads, one table entry per config.json
// model_type: how its config is read, what builds it, whether it is a
// decoder-only or an encoder-decoder model, PEFT's default LoRA targets for
// it, whether pipeline stages can split it, and how llama.cpp's GGUF names
// it. Nothing outside this table
// tells families apart by name; adding an architecture is one entry here
// plus its layer (docs/extending.md).
#pragma once
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "model/causal_lm.h"
#include "model/gguf_names.h"
#include "model/model_config.h"
#include "model/model_options.h"

namespace ft {

// What the trainer does differently by family: a causal model's rows are
// tokens and next-token targets; a seq2seq model's are the encoder's tokens
// followed by the labels (LanguageModel::forward).
enum class ModelKind { causal, seq2seq };

struct ModelFamily {
  const char* model_type;  // config.json's model_type
  ModelKind kind;
  // The family's fields of config.json (the shared ones: model_config.h).
  void (*read_config)(const nlohmann::json& config, ModelConfig& result, const std::string& source);
  std::unique_ptr<LanguageModel> (*build)(const ModelConfig& config, Backend& backend, const ModelOptions& options);
  std::vector<std::string> default_lora_targets;  // PEFT's target_modules when a config names none
  bool pipeline;                                  // parallel.pipeline can split its decoder layers
  const GgufArchitecture* gguf;                   // how llama.cpp reads it; null: llama.cpp cannot
};

const std::vector<ModelFamily>& model_families();
// The entry of model_type; an unknown one is an Error naming source (when
// given) and every supported model_type.
const ModelFamily& model_family(const std::string& model_type, const std::string& source = "");
// e.g. "supported model_type values: \"llama\", \"qwen2\", ...", only those of
// kind when given.
std::string supported_model_types(const ModelKind* kind = nullptr);
// adapter_config.json's task_type: "CAUSAL_LM" or "SEQ_2_SEQ_LM".
const char* peft_task_type(ModelKind kind);

// Reads and validates path (a config.json) by its family's reader. Missing
// required fields, wrong types, integers above kMaxModelConfigInt,
// non-finite numbers and unsupported settings are Errors naming the file and
// the field.
ModelConfig read_model_config(const std::string& path);
// Same, from JSON text; source names it in messages.
ModelConfig parse_model_config(const std::string& text, const std::string& source);

// The architecture of config.model_type, with options.lora's empty
// target_modules replaced by the family's default.
std::unique_ptr<LanguageModel> make_language_model(const ModelConfig& config, Backend& backend,
                                                   const ModelOptions& options);
// The same for a decoder-only family; an encoder-decoder one is an Error.
std::unique_ptr<CausalLM> make_causal_lm(const ModelConfig& config, Backend& backend, const ModelOptions& options);

}  // namespace ft
