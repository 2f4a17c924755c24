#include "model/model_config.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <type_traits>

#include "kernels/error.h"

namespace ft {
namespace {

using nlohmann::json;

int64_t required_int(const json& config, const char* field, const std::string& source) {
  FT_CHECK(config.contains(field), source, ": missing required field \"", field, "\" (expected a positive integer)");
  FT_CHECK(config[field].is_number_integer() && config[field].get<int64_t>() > 0, source, ": field \"", field,
           "\" must be a positive integer, got ", config[field].dump());
  return config[field].get<int64_t>();
}

// nlohmann's get<T> converts between numbers and booleans silently (true -> 1,
// 2.5 -> 2), so the JSON type is checked before converting.
template <class T>
const char* expected_type() {
  if constexpr (std::is_same_v<T, bool>) return "a boolean";
  else if constexpr (std::is_same_v<T, std::string>) return "a string";
  else if constexpr (std::is_integral_v<T>) return "an integer";
  else return "a number";
}

template <class T>
bool holds(const json& value) {
  if constexpr (std::is_same_v<T, bool>) return value.is_boolean();
  else if constexpr (std::is_same_v<T, std::string>) return value.is_string();
  else if constexpr (std::is_integral_v<T>) return value.is_number_integer();
  else return value.is_number();
}

template <class T>
T optional_value(const json& config, const char* field, T fallback, const std::string& source) {
  if (!config.contains(field) || config[field].is_null()) return fallback;
  FT_CHECK(holds<T>(config[field]), source, ": field \"", field, "\" has the wrong type (expected ", expected_type<T>(),
           "), got ", config[field].dump());
  return config[field].get<T>();
}

}  // namespace

ModelConfig ModelConfig::from_json_text(const std::string& text, const std::string& source) {
  json config;
  try {
    config = json::parse(text);
  } catch (const json::parse_error& error) {
    fail(source, ": not valid JSON: ", error.what());
  }
  FT_CHECK(config.is_object(), source, ": expected a JSON object");
  FT_CHECK(config.contains("model_type") && config["model_type"].is_string(), source,
           ": missing required field \"model_type\" (expected a string such as \"llama\")");
  ModelConfig result;
  result.model_type = config["model_type"].get<std::string>();
  FT_CHECK(result.model_type == "llama", source, ": model_type \"", result.model_type,
           "\" is not supported (expected \"llama\")");
  result.hidden_size = required_int(config, "hidden_size", source);
  result.intermediate_size = required_int(config, "intermediate_size", source);
  result.num_hidden_layers = required_int(config, "num_hidden_layers", source);
  result.num_attention_heads = required_int(config, "num_attention_heads", source);
  result.vocab_size = required_int(config, "vocab_size", source);
  result.num_key_value_heads =
      optional_value<int64_t>(config, "num_key_value_heads", result.num_attention_heads, source);
  // Only a derived head_dim needs hidden_size to split evenly; an explicit one may not (e.g. Gemma).
  bool explicit_head_dim = config.contains("head_dim") && !config["head_dim"].is_null();
  FT_CHECK(explicit_head_dim || result.hidden_size % result.num_attention_heads == 0, source,
           ": hidden_size (", result.hidden_size, ") must be a multiple of num_attention_heads (",
           result.num_attention_heads, ") when head_dim is not given");
  result.head_dim =
      optional_value<int64_t>(config, "head_dim", result.hidden_size / result.num_attention_heads, source);
  result.max_position_embeddings =
      optional_value<int64_t>(config, "max_position_embeddings", result.max_position_embeddings, source);
  result.rms_norm_eps = optional_value<float>(config, "rms_norm_eps", result.rms_norm_eps, source);
  result.rope_theta = optional_value<float>(config, "rope_theta", result.rope_theta, source);
  // transformers >= 5 writes {"rope_parameters": {"rope_theta": ..., "rope_type": "default"}}
  // instead of a top-level rope_theta.
  if (config.contains("rope_parameters") && !config["rope_parameters"].is_null()) {
    const json& rope = config["rope_parameters"];
    FT_CHECK(rope.is_object(), source, ": field \"rope_parameters\" must be an object, got ", rope.dump());
    const std::string rope_type = optional_value<std::string>(rope, "rope_type", "default", source);
    FT_CHECK(rope_type == "default", source, ": rope_parameters.rope_type \"", rope_type,
             "\" is not supported yet (expected \"default\")");
    result.rope_theta = optional_value<float>(rope, "rope_theta", result.rope_theta, source);
  }
  result.initializer_range = optional_value<float>(config, "initializer_range", result.initializer_range, source);
  result.tie_word_embeddings = optional_value<bool>(config, "tie_word_embeddings", false, source);
  result.attention_bias = optional_value<bool>(config, "attention_bias", false, source);
  result.mlp_bias = optional_value<bool>(config, "mlp_bias", false, source);
  result.hidden_act = optional_value<std::string>(config, "hidden_act", result.hidden_act, source);

  FT_CHECK(result.num_key_value_heads > 0 && result.num_attention_heads % result.num_key_value_heads == 0, source,
           ": num_attention_heads (", result.num_attention_heads, ") must be a multiple of num_key_value_heads (",
           result.num_key_value_heads, ")");
  FT_CHECK(result.head_dim > 0 && result.head_dim % 2 == 0, source, ": head_dim must be a positive even number, got ",
           result.head_dim);
  FT_CHECK(result.max_position_embeddings > 0, source, ": max_position_embeddings must be positive, got ",
           result.max_position_embeddings);
  FT_CHECK(result.rms_norm_eps > 0 && result.rope_theta > 0, source,
           ": rms_norm_eps and rope_theta must be positive, got ", result.rms_norm_eps, " and ", result.rope_theta);
  FT_CHECK(result.hidden_act == "silu", source, ": hidden_act \"", result.hidden_act,
           "\" is not supported for llama (expected \"silu\")");
  FT_CHECK(!config.contains("rope_scaling") || config["rope_scaling"].is_null(), source,
           ": field \"rope_scaling\" is not supported yet (expected null)");
  return result;
}

ModelConfig ModelConfig::from_json_file(const std::string& path) {
  std::ifstream file(path);
  FT_CHECK(file, path, ": cannot open model config (expected an HF config.json)");
  std::stringstream text;
  text << file.rdbuf();
  return from_json_text(text.str(), path);
}

}  // namespace ft
