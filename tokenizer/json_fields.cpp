#include "tokenizer/json_fields.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "kernels/error.h"
#include "kernels/input_file.h"
#include "tokenizer/unicode.h"

namespace ft::json_fields {

void unsupported(const std::string& source, const std::string& field, const json& value, const std::string& expected) {
  fail(source, ": ", field, " is ", value.dump(), "; ", expected);
}

json read_json_file(const std::string& path) {
  std::ifstream file = open_input_file(path, "tokenizer file");
  try {
    return json::parse(file);
  } catch (const json::exception& e) {
    fail(path, ": not valid JSON (", e.what(), ")");
  }
}

json read_tokenizer_config(const std::string& folder) {
  const std::filesystem::path config_path = std::filesystem::path(folder) / "tokenizer_config.json";
  const std::filesystem::path map_path = std::filesystem::path(folder) / "special_tokens_map.json";
  json config = std::filesystem::exists(config_path) ? read_json_file(config_path.string()) : json();
  if ((config.is_object() && config.contains("added_tokens_decoder")) || !std::filesystem::exists(map_path))
    return config;
  const json map = read_json_file(map_path.string());
  FT_CHECK(map.is_object(), map_path.string(), ": expected a JSON object of special tokens, got ", map.type_name());
  if (!config.is_object()) config = json::object();
  for (const auto& [key, value] : map.items()) config[key] = value;
  return config;
}

const json& required(const json& object, const char* key, const std::string& source, const std::string& field) {
  FT_CHECK(object.is_object() && object.contains(key), source, ": ", field, " is missing");
  return object.at(key);
}

bool flag(const json& object, const char* key, bool fallback, const std::string& source, const std::string& field) {
  if (!object.contains(key) || object.at(key).is_null()) return fallback;
  const json& value = object.at(key);
  if (!value.is_boolean()) unsupported(source, field, value, "expected true or false");
  return value.get<bool>();
}

std::string string_field(const json& object, const char* key, const std::string& source, const std::string& field) {
  const json& value = required(object, key, source, field);
  if (!value.is_string()) unsupported(source, field, value, "expected a string");
  return value.get<std::string>();
}

char32_t char_field(const json& object, const char* key, const std::string& source, const std::string& field) {
  std::u32string chars = unicode::decode_utf8(string_field(object, key, source, field), source + ": " + field);
  if (chars.size() != 1) unsupported(source, field, object.at(key), "expected a single character");
  return chars[0];
}

int64_t count_field(const json& object, const char* key, int64_t fallback, int64_t limit, const std::string& source,
                    const std::string& field) {
  if (!object.contains(key)) return fallback;
  const json& value = object.at(key);
  if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() >= limit)
    unsupported(source, field, value, "expected an integer from 0 to " + std::to_string(limit - 1));
  return value.get<int64_t>();
}

std::string stage_type(const json& stage, std::initializer_list<std::string_view> allowed, const std::string& source,
                       const std::string& field) {
  std::string expected = "supported:";
  for (std::string_view a : allowed) expected.append(" \"").append(a).append("\"");
  if (!stage.is_object() || !stage.contains("type") || !stage.at("type").is_string())
    unsupported(source, field, stage, "expected an object with a \"type\"; " + expected);
  std::string type = stage.at("type").get<std::string>();
  if (std::find(allowed.begin(), allowed.end(), type) == allowed.end())
    unsupported(source, field + ".type", stage.at("type"), expected);
  return type;
}

}  // namespace ft::json_fields
