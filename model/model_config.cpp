#include "model/model_config.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "kernels/error.h"
#include "model/json_input.h"

namespace ft {

using nlohmann::json;

int64_t required_int(const json& config, const char* field, const std::string& source) {
  FT_CHECK(config.contains(field), source, ": missing required field \"", field, "\" (expected a positive integer)");
  const json& value = config[field];
  // Unsigned first: get<int64_t> of a number above INT64_MAX would wrap.
  FT_CHECK(value.is_number_unsigned() && value.get<uint64_t>() - 1 < uint64_t(kMaxModelConfigInt), source,
           ": field \"", field, "\" must be a positive integer at most ", kMaxModelConfigInt, ", got ", value.dump());
  return value.get<int64_t>();
}

namespace {

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

}  // namespace

template <class T>
T optional_value(const json& config, const char* field, T fallback, const std::string& source) {
  if (!config.contains(field) || config[field].is_null()) return fallback;
  FT_CHECK(holds<T>(config[field]), source, ": field \"", field, "\" has the wrong type or range (expected ", expected_type<T>(),
           "), got ", config[field].dump());
  return config[field].get<T>();
}

template bool optional_value<bool>(const json&, const char*, bool, const std::string&);
template int64_t optional_value<int64_t>(const json&, const char*, int64_t, const std::string&);
template float optional_value<float>(const json&, const char*, float, const std::string&);
template double optional_value<double>(const json&, const char*, double, const std::string&);
template std::string optional_value<std::string>(const json&, const char*, std::string, const std::string&);

namespace {

// A positive finite number rope.<field> (required), for messages named key.field.
double rope_number(const json& rope, const std::string& key, const char* field, const std::string& source) {
  const std::string name = key + "." + field;
  FT_CHECK(rope.contains(field) && !rope[field].is_null(), source, ": ", name, " is required for rope_type \"",
           rope.value("rope_type", rope.value("type", "")), "\" (expected a positive number)");
  const double value = optional_value<double>(rope, field, 0.0, source);
  FT_CHECK(value > 0.0, source, ": ", name, " must be positive, got ", value);
  return value;
}

}  // namespace

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
  const char* type_key = rope.contains("rope_type") ? "rope_type" : "type";  // the key the file spells
  FT_CHECK(type == "default" || type == "linear" || type == "dynamic" || type == "llama3", source, ": ", key, ".",
           type_key, " \"", type, "\" is not supported (expected \"default\", \"linear\", \"dynamic\" or \"llama3\")");
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

void read_decoder_fields(const json& config, ModelConfig& result, const std::string& source) {
  result.hidden_size = required_int(config, "hidden_size", source);
  result.intermediate_size = required_int(config, "intermediate_size", source);
  result.num_hidden_layers = required_int(config, "num_hidden_layers", source);
  result.num_attention_heads = required_int(config, "num_attention_heads", source);
  result.vocab_size = required_int(config, "vocab_size", source);
  result.max_position_embeddings =
      optional_value<int64_t>(config, "max_position_embeddings", result.max_position_embeddings, source);
  result.initializer_range = optional_value<float>(config, "initializer_range", result.initializer_range, source);
  result.tie_word_embeddings = optional_value<bool>(config, "tie_word_embeddings", false, source);
}

void check_decoder_fields(const ModelConfig& result, const std::string& source) {
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
}

void read_quantization_config(const json& config, ModelConfig& result, const std::string& source) {
  if (!config.contains("quantization_config") || config["quantization_config"].is_null()) return;
  const json& q = config["quantization_config"];
  const std::string where = source + ": quantization_config";
  FT_CHECK(q.is_object(), where, " must be an object, got ", q.dump());
  const std::string method = optional_value<std::string>(q, "quant_method", "", where);
  FT_CHECK(method == "bitsandbytes", where, ".quant_method ", method.empty() ? "is missing" : "\"" + method + "\"",
           ": only \"bitsandbytes\" checkpoints (8-bit, or 4-bit nf4) load quantised; give the 16-bit checkpoint "
           "and set quantization.mode");
  const bool int8 = optional_value<bool>(q, "load_in_8bit", false, where);
  const bool nf4 = optional_value<bool>(q, "load_in_4bit", false, where);
  FT_CHECK(int8 != nf4, where, " has load_in_8bit ", int8 ? "true" : "false", " and load_in_4bit ",
           nf4 ? "true" : "false", ": exactly one must be true");
  StoredQuantization& stored = result.stored_quantization;
  stored.source = source;
  if (int8) {
    // true keeps 16-bit weights beside the codes (bitsandbytes' training mode), which it does not save as codes.
    FT_CHECK(!optional_value<bool>(q, "llm_int8_has_fp16_weight", false, where), where,
             ".llm_int8_has_fp16_weight: true is not supported (supported: false, int8 codes with row scales)");
    stored.format = QuantizedBase::int8;
    return;
  }
  // Absent fields take BitsAndBytesConfig's defaults, as transformers reads them.
  const std::string type = optional_value<std::string>(q, "bnb_4bit_quant_type", "fp4", where);
  FT_CHECK(type == "nf4", where, ".bnb_4bit_quant_type \"", type, "\" is not supported (supported: \"nf4\")");
  const std::string storage = optional_value<std::string>(q, "bnb_4bit_quant_storage", "uint8", where);
  FT_CHECK(storage == "uint8", where, ".bnb_4bit_quant_storage \"", storage,
           "\" is not supported (supported: \"uint8\", two 4-bit codes a byte)");
  stored.format = QuantizedBase::nf4;
  stored.double_quant = optional_value<bool>(q, "bnb_4bit_use_double_quant", false, where);
}

json config_saved_as(const std::string& path, DType dtype) {
  json config = read_json_object(path, "a Hugging Face config.json");
  bool named = false;
  for (const char* key : {"torch_dtype", "dtype"})
    if (config.contains(key)) config[key] = torch_dtype_name(dtype), named = true;
  if (!named) config["torch_dtype"] = torch_dtype_name(dtype);
  return config;
}

}  // namespace ft
