#include "model/json_input.h"

#include <fstream>
#include <sstream>

#include "kernels/error.h"
#include "kernels/input_file.h"

namespace ft {

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
  } catch (const json::exception& error) {
    fail(where, ": not valid JSON (", error.what(), ")");
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
