#include "trainer/data/jinja/builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

namespace ft::jinja {
namespace {

const char* kPythonSpace = " \t\n\r\v\f";

std::string strip_chars(const std::string& text, const Value* chars, bool left, bool right) {
  const std::string set = chars && chars->is_string() ? chars->str() : kPythonSpace;
  size_t begin = 0, end = text.size();
  if (left) begin = text.find_first_not_of(set);
  if (begin == std::string::npos) return "";
  if (right) end = text.find_last_not_of(set) + 1;
  return text.substr(begin, end - begin);
}

std::string replace_all(std::string text, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) throw TemplateFault("replace() of an empty string is not supported");
  for (size_t at = text.find(from); at != std::string::npos && count != 0; at = text.find(from, at + to.size()), count--)
    text.replace(at, from.size(), to);
  return text;
}

Json split(const std::string& text, const Value* separator, int64_t max_split) {
  Json parts = Json::array();
  if (!separator || separator->is_none()) {  // runs of whitespace, no empty parts
    size_t at = text.find_first_not_of(kPythonSpace);
    while (at != std::string::npos) {
      size_t end = text.find_first_of(kPythonSpace, at);
      if (max_split >= 0 && int64_t(parts.size()) == max_split) end = std::string::npos;
      parts.push_back(text.substr(at, end == std::string::npos ? std::string::npos : end - at));
      at = end == std::string::npos ? end : text.find_first_not_of(kPythonSpace, end);
    }
    return parts;
  }
  const std::string& sep = separator->str();
  if (sep.empty()) throw TemplateFault("split() with an empty separator");
  size_t at = 0;
  for (size_t found = text.find(sep); found != std::string::npos && (max_split < 0 || int64_t(parts.size()) < max_split);
       found = text.find(sep, at)) {
    parts.push_back(text.substr(at, found - at));
    at = found + sep.size();
  }
  parts.push_back(text.substr(at));
  return parts;
}

std::string change_case(std::string text, int (*convert)(int)) {
  for (char& c : text)
    if ((unsigned char)c < 0x80) c = char(convert((unsigned char)c));
  return text;
}

std::string capitalize(const std::string& text) {
  std::string out = change_case(text, [](int c) { return std::tolower(c); });
  if (!out.empty() && (unsigned char)out[0] < 0x80) out[0] = char(std::toupper((unsigned char)out[0]));
  return out;
}

std::string title(const std::string& text) {
  std::string out = text;
  bool start = true;
  for (char& c : out) {
    unsigned char u = c;
    if (u < 0x80 && std::isalpha(u)) {
      c = char(start ? std::toupper(u) : std::tolower(u));
      start = false;
    } else {
      start = u < 0x80;  // a non-letter ASCII character starts a new word
    }
  }
  return out;
}

bool matches_prefix(const Value& text, const Value& prefix, bool at_end) {
  std::vector<Value> options = prefix.is_list() ? iterate(prefix) : std::vector<Value>{prefix};
  for (const Value& option : options)
    if (at_end ? text.str().ends_with(option.str()) : text.str().starts_with(option.str())) return true;
  return false;
}

int64_t length(const Value& value) {
  if (!value.is_defined()) return 0;  // Jinja2's Undefined has len() 0
  if (value.is_string()) return int64_t(code_points(value.str()).size());
  if (value.is_list() || value.is_dict()) return int64_t(value.data.size());
  if (value.kind == Value::Kind::ns) return int64_t(value.ns->size());
  throw TemplateFault("object of type " + type_name(value) + " has no len()");
}

Json as_list(const Value& value) {
  Json out = Json::array();
  for (const Value& item : iterate(value)) out.push_back(item.data);
  return out;
}

// attribute="a.b" or an index: Jinja2's make_attrgetter.
Value attribute_path(const Value& item, const Value& attribute) {
  if (attribute.is_number()) return get_item(item, attribute);
  Value out = item;
  const std::string& path = attribute.str();
  for (size_t at = 0; at <= path.size();) {
    size_t dot = path.find('.', at);
    if (dot == std::string::npos) dot = path.size();
    out = get_item(out, Value(Json(path.substr(at, dot - at))));
    at = dot + 1;
  }
  return out;
}

// select/reject(test, args...) and selectattr/rejectattr(attribute, test, args...).
Value select(const Value& input, const Args& args, bool by_attribute, bool keep) {
  Json out = Json::array();
  const size_t first_test_arg = by_attribute ? 1 : 0;
  Args test_args;
  for (size_t i = first_test_arg + 1; i < args.positional.size(); i++) test_args.positional.push_back(args.positional[i]);
  for (const Value& item : iterate(input)) {
    Value subject = by_attribute ? attribute_path(item, args.positional.at(0)) : item;
    bool passed = args.positional.size() > first_test_arg
                      ? apply_test(args.positional[first_test_arg].str(), subject, test_args)
                      : truthy(subject);
    if (passed == keep) out.push_back(item.data);
  }
  return Value(out);
}

Value tojson(const Value& input, const Args& args) {
  if (input.kind == Value::Kind::undefined) throw TemplateFault("tojson of an undefined value (" + input.name + ")");
  const Value* indent = args.get(0, "indent");
  const Value* sort_keys = args.get(99, "sort_keys");
  const Value* separators = args.get(99, "separators");
  if (separators && !separators->is_none()) throw TemplateFault("tojson(separators=...) is not supported");
  const Json& data = input.kind == Value::Kind::ns ? *input.ns : input.data;
  return Value(Json(python_json(data, indent && !indent->is_none() ? int(indent->integer()) : -1,
                                sort_keys && truthy(*sort_keys))));
}

}  // namespace

int64_t bounded_length(int64_t length, const char* what) {
  constexpr int64_t kMaxLength = int64_t(1) << 24;
  if (length > kMaxLength) throw TemplateFault(std::string(what) + " of " + std::to_string(length) + " is over 16 MiB");
  return std::max<int64_t>(length, 0);
}

namespace {

Value indent_filter(const Value& input, const Args& args) {
  const Value* width = args.get(0, "width");
  const Value* first = args.get(1, "first");
  const Value* blank = args.get(2, "blank");
  const std::string pad = width && width->is_string() ? width->str() : std::string(size_t(bounded_length(width ? width->integer() : 4, "an indent")), ' ');
  const std::string& text = input.str();
  std::string out;
  size_t at = 0;
  for (bool first_line = true; at <= text.size(); first_line = false) {
    size_t end = text.find('\n', at);
    std::string line = text.substr(at, end == std::string::npos ? std::string::npos : end - at);
    const bool pad_line = first_line ? (first && truthy(*first)) : (!line.empty() || (blank && truthy(*blank)));
    out += (pad_line ? pad : "") + line;
    if (end == std::string::npos) break;
    out += '\n';
    at = end + 1;
  }
  return Value(Json(out));
}

Value sort_filter(const Value& input, const Args& args) {
  std::vector<Value> items = iterate(input);
  const Value* reverse = args.get(0, "reverse");
  const Value* attribute = args.get(2, "attribute");
  auto key = [&](const Value& v) { return attribute && !attribute->is_none() ? attribute_path(v, *attribute) : v; };
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) { return less(key(a), key(b)); });
  if (reverse && truthy(*reverse)) std::reverse(items.begin(), items.end());
  Json out = Json::array();
  for (const Value& v : items) out.push_back(v.data);
  return Value(out);
}

Value map_filter(const Value& input, const Args& args) {
  Json out = Json::array();
  const Value* attribute = args.get(99, "attribute");
  const Value* fallback = args.get(99, "default");
  for (const Value& item : iterate(input)) {
    if (attribute) {
      Value v = attribute_path(item, *attribute);
      if (!v.is_defined() && fallback) v = *fallback;
      out.push_back(v.data);
      continue;
    }
    Args rest;
    for (size_t i = 1; i < args.positional.size(); i++) rest.positional.push_back(args.positional[i]);
    out.push_back(apply_filter(args.positional.at(0).str(), item, rest).data);
  }
  return Value(out);
}

Value number_filter(const Value& input, bool floating) {
  if (input.is_number() || (input.kind == Value::Kind::data && input.data.is_boolean()))
    return floating ? Value(Json(input.number())) : Value(Json(int64_t(input.number())));
  if (input.is_string()) {
    try {
      return floating ? Value(Json(std::stod(input.str()))) : Value(Json(int64_t(std::stoll(input.str()))));
    } catch (const std::exception&) {
    }
  }
  return floating ? Value(Json(0.0)) : Value(Json(int64_t(0)));
}

// Python's str.center(width): the extra space on the right when odd, unless width is odd too.
std::string center(const std::string& text, int64_t width) {
  bounded_length(width, "a center width");
  const int64_t margin = width - int64_t(code_points(text).size());
  if (margin <= 0) return text;
  const int64_t left = margin / 2 + (margin & width & 1);
  return std::string(size_t(left), ' ') + text + std::string(size_t(margin - left), ' ');
}

// One %-conversion of Python's printf-style formatting: flags, width and
// precision as written, type one of s r a d i u f F e E g G x X o c.
struct Conversion {
  std::string flags;
  int64_t width = -1, precision = -1;
  char type = 's';
};

std::string pad_text(std::string text, const Conversion& c) {
  if (c.precision >= 0) {
    std::vector<std::string> chars = code_points(text);
    if (int64_t(chars.size()) > c.precision) {
      text.clear();
      for (int64_t i = 0; i < c.precision; i++) text += chars[size_t(i)];
    }
  }
  const int64_t fill = c.width - int64_t(code_points(text).size());
  if (fill <= 0) return text;
  const std::string spaces(size_t(fill), ' ');
  return c.flags.find('-') != std::string::npos ? text + spaces : spaces + text;
}

std::string convert(const Conversion& c, const Value& v) {
  if (c.type == 's' || c.type == 'r' || c.type == 'a')
    return pad_text(c.type == 's' ? to_str(v) : python_repr(v.data), c);
  const bool numeric = v.is_number() || (v.kind == Value::Kind::data && v.data.is_boolean());
  if (c.type == 'c') {
    if (v.is_string() && code_points(v.str()).size() == 1) return pad_text(v.str(), c);
    throw TemplateFault("%c requires an int or a single character, got " + type_name(v));
  }
  if (!numeric)
    throw TemplateFault(std::string("%") + c.type + " format: a real number is required, not " + type_name(v));
  std::string spec = "%" + c.flags;
  if (c.width >= 0) spec += std::to_string(c.width);
  if (c.precision >= 0) spec += "." + std::to_string(c.precision);
  const bool integer = std::string("diuxXo").find(c.type) != std::string::npos;
  spec += integer ? std::string("ll") + (c.type == 'i' || c.type == 'u' ? 'd' : c.type) : std::string(1, c.type);
  const double real = v.number();
  if (integer && !v.data.is_number_integer() && !(std::fabs(real) < 9.2e18))
    throw TemplateFault(std::string("%") + c.type + " format: " + python_repr(v.data) + " is out of range here");
  const long long whole = v.data.is_number_integer() ? (long long)(v.integer()) : (long long)(real);
  auto print = [&](char* buffer, size_t size) {
    return integer ? std::snprintf(buffer, size, spec.c_str(), whole)
                   : std::snprintf(buffer, size, spec.c_str(), real);
  };
  std::string out(size_t(bounded_length(print(nullptr, 0), "a formatted number")), '\0');
  print(out.data(), out.size() + 1);
  return out;
}

}  // namespace

Value percent_format(const Value& format, const Value& args) {
  const std::string& text = format.str();
  std::vector<Value> values;
  if (args.is_list()) values = iterate(args);  // a tuple (Jinja's tuples are lists here)
  else if (!args.is_dict()) values.push_back(args);
  size_t next_value = 0;
  std::string out;
  for (size_t i = 0; i < text.size(); i++) {
    if (text[i] != '%') {
      out += text[i];
      continue;
    }
    if (++i >= text.size()) throw TemplateFault("incomplete format");
    Conversion c;
    const Value* value = nullptr;
    Value keyed;
    if (text[i] == '(') {
      const size_t close = text.find(')', i);
      if (close == std::string::npos) throw TemplateFault("incomplete format key");
      if (!args.is_dict()) throw TemplateFault("format requires a mapping");
      keyed = get_item(args, Value(Json(text.substr(i + 1, close - i - 1))));
      if (!keyed.is_defined()) throw TemplateFault("format key '" + text.substr(i + 1, close - i - 1) + "' missing");
      value = &keyed;
      i = close + 1;
    }
    while (i < text.size() && std::string("-+ #0").find(text[i]) != std::string::npos) c.flags += text[i++];
    auto number = [&] {
      if (i < text.size() && text[i] == '*') throw TemplateFault("unsupported construct: '*' width in a % format");
      int64_t n = -1;
      while (i < text.size() && std::isdigit((unsigned char)text[i]))
        n = bounded_length(std::max<int64_t>(n, 0) * 10 + (text[i++] - '0'), "a % format width or precision");
      return n;
    };
    c.width = number();
    if (i < text.size() && text[i] == '.') i++, c.precision = std::max<int64_t>(number(), 0);
    if (i >= text.size()) throw TemplateFault("incomplete format");
    c.type = text[i];
    if (c.type == '%') {
      out += '%';
      continue;
    }
    if (std::string("sradiufFeEgGxXoc").find(c.type) == std::string::npos)
      throw TemplateFault(std::string("unsupported format character '") + c.type + "'");
    if (!value) {
      if (next_value >= values.size()) throw TemplateFault("not enough arguments for format string");
      value = &values[next_value++];
    }
    out += convert(c, *value);
  }
  if (next_value < values.size()) throw TemplateFault("not all arguments converted during string formatting");
  return Value(Json(out));
}

std::vector<Value> iterate(const Value& value) {
  std::vector<Value> items;
  if (!value.is_defined()) return items;  // Jinja2's Undefined iterates as empty
  if (value.is_list()) {
    for (const Json& item : value.data) items.push_back(Value(item));
  } else if (value.is_dict()) {
    for (auto it = value.data.begin(); it != value.data.end(); ++it) items.push_back(Value(Json(it.key())));
  } else if (value.is_string()) {
    for (std::string& c : code_points(value.str())) items.push_back(Value(Json(std::move(c))));
  } else if (value.kind == Value::Kind::ns) {
    for (auto it = value.ns->begin(); it != value.ns->end(); ++it) items.push_back(Value(Json(it.key())));
  } else {
    throw TemplateFault("'" + type_name(value) + "' object is not iterable");
  }
  return items;
}

Value get_item(const Value& object, const Value& key) {
  if (object.kind == Value::Kind::undefined)
    throw TemplateFault("'" + object.name + "' is undefined (looked up " + to_str(key) + " in it)");
  const std::string what = object.name.empty() ? type_name(object) : object.name;
  if ((object.is_dict() || object.kind == Value::Kind::ns) && key.is_string()) {
    const Json& dict = object.is_dict() ? object.data : *object.ns;
    auto it = dict.find(key.str());
    return it == dict.end() ? Value::undefined(type_name(object) + " has no key '" + key.str() + "'") : Value(*it);
  }
  if ((object.is_list() || object.is_string()) && key.kind == Value::Kind::data && key.data.is_number_integer()) {
    int64_t index = key.integer();
    if (object.is_list()) {
      if (!python_index(int64_t(object.data.size()), index)) return Value::undefined("list index out of range");
      return Value(object.data[size_t(index)]);
    }
    std::vector<std::string> chars = code_points(object.str());
    if (!python_index(int64_t(chars.size()), index)) return Value::undefined("string index out of range");
    return Value(Json(chars[size_t(index)]));
  }
  return Value::undefined(what + " has no item " + to_str(key));
}

Value get_attribute(const Value& object, const std::string& name) {
  if (object.kind == Value::Kind::undefined)
    throw TemplateFault("'" + object.name + "' is undefined (looked up ." + name + " in it)");
  return get_item(object, Value(Json(name)));
}

Value get_slice(const Value& object, const Value& start_value, const Value& stop_value, const Value& step_value) {
  const bool is_string = object.is_string();
  if (!is_string && !object.is_list()) throw TemplateFault("cannot slice a " + type_name(object));
  std::vector<std::string> chars = is_string ? code_points(object.str()) : std::vector<std::string>{};
  const int64_t size = is_string ? int64_t(chars.size()) : int64_t(object.data.size());
  const int64_t step = step_value.is_defined() && !step_value.is_none() ? step_value.integer() : 1;
  if (step == 0) throw TemplateFault("slice step cannot be zero");
  // Python's slice.indices().
  auto bound = [&](const Value& v, int64_t fallback) {
    if (!v.is_defined() || v.is_none()) return fallback;
    int64_t i = v.integer();
    if (i < 0) i += size;
    return step > 0 ? std::clamp<int64_t>(i, 0, size) : std::clamp<int64_t>(i, -1, size - 1);
  };
  const int64_t start = bound(start_value, step > 0 ? 0 : size - 1), stop = bound(stop_value, step > 0 ? size : -1);
  std::string text;
  Json list = Json::array();
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (is_string) text += chars[size_t(i)];
    else list.push_back(object.data[size_t(i)]);
  }
  return is_string ? Value(Json(text)) : Value(list);
}

Value call_method(const Value& object, const std::string& name, const Args& args) {
  const Value* a0 = args.get(0, "");
  const Value* a1 = args.get(1, "");
  auto need = [&](const Value* arg) -> const Value& {
    if (!arg) throw TemplateFault("method ." + name + "() of a " + type_name(object) + " is missing an argument");
    return *arg;
  };
  if (object.is_string()) {
    const std::string& text = object.str();
    if (name == "strip") return Value(Json(strip_chars(text, a0, true, true)));
    if (name == "lstrip") return Value(Json(strip_chars(text, a0, true, false)));
    if (name == "rstrip") return Value(Json(strip_chars(text, a0, false, true)));
    if (name == "startswith" || name == "endswith") return Value(Json(matches_prefix(object, need(a0), name == "endswith")));
    if (name == "split") {
      const Value* sep = args.get(0, "sep");
      const Value* max_split = args.get(1, "maxsplit");
      return Value(split(text, sep, max_split ? max_split->integer() : -1));
    }
    if (name == "replace") return Value(Json(replace_all(text, need(a0).str(), need(a1).str(), args.get(2, "count") ? args.get(2, "count")->integer() : -1)));
    if (name == "upper") return Value(Json(change_case(text, [](int c) { return std::toupper(c); })));
    if (name == "lower") return Value(Json(change_case(text, [](int c) { return std::tolower(c); })));
    if (name == "title") return Value(Json(title(text)));
    if (name == "center") return Value(Json(center(text, need(a0).integer())));
    if (name == "capitalize") return Value(Json(capitalize(text)));
    if (name == "find") {
      size_t at = text.find(need(a0).str());
      return Value(Json(at == std::string::npos ? int64_t(-1) : int64_t(code_points(text.substr(0, at)).size())));
    }
    if (name == "count") {
      int64_t n = 0;
      for (size_t at = text.find(need(a0).str()); at != std::string::npos && !need(a0).str().empty(); at = text.find(need(a0).str(), at + need(a0).str().size())) n++;
      return Value(Json(n));
    }
    if (name == "join") {
      std::string out;
      bool first = true;
      for (const Value& item : iterate(need(a0))) {
        if (!first) out += text;
        first = false;
        out += item.str();
      }
      return Value(Json(out));
    }
  }
  if (object.is_dict()) {
    if (name == "items") return apply_filter("items", object, {});
    if (name == "keys") return Value(as_list(object));
    if (name == "values") {
      Json out = Json::array();
      for (auto it = object.data.begin(); it != object.data.end(); ++it) out.push_back(it.value());
      return Value(out);
    }
    if (name == "get") {
      Value found = get_item(object, need(a0));
      return found.is_defined() ? found : a1 ? *a1 : Value(Json(nullptr));
    }
  }
  throw TemplateFault("unsupported construct: method ." + name + "() of a " + type_name(object));
}

namespace {

// Jinja2 3.1's built-in filters and tests, those run here first.
const std::set<std::string> kFilters = {
    "abs",     "capitalize", "center", "count",   "d",      "default",    "dictsort", "first",
    "float",   "format", "indent",    "int",    "items",   "join",   "last",       "length",   "list",
    "lower",   "map",   "max",        "min",    "reject",  "rejectattr", "replace", "reverse", "round",
    "safe",    "select", "selectattr", "sort",  "string",  "sum",    "title",      "tojson",   "trim",
    "unique",  "upper"};
const std::set<std::string> kOtherJinjaFilters = {
    "attr",  "batch", "e",     "escape",   "filesizeformat", "forceescape", "groupby", "pprint", "random",
    "slice", "striptags", "truncate", "urlencode",  "urlize",      "wordcount", "wordwrap", "xmlattr"};
const std::set<std::string> kTests = {
    "boolean", "callable", "defined", "divisibleby", "eq",     "equalto",  "even",     "false",  "float",
    "ge",      "greaterthan", "gt",   "in",          "integer", "iterable", "le",      "lessthan", "lower",
    "lt",      "mapping",  "ne",      "none",        "number", "odd",      "sameas",   "sequence", "string",
    "true",    "undefined", "upper",  "==",          "!=",     "<",        "<=",       ">",      ">="};
const std::set<std::string> kOtherJinjaTests = {"escaped", "filter", "test"};

std::string unknown_name(const char* kind, const std::string& name, const std::set<std::string>& known,
                         const std::set<std::string>& others) {
  if (known.count(name)) return "";
  if (others.count(name)) return std::string("unsupported construct: ") + kind + " '" + name + "'";
  return std::string("no ") + kind + " named '" + name + "' (Jinja2 has none either)";
}

}  // namespace

std::string unknown_filter(const std::string& name) { return unknown_name("filter", name, kFilters, kOtherJinjaFilters); }
std::string unknown_test(const std::string& name) { return unknown_name("test", name, kTests, kOtherJinjaTests); }

bool apply_test(const std::string& name, const Value& v, const Args& args) {
  const bool data = v.kind == Value::Kind::data;
  if (name == "defined") return v.is_defined();
  if (name == "undefined") return !v.is_defined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict() || v.kind == Value::Kind::ns;
  if (name == "iterable") return v.is_string() || v.is_list() || v.is_dict() || v.kind == Value::Kind::ns;
  if (name == "sequence") return v.is_string() || v.is_list() || v.is_dict();
  if (name == "number") return data && (v.data.is_number() || v.data.is_boolean());
  if (name == "integer") return data && v.data.is_number_integer();
  if (name == "float") return data && v.data.is_number_float();
  if (name == "boolean") return data && v.data.is_boolean();
  if (name == "true") return data && v.data.is_boolean() && v.data.get<bool>();
  if (name == "false") return data && v.data.is_boolean() && !v.data.get<bool>();
  if (name == "callable") return v.kind == Value::Kind::callable;
  if (name == "odd") return v.integer() % 2 != 0;
  if (name == "even") return v.integer() % 2 == 0;
  if (name == "divisibleby") return v.integer() % args.positional.at(0).integer() == 0;
  if (name == "lower") return v.is_string() && v.str() == change_case(v.str(), [](int c) { return std::tolower(c); });
  if (name == "upper") return v.is_string() && v.str() == change_case(v.str(), [](int c) { return std::toupper(c); });
  if (args.positional.empty() && (name == "equalto" || name == "eq" || name == "==" || name == "in"))
    throw TemplateFault("test '" + name + "' needs an argument");
  if (name == "equalto" || name == "eq" || name == "==" || name == "sameas") return equal(v, args.positional[0]);
  if (name == "ne" || name == "!=") return !equal(v, args.positional[0]);
  if (name == "lt" || name == "<" || name == "lessthan") return less(v, args.positional.at(0));
  if (name == "gt" || name == ">" || name == "greaterthan") return less(args.positional.at(0), v);
  if (name == "le" || name == "<=") return !less(args.positional.at(0), v);
  if (name == "ge" || name == ">=") return !less(v, args.positional.at(0));
  if (name == "in") {
    const Value& container = args.positional[0];
    if (container.is_string()) return container.str().find(v.str()) != std::string::npos;
    for (const Value& item : iterate(container))
      if (equal(item, v)) return true;
    return false;
  }
  throw TemplateFault(unknown_test(name));
}

Value apply_filter(const std::string& name, const Value& input, const Args& args) {
  const Value* a0 = args.get(0, "");
  if (name == "trim") return Value(Json(strip_chars(to_str(input), args.get(0, "chars"), true, true)));
  if (name == "tojson") return tojson(input, args);
  if (name == "length" || name == "count") return Value(Json(length(input)));
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize")
    return call_method(Value(Json(to_str(input))), name, {});
  if (name == "default" || name == "d") {
    const Value* boolean = args.get(1, "boolean");
    const bool use_default = boolean && truthy(*boolean) ? !truthy(input) : !input.is_defined();
    return use_default ? (a0 ? *a0 : Value(Json(""))) : input;
  }
  if (name == "join") {
    const Value* separator = args.get(0, "d");
    const Value* attribute = args.get(1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& item : iterate(input)) {
      if (!first && separator) out += separator->str();
      first = false;
      out += to_str(attribute ? attribute_path(item, *attribute) : item);
    }
    return Value(Json(out));
  }
  if (name == "selectattr") return select(input, args, true, true);
  if (name == "rejectattr") return select(input, args, true, false);
  if (name == "select") return select(input, args, false, true);
  if (name == "reject") return select(input, args, false, false);
  if (name == "map") return map_filter(input, args);
  if (name == "items") {
    Json out = Json::array();
    if (!input.is_defined()) return Value(out);
    const Json& dict = input.kind == Value::Kind::ns ? *input.ns : input.data;
    if (!dict.is_object()) throw TemplateFault("items of a " + type_name(input) + " (expected a dict)");
    for (auto it = dict.begin(); it != dict.end(); ++it) out.push_back(Json::array({it.key(), it.value()}));
    return Value(out);
  }
  if (name == "list") return Value(as_list(input));
  if (name == "first" || name == "last") {
    std::vector<Value> items = iterate(input);
    if (items.empty()) return Value::undefined("first/last of an empty sequence");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "reverse") {
    if (input.is_string()) {
      std::vector<std::string> chars = code_points(input.str());
      std::string out;
      for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += *it;
      return Value(Json(out));
    }
    Json out = as_list(input);
    std::reverse(out.begin(), out.end());
    return Value(out);
  }
  if (name == "unique") {
    Json out = Json::array();
    for (const Value& item : iterate(input))
      if (std::none_of(out.begin(), out.end(), [&](const Json& seen) { return equal(Value(seen), item); })) out.push_back(item.data);
    return Value(out);
  }
  if (name == "sort") return sort_filter(input, args);
  if (name == "string") return Value(Json(to_str(input)));
  if (name == "safe") return input;
  if (name == "int" || name == "float") return number_filter(input, name == "float");
  if (name == "abs") return input.data.is_number_float() ? Value(Json(std::fabs(input.number()))) : Value(Json(std::abs(input.integer())));
  if (name == "round") {
    const int64_t digits = a0 ? a0->integer() : 0;
    const double scale = std::pow(10.0, double(digits));
    return Value(Json(std::nearbyint(input.number() * scale) / scale));
  }
  if (name == "replace") return call_method(input, "replace", args);
  if (name == "indent") return indent_filter(input, args);
  if (name == "center") return Value(Json(center(to_str(input), a0 ? a0->integer() : 80)));
  if (name == "format") {  // Jinja2's do_format: value % (kwargs or args)
    if (!args.positional.empty() && !args.keywords.empty())
      throw TemplateFault("format takes positional or keyword arguments, not both");
    if (args.keywords.empty()) {
      Json tuple = Json::array();
      for (const Value& value : args.positional) tuple.push_back(value.data);
      return percent_format(Value(Json(to_str(input))), Value(tuple));
    }
    Json mapping = Json::object();
    for (const auto& [key, value] : args.keywords) mapping[key] = value.data;
    return percent_format(Value(Json(to_str(input))), Value(mapping));
  }
  if (name == "sum") {
    Value total(Json(int64_t(0)));
    for (const Value& item : iterate(input))
      total = total.data.is_number_integer() && item.data.is_number_integer() ? Value(Json(total.integer() + item.integer()))
                                                                              : Value(Json(total.number() + item.number()));
    return total;
  }
  if (name == "min" || name == "max") {
    std::vector<Value> items = iterate(input);
    if (items.empty()) return Value::undefined("min/max of an empty sequence");
    auto by = [](const Value& a, const Value& b) { return less(a, b); };
    return name == "min" ? *std::min_element(items.begin(), items.end(), by) : *std::max_element(items.begin(), items.end(), by);
  }
  if (name == "dictsort") {
    Value pairs = apply_filter("items", input, {});
    std::vector<Value> items = iterate(pairs);
    std::stable_sort(items.begin(), items.end(), [](const Value& a, const Value& b) { return less(Value(a.data[0]), Value(b.data[0])); });
    Json out = Json::array();
    for (const Value& item : items) out.push_back(item.data);
    return Value(out);
  }
  throw TemplateFault(unknown_filter(name));
}

}  // namespace ft::jinja
