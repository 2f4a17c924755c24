// Reading the fields of a tokenizer.json: every error names the file, the field (a JSON path
// such as "pre_tokenizer.pretokenizers[1].behavior"), the value found and what is supported.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace ft::json_fields {

using nlohmann::json;

[[noreturn]] void unsupported(const std::string& source, const std::string& field, const json& value,
                              const std::string& expected);
const json& required(const json& object, const char* key, const std::string& source, const std::string& field);
// An optional boolean; `fallback` when absent or null.
bool flag(const json& object, const char* key, bool fallback, const std::string& source, const std::string& field);
std::string string_field(const json& object, const char* key, const std::string& source, const std::string& field);
// A string of exactly one character (Rust's `char` fields: replacement, content), as UTF-32.
char32_t char_field(const json& object, const char* key, const std::string& source, const std::string& field);
// An optional non-negative integer below `limit`; `fallback` when absent.
int64_t count_field(const json& object, const char* key, int64_t fallback, int64_t limit, const std::string& source,
                    const std::string& field);
// The JSON in the file at path; an Error naming it when it cannot be opened or parsed.
json read_json_file(const std::string& path);
// A model folder's tokenizer_config.json (null when absent), with
// special_tokens_map.json's entries over it when the config has no
// added_tokens_decoder: how transformers' from_pretrained reads an older
// checkpoint's special tokens (bos_token, eos_token, ...).
json read_tokenizer_config(const std::string& folder);
// The "type" of a pipeline stage (field names the stage), refused unless one of `allowed`.
std::string stage_type(const json& stage, std::initializer_list<std::string_view> allowed, const std::string& source,
                       const std::string& field);

}  // namespace ft::json_fields
