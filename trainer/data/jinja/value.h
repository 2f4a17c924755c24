// The values a chat template computes with, as Jinja2 (Python) sees them:
// JSON data (None, bool, int, float, str, list, dict in insertion order),
// Undefined (a missing variable, attribute or item), namespace() objects whose
// attributes `set` can change, and callables (macros, globals).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace ft::jinja {

using Json = nlohmann::ordered_json;  // Python dicts keep insertion order, and tojson writes it

// A mistake a template makes at run time (the renderer adds the file and line).
struct TemplateFault : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Value;

// Arguments of a call, filter or test: positional, then name=value.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;
  // The argument at `index`, or the keyword `name`, or null when absent.
  const Value* get(size_t index, const char* name) const;
};

using Function = std::function<Value(const Args&)>;

struct Value {
  enum class Kind { undefined, data, ns, callable };
  Kind kind = Kind::undefined;
  Json data;                         // Kind::data
  std::shared_ptr<Json> ns;          // Kind::ns: an object shared by every copy, as Python objects are
  std::shared_ptr<Function> call;    // Kind::callable
  std::string name;                  // Kind::undefined: what was looked up; Kind::callable: its name

  Value() = default;
  Value(Json json) : kind(Kind::data), data(std::move(json)) {}
  static Value undefined(std::string what);
  static Value function(std::string name, Function function);

  bool is_defined() const { return kind != Kind::undefined; }
  bool is_string() const { return kind == Kind::data && data.is_string(); }
  bool is_list() const { return kind == Kind::data && data.is_array(); }
  bool is_dict() const { return kind == Kind::data && data.is_object(); }
  bool is_number() const { return kind == Kind::data && data.is_number(); }
  bool is_none() const { return kind == Kind::data && data.is_null(); }
  const std::string& str() const;  // the string; a TemplateFault for any other value
  int64_t integer() const;         // an int or bool; a TemplateFault otherwise
  double number() const;           // an int, float or bool as double
};

// Python's bool(value): empty strings, lists and dicts, 0, None and Undefined are false.
bool truthy(const Value& value);
// Python's str(value) (Undefined prints nothing); repr for lists and dicts.
std::string to_str(const Value& value);
// Python's repr of data: 'text', True, None, [1, 'a'], {'k': 1.5}.
std::string python_repr(const Json& data);
// json.dumps(data, ensure_ascii=False, indent=indent, sort_keys=sort_keys)
// (indent < 0: one line, ", " and ": " separators).
std::string python_json(const Json& data, int indent, bool sort_keys);
// Python's ==, and < for numbers, strings and lists.
bool equal(const Value& a, const Value& b);
bool less(const Value& a, const Value& b);
// Python's type name for messages: str, int, list, dict, undefined, ...
std::string type_name(const Value& value);

// Strings as Python indexes them: by code point.
std::vector<std::string> code_points(const std::string& text);
// Python's sequence[index] with negative indices; false when out of range.
bool python_index(int64_t size, int64_t& index);

}  // namespace ft::jinja
