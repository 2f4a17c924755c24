#include "model/families.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kernels/error.h"
#include "kernels/input_file.h"
#include "model/gpt_neox.h"
#include "model/json_input.h"
#include "model/llama.h"
#include "model/t5.h"

namespace ft {
namespace {

template <class Model>
std::unique_ptr<LanguageModel> build(const ModelConfig& config, Backend& backend, const ModelOptions& options) {
  return std::make_unique<Model>(config, backend, options);
}

const ModelFamily* find_model_family(const std::string& model_type) {
  for (const ModelFamily& family : model_families())
    if (model_type == family.model_type) return &family;
  return nullptr;
}

// "model_type \"gpt2\" is not supported (supported model_type values: ...)".
std::string unsupported(const std::string& model_type, const ModelKind* kind) {
  return "model_type \"" + model_type + "\" is not supported (" + supported_model_types(kind) + ")";
}

}  // namespace

// llama.cpp's names for a SentencePiece vocabulary and for the Split-regex
// pre-tokenizers of Llama-3's and Qwen2's tokenizer.json (llama-vocab.cpp).
const char* const kGgufSentencePieceModel = "llama";
const GgufPreTokenizer kGgufSplitPreTokenizers[2] = {
    {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     "llama-bpe"},
    {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     "qwen2"},
};

const std::vector<ModelFamily>& model_families() {
  // llama.cpp's architectures (gguf-py's MODEL_ARCH_NAMES); convert_hf_to_gguf.py
  // converts Mistral as "llama".
  static const GgufArchitecture gguf_llama = {"llama", GgufLayout::llama, true, true};
  static const GgufArchitecture gguf_qwen2 = {"qwen2", GgufLayout::llama, false, false};
  static const GgufArchitecture gguf_gpt_neox = {"gptneox", GgufLayout::gpt_neox, false, false};
  // PEFT's default target_modules (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING).
  static const std::vector<ModelFamily> families = {
      {"llama", ModelKind::causal, read_llama_config, build<LlamaModel>, {"q_proj", "v_proj"}, true, &gguf_llama},
      {"qwen2", ModelKind::causal, read_qwen2_config, build<LlamaModel>, {"q_proj", "v_proj"}, true, &gguf_qwen2},
      {"mistral", ModelKind::causal, read_mistral_config, build<LlamaModel>, {"q_proj", "v_proj"}, true, &gguf_llama},
      {"gpt_neox", ModelKind::causal, read_gpt_neox_config, build<GptNeoxModel>, {"query_key_value"}, true,
       &gguf_gpt_neox},
      {"t5", ModelKind::seq2seq, read_t5_config, build<T5Model>, {"q", "v"}, false, nullptr},
  };
  return families;
}

const ModelFamily& model_family(const std::string& model_type, const std::string& source) {
  const ModelFamily* family = find_model_family(model_type);
  FT_CHECK(family, source.empty() ? "" : source + ": ", unsupported(model_type, nullptr));
  return *family;
}

std::string supported_model_types(const ModelKind* kind) {
  std::string list = "supported model_type values: ";
  bool first = true;
  for (const ModelFamily& family : model_families()) {
    if (kind && family.kind != *kind) continue;
    list += std::string(first ? "" : ", ") + "\"" + family.model_type + "\"";
    first = false;
  }
  return list;
}

const char* peft_task_type(ModelKind kind) { return kind == ModelKind::causal ? "CAUSAL_LM" : "SEQ_2_SEQ_LM"; }

ModelConfig parse_model_config(const std::string& text, const std::string& source) {
  nlohmann::json config = parse_json(text, source);
  FT_CHECK(config.is_object(), source, ": expected a JSON object");
  FT_CHECK(config.contains("model_type") && config["model_type"].is_string(), source,
           ": missing required field \"model_type\" (expected a string such as \"llama\")");
  ModelConfig result;
  result.model_type = config["model_type"].get<std::string>();
  model_family(result.model_type, source).read_config(config, result, source);
  read_quantization_config(config, result, source);
  return result;
}

ModelConfig read_model_config(const std::string& path) {
  std::ifstream file = open_input_file(path, "model config (an HF config.json)");
  std::stringstream text;
  text << file.rdbuf();
  return parse_model_config(text.str(), path);
}

std::unique_ptr<LanguageModel> make_language_model(const ModelConfig& config, Backend& backend,
                                                   const ModelOptions& options) {
  const ModelFamily& family = model_family(config.model_type);
  ModelOptions built = options;
  if (built.lora && built.lora->target_modules.empty() && built.lora->target_modules_regex.empty())
    built.lora->target_modules = family.default_lora_targets;
  return family.build(config, backend, built);
}

std::unique_ptr<CausalLM> make_causal_lm(const ModelConfig& config, Backend& backend, const ModelOptions& options) {
  const ModelKind causal = ModelKind::causal;
  const ModelFamily* family = find_model_family(config.model_type);
  FT_CHECK(!family || family->kind == causal, "model_type \"", config.model_type,
           "\" is an encoder-decoder model; this needs a decoder-only one (",
           supported_model_types(&causal), ")");
  FT_CHECK(family, unsupported(config.model_type, &causal));
  std::unique_ptr<LanguageModel> model = make_language_model(config, backend, options);
  CausalLM* causal_lm = model->as_causal_lm();
  model.release();
  return std::unique_ptr<CausalLM>(causal_lm);
}

}  // namespace ft
