#include "model/model_config.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <type_traits>

#include "kernels/error.h"
#include "kernels/input_file.h"
#include "model/json_input.h"

namespace ft {
namespace {

using nlohmann::json;

int64_t required_int(const json& config, const char* field, const std::string& source) {
  FT_CHECK(config.contains(field), source, ": missing required field \"", field, "\" (expected a positive integer)");
  const json& value = config[field];
  // Unsigned first: get<int64_t> of a number above INT64_MAX would wrap.
  FT_CHECK(value.is_number_unsigned() && value.get<uint64_t>() - 1 < uint64_t(kMaxModelConfigInt), source,
           ": field \"", field, "\" must be a positive integer at most ", kMaxModelConfigInt, ", got ", value.dump());
  return value.get<int64_t>();
}

// nlohmann's get<T> converts between numbers and booleans silently (true -> 1,
// 2.5 -> 2), so the JSON type is checked before converting.
template <class T>
const char* expected_type() {
  if constexpr (std::is_same_v<T, bool>) return "a boolean";
  else if constexpr (std::is_same_v<T, std::string>) return "a string";
  else if constexpr (std::is_integral_v<T>) return "an integer of magnitude at most 2^24";
  else return "a finite number";
}

// Besides the type, integers must lie in [-kMaxModelConfigInt,
// kMaxModelConfigInt] and floats must be finite in T (a double above
// FLT_MAX converted to float is undefined behaviour).
template <class T>
bool holds(const json& value) {
  if constexpr (std::is_same_v<T, bool>) return value.is_boolean();
  else if constexpr (std::is_same_v<T, std::string>) return value.is_string();
  else if constexpr (std::is_integral_v<T>)
    return value.is_number_unsigned() ? value.get<uint64_t>() <= uint64_t(kMaxModelConfigInt)
                                      : value.is_number_integer() && value.get<int64_t>() >= -kMaxModelConfigInt;
  else return value.is_number() && std::abs(value.get<double>()) <= double(std::numeric_limits<T>::max());
}

template <class T>
T optional_value(const json& config, const char* field, T fallback, const std::string& source) {
  if (!config.contains(field) || config[field].is_null()) return fallback;
  FT_CHECK(holds<T>(config[field]), source, ": field \"", field, "\" has the wrong type or range (expected ", expected_type<T>(),
           "), got ", config[field].dump());
  return config[field].get<T>();
}

// A positive finite number rope.<field> (required), for messages named key.field.
double rope_number(const json& rope, const std::string& key, const char* field, const std::string& source) {
  const std::string name = key + "." + field;
  FT_CHECK(rope.contains(field) && !rope[field].is_null(), source, ": ", name, " is required for rope_type \"",
           rope.value("rope_type", rope.value("type", "")), "\" (expected a positive number)");
  const double value = optional_value<double>(rope, field, 0.0, source);
  FT_CHECK(value > 0.0, source, ": ", name, " must be positive, got ", value);
  return value;
}

// Rotary settings, in every spelling a released config.json uses (as
// transformers 5.23's convert_rope_params_to_dict / standardize_rope_params
// read them): transformers 5 writes {"rope_parameters": {"rope_type", "rope_theta",
// scaling fields, "partial_rotary_factor"}}; transformers 4 wrote a top-level
// rope_theta and {"rope_scaling": {"rope_type" or, older, "type", scaling
// fields}}. A non-empty rope_scaling wins over rope_parameters, rope_type
// over type, and the dict's rope_theta over the top-level one.
void read_rope(const json& config, ModelConfig& result, const std::string& source) {
  auto given = [&](const char* key) {
    return config.contains(key) && !config[key].is_null() && !(config[key].is_object() && config[key].empty());
  };
  const std::string key = given("rope_scaling") ? "rope_scaling" : "rope_parameters";
  if (!given(key.c_str())) return;
  const json& rope = config[key];
  FT_CHECK(rope.is_object(), source, ": field \"", key, "\" must be an object, got ", rope.dump());
  std::string type = optional_value<std::string>(rope, "type", "default", source);
  type = optional_value<std::string>(rope, "rope_type", type, source);
  FT_CHECK(type == "default" || type == "linear" || type == "dynamic" || type == "llama3", source, ": ", key,
           ".rope_type \"", type, "\" is not supported (expected \"default\", \"linear\", \"dynamic\" or \"llama3\")");
  result.rope_theta = optional_value<float>(rope, "rope_theta", result.rope_theta, source);
  result.rotary_pct = optional_value<double>(rope, "partial_rotary_factor", result.rotary_pct, source);
  RopeScaling& scaling = result.rope_scaling;
  scaling.type = type;
  if (type == "default") return;
  scaling.factor = rope_number(rope, key, "factor", source);
  if (type != "llama3") return;
  scaling.low_freq_factor = rope_number(rope, key, "low_freq_factor", source);
  scaling.high_freq_factor = rope_number(rope, key, "high_freq_factor", source);
  FT_CHECK(scaling.high_freq_factor > scaling.low_freq_factor, source, ": ", key, ".high_freq_factor (",
           scaling.high_freq_factor, ") must exceed low_freq_factor (", scaling.low_freq_factor, ")");
  // A top-level original_max_position_embeddings wins (Phi-3 style), then the
  // dict's, then max_position_embeddings.
  scaling.original_max_position_embeddings = optional_value<int64_t>(
      rope, "original_max_position_embeddings", result.max_position_embeddings, source);
  scaling.original_max_position_embeddings = optional_value<int64_t>(
      config, "original_max_position_embeddings", scaling.original_max_position_embeddings, source);
  FT_CHECK(scaling.original_max_position_embeddings > 0, source, ": ", key,
           ".original_max_position_embeddings must be positive, got ", scaling.original_max_position_embeddings);
}

// Architecture options of the Llama-family layer: biases and Mistral's window.
void read_llama_variant(const json& config, ModelConfig& result, const std::string& source) {
  if (result.model_type == "llama") {
    result.attention_bias = optional_value<bool>(config, "attention_bias", false, source);
    result.o_proj_bias = result.attention_bias;
    result.mlp_bias = optional_value<bool>(config, "mlp_bias", false, source);
  } else if (result.model_type == "qwen2") {
    // Qwen2Attention: q/k/v always with bias, o_proj and the MLP without.
    result.attention_bias = true;
    // With use_sliding_window, layers from max_window_layers on attend within
    // a window of their own; we refuse such a config rather than run those
    // layers as full attention (released Qwen2/2.5 checkpoints set it false).
    FT_CHECK(!optional_value<bool>(config, "use_sliding_window", false, source), source,
             ": use_sliding_window true is not supported for qwen2 (expected false)");
  } else {  // mistral: no biases, every layer in the window (null: none)
    result.sliding_window = optional_value<int64_t>(config, "sliding_window", 0, source);
    const bool given = config.contains("sliding_window") && !config["sliding_window"].is_null();
    FT_CHECK(!given || result.sliding_window > 0, source, ": sliding_window must be a positive integer or null, got ",
             result.sliding_window);
  }
}

void read_llama_fields(const json& config, ModelConfig& result, const std::string& source) {
  result.num_key_value_heads =
      optional_value<int64_t>(config, "num_key_value_heads", result.num_attention_heads, source);
  // Only a derived head_dim needs hidden_size to split evenly; an explicit one may not (e.g. Gemma).
  bool explicit_head_dim = config.contains("head_dim") && !config["head_dim"].is_null();
  FT_CHECK(explicit_head_dim || result.hidden_size % result.num_attention_heads == 0, source,
           ": hidden_size (", result.hidden_size, ") must be a multiple of num_attention_heads (",
           result.num_attention_heads, ") when head_dim is not given");
  result.head_dim =
      optional_value<int64_t>(config, "head_dim", result.hidden_size / result.num_attention_heads, source);
  result.rms_norm_eps = optional_value<float>(config, "rms_norm_eps", result.rms_norm_eps, source);
  result.rope_theta = optional_value<float>(config, "rope_theta", result.rope_theta, source);
  read_rope(config, result, source);
  read_llama_variant(config, result, source);
  result.hidden_act = optional_value<std::string>(config, "hidden_act", result.hidden_act, source);
  FT_CHECK(result.hidden_act == "silu", source, ": hidden_act \"", result.hidden_act,
           "\" is not supported for ", result.model_type, " (expected \"silu\")");
  FT_CHECK(result.rotary_pct == 1.0, source, ": rope_parameters.partial_rotary_factor ", result.rotary_pct,
           " is not supported for ", result.model_type, " (expected 1)");
}

// GPT-NeoX (transformers' GPTNeoXConfig): head_dim is always hidden_size /
// num_attention_heads; checkpoints from transformers 4 carry rotary_pct and
// rotary_emb_base at the top level, transformers 5 writes rope_parameters.
void read_gpt_neox_fields(const json& config, ModelConfig& result, const std::string& source) {
  FT_CHECK(result.hidden_size % result.num_attention_heads == 0, source, ": hidden_size (", result.hidden_size,
           ") must be a multiple of num_attention_heads (", result.num_attention_heads, ")");
  result.num_key_value_heads = result.num_attention_heads;
  result.head_dim = result.hidden_size / result.num_attention_heads;
  result.rotary_pct = optional_value<double>(config, "rotary_pct", 0.25, source);
  result.rope_theta = optional_value<float>(config, "rotary_emb_base", result.rope_theta, source);
  read_rope(config, result, source);
  result.layer_norm_eps = optional_value<float>(config, "layer_norm_eps", result.layer_norm_eps, source);
  result.use_parallel_residual = optional_value<bool>(config, "use_parallel_residual", true, source);
  result.attention_bias = optional_value<bool>(config, "attention_bias", true, source);
  result.hidden_act = optional_value<std::string>(config, "hidden_act", "gelu", source);
  const std::string& act = result.hidden_act;
  FT_CHECK(act == "gelu" || act == "gelu_new" || act == "gelu_fast" || act == "gelu_pytorch_tanh", source,
           ": hidden_act \"", act, "\" is not supported for gpt_neox (expected \"gelu\", \"gelu_new\", "
           "\"gelu_fast\" or \"gelu_pytorch_tanh\")");
  FT_CHECK(result.rotary_pct > 0.0 && result.rotary_pct <= 1.0 && result.rotary_dim() % 2 == 0 &&
               result.rotary_dim() > 0,
           source, ": rotary_pct ", result.rotary_pct, " must give an even, positive number of rotary features ",
           "per head (head_dim ", result.head_dim, " * rotary_pct = ", double(result.head_dim) * result.rotary_pct, ")");
  FT_CHECK(result.layer_norm_eps > 0, source, ": layer_norm_eps must be positive, got ", result.layer_norm_eps);
}

// T5 (transformers' T5Config) under its own field names. tie_word_embeddings
// defaults to true as in T5Config, and when true the decoder output is scaled
// by d_model^-0.5 before the shared lm_head (v1.0); v1.1 and FLAN-T5 write
// false and carry their own lm_head. dropout_rate is not applied: no dropout
// runs in the base model, only LoRA's.
void read_t5_fields(const json& config, ModelConfig& result, const std::string& source) {
  result.hidden_size = required_int(config, "d_model", source);
  result.intermediate_size = required_int(config, "d_ff", source);
  result.num_hidden_layers = required_int(config, "num_layers", source);
  result.num_decoder_layers =
      config.contains("num_decoder_layers") && !config["num_decoder_layers"].is_null()
          ? required_int(config, "num_decoder_layers", source)
          : result.num_hidden_layers;
  result.num_attention_heads = required_int(config, "num_heads", source);
  result.num_key_value_heads = result.num_attention_heads;
  result.head_dim = required_int(config, "d_kv", source);
  result.vocab_size = required_int(config, "vocab_size", source);
  result.relative_attention_num_buckets = optional_value<int64_t>(config, "relative_attention_num_buckets", 32, source);
  result.relative_attention_max_distance =
      optional_value<int64_t>(config, "relative_attention_max_distance", 128, source);
  FT_CHECK(result.relative_attention_num_buckets >= 4 && result.relative_attention_max_distance > 0, source,
           ": relative_attention_num_buckets must be at least 4 and relative_attention_max_distance positive, got ",
           result.relative_attention_num_buckets, " and ", result.relative_attention_max_distance);
  result.rms_norm_eps = optional_value<float>(config, "layer_norm_epsilon", 1e-6f, source);
  FT_CHECK(result.rms_norm_eps > 0, source, ": layer_norm_epsilon must be positive, got ", result.rms_norm_eps);
  const std::string ffn = optional_value<std::string>(config, "feed_forward_proj", "relu", source);
  FT_CHECK(ffn == "relu" || ffn == "gated-gelu", source, ": feed_forward_proj \"", ffn,
           "\" is not supported for t5 (expected \"relu\" or \"gated-gelu\")");
  result.gated_ffn = ffn == "gated-gelu";
  result.hidden_act = ffn == "relu" ? "relu" : "gelu_new";
  // transformers 5 writes tie_word_embeddings true for every T5 (it ties a
  // head only when the checkpoint has none of its own) and keeps v1.0's
  // scaled, shared head as scale_decoder_outputs; v1.1 heads are untied.
  result.tie_word_embeddings = optional_value<bool>(config, "tie_word_embeddings", true, source);
  result.tie_word_embeddings =
      optional_value<bool>(config, "scale_decoder_outputs", result.tie_word_embeddings, source);
  // T5's checkpoints set decoder_start_token_id to pad_token_id (0); an
  // absent one falls back to pad_token_id, as T5's documentation describes.
  const int64_t pad = optional_value<int64_t>(config, "pad_token_id", 0, source);
  result.decoder_start_token_id = optional_value<int64_t>(config, "decoder_start_token_id", pad, source);
  FT_CHECK(result.decoder_start_token_id >= 0 && result.decoder_start_token_id < result.vocab_size, source,
           ": decoder_start_token_id ", result.decoder_start_token_id, " is outside the vocabulary [0, ",
           result.vocab_size, ")");
}

}  // namespace

ModelConfig ModelConfig::from_json_text(const std::string& text, const std::string& source) {
  json config = parse_json(text, source);
  FT_CHECK(config.is_object(), source, ": expected a JSON object");
  FT_CHECK(config.contains("model_type") && config["model_type"].is_string(), source,
           ": missing required field \"model_type\" (expected a string such as \"llama\")");
  ModelConfig result;
  result.model_type = config["model_type"].get<std::string>();
  const std::string& type = result.model_type;
  FT_CHECK(type == "llama" || type == "qwen2" || type == "mistral" || type == "gpt_neox" || type == "t5", source,
           ": model_type \"", type, "\" is not supported (", kSupportedModelTypes, ")");
  if (type == "t5") {
    read_t5_fields(config, result, source);
    return result;
  }
  result.hidden_size = required_int(config, "hidden_size", source);
  result.intermediate_size = required_int(config, "intermediate_size", source);
  result.num_hidden_layers = required_int(config, "num_hidden_layers", source);
  result.num_attention_heads = required_int(config, "num_attention_heads", source);
  result.vocab_size = required_int(config, "vocab_size", source);
  result.max_position_embeddings =
      optional_value<int64_t>(config, "max_position_embeddings", result.max_position_embeddings, source);
  result.initializer_range = optional_value<float>(config, "initializer_range", result.initializer_range, source);
  result.tie_word_embeddings = optional_value<bool>(config, "tie_word_embeddings", false, source);
  if (result.model_type == "gpt_neox")
    read_gpt_neox_fields(config, result, source);
  else
    read_llama_fields(config, result, source);

  FT_CHECK(result.num_key_value_heads > 0 && result.num_attention_heads % result.num_key_value_heads == 0, source,
           ": num_attention_heads (", result.num_attention_heads, ") must be a multiple of num_key_value_heads (",
           result.num_key_value_heads, ")");
  FT_CHECK(result.head_dim > 0 && result.head_dim % 2 == 0, source, ": head_dim must be a positive even number, got ",
           result.head_dim);
  FT_CHECK(result.max_position_embeddings > 0, source, ": max_position_embeddings must be positive, got ",
           result.max_position_embeddings);
  FT_CHECK(result.rms_norm_eps > 0 && result.rope_theta > 0, source,
           ": rms_norm_eps and rope_theta must be positive, got ", result.rms_norm_eps, " and ", result.rope_theta);
  FT_CHECK(result.rope_scaling.type != "dynamic" || result.rotary_dim() > 2, source,
           ": rope_type \"dynamic\" needs more than 2 rotary features per head, got ", result.rotary_dim());
  return result;
}

ModelConfig ModelConfig::from_json_file(const std::string& path) {
  std::ifstream file = open_input_file(path, "model config (an HF config.json)");
  std::stringstream text;
  text << file.rdbuf();
  return from_json_text(text.str(), path);
}

}  // namespace ft
