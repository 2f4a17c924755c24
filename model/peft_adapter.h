// LoRA adapters in PEFT's on-disk format, so adapters trained here load with
// PeftModel.from_pretrained and adapters from PEFT load here.
//
// A PEFT adapter folder holds adapter_config.json and adapter_model.safetensors
// whose keys are "base_model.model." + the module's Hugging Face name, e.g.
// base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight (A [r, in],
// B [out, r]). PEFT drops the adapter name ("default") when saving; some
// tools keep it (...q_proj.lora_A.default.weight), and both are read.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "model/causal_lm.h"
#include "model/model_options.h"
#include "model/safetensors.h"

namespace ft {

struct PeftAdapterConfig {
  LoraOptions lora;
  std::string base_model_name_or_path;
  std::string task_type = "CAUSAL_LM";
  // Modules trained whole and saved beside the adapters, under
  // base_model.model.<module>.weight (PEFT's modules_to_save): a reward
  // model's "score" (task_type SEQ_CLS, for which PEFT adds "classifier"
  // and "score").
  std::vector<std::string> modules_to_save;
  // PEFT's ensure_weight_tying: a modules_to_save copy of a tied embedding
  // keeps the head tied to it.
  bool ensure_weight_tying = false;
  // init_lora_weights when the file gives a string other than "gaussian"
  // (PEFT's pissa, olora, eva, ...), as written; else "" (lora holds it).
  std::string init_lora_weights = {};
};

// Reads folder/adapter_config.json. Requires peft_type "LORA" and
// target_modules (names, all-linear or a regular expression; with
// exclude_modules, layers_to_transform and layers_pattern as PEFT reads
// them, model/lora_pattern.h); r, lora_alpha, lora_dropout and
// use_rslora, when absent, keep LoraOptions' defaults (PEFT's); rank_pattern
// and alpha_pattern keep the file's order. Settings that would
// change the adapter's math and that we do not implement (bias,
// fan_in_fan_out, ...) are Errors rather
// than silently ignored; fields we do not know are ignored (PEFT writes
// many). Errors name the file and the field.
PeftAdapterConfig read_peft_adapter_config(const std::string& folder);

// "" unless the adapter belongs to another base than model_dir's weights,
// which PEFT loads silently when the shapes fit: then a warning saying why.
// Its base_model_name_or_path is a local model folder other than model_dir
// whose config.json differs from model_dir's in more than how the weights
// are stored (quantization_config, dtype). A hub id or a path that does not
// resolve from here says nothing. (An adapter whose init_lora_weights
// rewrites the base, PiSSA and the like, is refused when it is read.)
std::string other_base_warning(const PeftAdapterConfig& adapter, const std::string& adapter_folder,
                               const std::string& model_dir);

// folder/adapter_model.safetensors, checked to hold what is read here: a
// folder with only PEFT's older adapter_model.bin (a PyTorch pickle) is an
// Error saying so and how to convert it, and so is LoRA on an embedding
// (PEFT's lora_embedding_A/B: LoRA applies to linear modules here). generate
// and merge both read an adapter through it, so they refuse the same ones.
std::string adapter_weights(const std::string& folder);

// Creates folder (and parents) and writes adapter_model.safetensors (f32,
// with a "checksum" in its metadata that PEFT ignores) and
// adapter_config.json, each atomically. config.lora must describe the model's
// adapters (r, alpha, rslora, targets, rank and alpha patterns): a mismatch is an Error.
void save_peft_adapter(const std::string& folder, LanguageModel& model, const PeftAdapterConfig& config);
// The model's adapters as f32 host tensors under PEFT's keys, in the model's
// order, then its score head when it trains (modules_to_save; PPO's value
// head is saved beside the adapter instead, as trl does).
std::vector<std::pair<std::string, Tensor>> peft_adapter_tensors(LanguageModel& model, Allocator& host);
// The same folder from such tensors (pipeline parallel: every stage's, in
// stage order), checked against model_lora as above.
void save_peft_adapter(const std::string& folder, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::optional<LoraOptions>& model_lora, const PeftAdapterConfig& config);

// Copies every adapter tensor of folder into model.adapters(), and each
// modules_to_save tensor into the model's parameter of that name (a reward
// model's score.weight). The model must have been built with the folder's r,
// lora_alpha, use_rslora, its module selection, rank_pattern and alpha_pattern; every adapter needs exactly one
// tensor of its shape, and the file may hold nothing else. Everything is checked before any value is
// copied, so a refused adapter leaves the model as it was.
void load_peft_adapter(const std::string& folder, LanguageModel& model);

// One adapted module's A [r, in] and B [out, r] (and DoRA's magnitude
// [out]), views into the adapter file.
struct LoraPair {
  const SafetensorsEntry* A = nullptr;
  const SafetensorsEntry* B = nullptr;
  const SafetensorsEntry* magnitude = nullptr;  // DoRA's [out], with use_dora
  float scaling = 0;  // the module's own (module_lora: rank_pattern, alpha_pattern)
};

// The LoRA pairs of an adapter_model.safetensors by module name (the base
// model's, e.g. model.layers.0.self_attn.q_proj), with no model built: for
// merging adapters into a checkpoint's weights. Every tensor but
// config.modules_to_save's (saved_modules) and base layer copies
// (base_layer_copies) must be a LoRA
// weight of floating dtype (checked finite), every module must have both A
// and B with matching rank, and the rank must be the module's (config.lora.r
// or its rank_pattern's, module_lora); each failure
// is an Error naming the file and the tensor.
std::map<std::string, LoraPair> read_lora_pairs(const SafetensorsFile& file, const PeftAdapterConfig& config);
// The modules PEFT saved whole, by the model's checkpoint name
// (score.weight), views into the adapter file: modules_to_save, each module
// whose name ends with a listed string (as PEFT matches them). Over a tied
// embedding they are refused unless ensure_weight_tying, where PEFT keeps
// the head tied to the embedding's copy and saves it too (the same values:
// checked, then dropped). Each listed module the model has needs a tensor
// (without one PEFT would keep the base's module, which an adapter that
// lists it does not mean); listed modules the model lacks are skipped
// (PEFT's SEQ_CLS adapters list both "classifier" and "score"). Errors name
// the file and the tensor.
std::map<std::string, const SafetensorsEntry*> saved_modules(const SafetensorsFile& file,
                                                              const PeftAdapterConfig& config, LanguageModel& model);
// PEFT's copies of a LoRA module's base weight by its name (lm_head.weight),
// views into the file: for LoRA on an embedding or a head, PEFT's default
// save_embedding_layers saves base_model.model.<module>.base_layer.weight
// too, and loads it over the base's.
std::map<std::string, const SafetensorsEntry*> base_layer_copies(const SafetensorsFile& file);

}  // namespace ft
