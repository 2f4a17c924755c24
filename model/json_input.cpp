#include "model/json_input.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "kernels/error.h"
#include "kernels/input_file.h"

namespace ft {
namespace {

// nlohmann's message without its "[json.exception.parse_error.101] parse
// error at line 1, column 5: " prefix (the position is given our way).
std::string reason(const std::string& what) {
  const size_t column = what.find("column ");
  const size_t colon = what.find(": ", column == std::string::npos ? 0 : column);
  if (what.starts_with("[json.exception.") && colon != std::string::npos) return what.substr(colon + 2);
  const size_t tag = what.find("] ");
  return what.starts_with("[json.exception.") && tag != std::string::npos ? what.substr(tag + 2) : what;
}

// Bytes outside printable ASCII as \xHH: a Latin-1 or binary file's bytes
// would otherwise reach the terminal raw.
std::string printable(const std::string& text) {
  std::string out;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7F) {
      out += c;
    } else {
      char escaped[5];
      std::snprintf(escaped, sizeof escaped, "\\x%02X", byte);
      out += escaped;
    }
  }
  return out;
}

// "at column C" within one line, else "at line L, column C" (byte is 1-based).
std::string position(std::string_view text, size_t byte) {
  const size_t at = std::min(byte > 0 ? byte - 1 : 0, text.size());
  const size_t line_start = text.rfind('\n', at == 0 ? 0 : at - 1);
  const size_t lines = size_t(std::count(text.begin(), text.begin() + at, '\n'));
  const size_t column = at - (line_start == std::string_view::npos ? 0 : line_start + 1) + 1;
  return lines == 0 ? "at column " + std::to_string(column)
                    : "at line " + std::to_string(lines + 1) + ", column " + std::to_string(column);
}

}  // namespace

nlohmann::json parse_json(std::string_view text, const std::string& where) {
  using nlohmann::json;
  // The parser reports only a byte position; remembering the last key it
  // passed lets an out-of-range number be named by its field.
  std::string last_key;
  json::parser_callback_t remember_key = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && parsed.is_string()) last_key = parsed.get<std::string>();
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), remember_key);
  } catch (const json::out_of_range& error) {
    fail(where, ": number out of range", last_key.empty() ? std::string() : " in field \"" + last_key + "\"",
         " (expected a finite number within double's range): ", error.what());
  } catch (const json::parse_error& error) {
    fail(where, ": not valid JSON ", position(text, error.byte), ": ", printable(reason(error.what())));
  } catch (const json::exception& error) {
    fail(where, ": not valid JSON: ", printable(reason(error.what())));
  }
}

nlohmann::json read_json_object(const std::string& path, const std::string& expected) {
  std::ifstream file = open_input_file(path, expected);
  std::stringstream text;
  text << file.rdbuf();
  nlohmann::json value = parse_json(text.str(), path);
  FT_CHECK(value.is_object(), path, ": expected a JSON object");
  return value;
}

}  // namespace ft
