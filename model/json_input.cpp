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

namespace {

template <class Json>
Json parse_as(std::string_view text, const std::string& where) {
  // The parser reports only a byte position; remembering the last key it
  // passed lets an out-of-range number be named by its field.
  std::string last_key;
  typename Json::parser_callback_t remember_key = [&](int, typename Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::key && parsed.is_string()) last_key = parsed.template get<std::string>();
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), remember_key);
  } catch (const typename Json::out_of_range& error) {
    fail(where, ": number out of range", last_key.empty() ? std::string() : " in field \"" + last_key + "\"",
         " (expected a finite number within double's range): ", error.what());
  } catch (const typename Json::parse_error& error) {
    fail(where, ": not valid JSON ", position(text, error.byte), ": ", printable(reason(error.what())));
  } catch (const typename Json::exception& error) {
    fail(where, ": not valid JSON: ", printable(reason(error.what())));
  }
}

template <class Json>
Json read_object(const std::string& path, const std::string& expected) {
  std::ifstream file = open_input_file(path, expected);
  std::stringstream text;
  text << file.rdbuf();
  Json value = parse_as<Json>(text.str(), path);
  FT_CHECK(value.is_object(), path, ": expected a JSON object");
  return value;
}

}  // namespace

nlohmann::json parse_json(std::string_view text, const std::string& where) {
  return parse_as<nlohmann::json>(text, where);
}

nlohmann::json read_json_object(const std::string& path, const std::string& expected) {
  return read_object<nlohmann::json>(path, expected);
}

nlohmann::ordered_json read_ordered_json_object(const std::string& path, const std::string& expected) {
  return read_object<nlohmann::ordered_json>(path, expected);
}

}  // namespace ft
