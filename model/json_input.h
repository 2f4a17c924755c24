// Parsing JSON from files the user supplies (config.json, safetensors
// headers, adapter_config.json, JSONL rows). nlohmann's own messages name
// neither the file nor the key, and a number outside double's range (1e999)
// is a separate exception type from a syntax error; here both become one
// ft::Error naming `where` (a file, or file:line) and, for an out-of-range
// number, the key it belongs to.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace ft {

nlohmann::json parse_json(std::string_view text, const std::string& where);

// The JSON object in the file at path; `expected` names the file the user
// should have given (e.g. "a PEFT adapter_config.json") when it cannot be opened.
nlohmann::json read_json_object(const std::string& path, const std::string& expected);
// The same with its objects' keys in the file's order (nlohmann::json sorts
// them): for a field whose order means something, as PEFT's rank_pattern.
nlohmann::ordered_json read_ordered_json_object(const std::string& path, const std::string& expected);

}  // namespace ft
