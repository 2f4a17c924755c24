#include "trainer/data/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace ft::jinja {

const Value* Args::get(size_t index, const char* name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [key, value] : keywords)
    if (key == name) return &value;
  return nullptr;
}

Value Value::undefined(std::string what) {
  Value value;
  value.name = std::move(what);
  return value;
}

Value Value::function(std::string name, Function function) {
  Value value;
  value.kind = Kind::callable;
  value.call = std::make_shared<Function>(std::move(function));
  value.name = std::move(name);
  return value;
}

const std::string& Value::str() const {
  if (!is_string()) throw TemplateFault("expected a string, got " + type_name(*this));
  return data.get_ref<const std::string&>();
}

int64_t Value::integer() const {
  if (kind == Kind::data && data.is_boolean()) return data.get<bool>();
  if (kind != Kind::data || !data.is_number_integer()) throw TemplateFault("expected an integer, got " + type_name(*this));
  return data.get<int64_t>();
}

double Value::number() const {
  if (kind == Kind::data && data.is_boolean()) return data.get<bool>();
  if (!is_number()) throw TemplateFault("expected a number, got " + type_name(*this));
  return data.get<double>();
}

bool truthy(const Value& value) {
  switch (value.kind) {
    case Value::Kind::undefined:
      return false;
    case Value::Kind::ns:
    case Value::Kind::callable:
      return true;
    case Value::Kind::data:
      break;
  }
  const Json& d = value.data;
  if (d.is_null()) return false;
  if (d.is_boolean()) return d.get<bool>();
  if (d.is_number_float()) return d.get<double>() != 0.0;
  if (d.is_number()) return d.get<int64_t>() != 0;
  if (d.is_string()) return !d.get_ref<const std::string&>().empty();
  return !d.empty();
}

namespace {

// float.__repr__: the shortest text that reads back the same, with ".0" on
// integral values and Python's exponent form (1e-05, 1e+16).
std::string python_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buffer[64];
  int exponent = x == 0 ? 0 : int(std::floor(std::log10(std::fabs(x))));
  std::to_chars_result r = exponent < -4 || exponent >= 16
                               ? std::to_chars(buffer, buffer + sizeof buffer, x, std::chars_format::scientific)
                               : std::to_chars(buffer, buffer + sizeof buffer, x, std::chars_format::fixed);
  std::string text(buffer, r.ptr);
  size_t e = text.find('e');
  if (e == std::string::npos) return text.find('.') == std::string::npos ? text + ".0" : text;
  // to_chars writes e-05 / e+16 as Python does; keep the mantissa as it is.
  return text;
}

void append_json_string(std::string& out, const std::string& text) {
  out += '"';
  for (unsigned char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
          out += escaped;
        } else {
          out += char(c);
        }
    }
  }
  out += '"';
}

std::string scalar_text(const Json& d, bool python) {
  if (d.is_null()) return python ? "None" : "null";
  if (d.is_boolean()) return d.get<bool>() ? (python ? "True" : "true") : (python ? "False" : "false");
  if (d.is_number_float()) return python_float(d.get<double>());
  if (d.is_number_unsigned()) return std::to_string(d.get<uint64_t>());
  return std::to_string(d.get<int64_t>());
}

void dump_json(std::string& out, const Json& d, int indent, bool sort_keys, int depth) {
  if (d.is_string()) return append_json_string(out, d.get_ref<const std::string&>());
  if (!d.is_array() && !d.is_object()) {
    out += scalar_text(d, false);
    return;
  }
  const bool object = d.is_object();
  if (d.empty()) {
    out += object ? "{}" : "[]";
    return;
  }
  std::vector<std::pair<std::string, const Json*>> items;
  if (object)
    for (auto it = d.begin(); it != d.end(); ++it) items.push_back({it.key(), &it.value()});
  else
    for (const Json& item : d) items.push_back({"", &item});
  if (object && sort_keys) std::stable_sort(items.begin(), items.end(), [](auto& a, auto& b) { return a.first < b.first; });
  const std::string newline = indent >= 0 ? "\n" + std::string(size_t(indent) * (depth + 1), ' ') : "";
  out += object ? '{' : '[';
  for (size_t i = 0; i < items.size(); i++) {
    if (i > 0) out += indent >= 0 ? "," : ", ";
    out += newline;
    if (object) {
      append_json_string(out, items[i].first);
      out += ": ";
    }
    dump_json(out, *items[i].second, indent, sort_keys, depth + 1);
  }
  if (indent >= 0) out += "\n" + std::string(size_t(indent) * depth, ' ');
  out += object ? '}' : ']';
}

// repr(str): single quotes unless the text holds ' and no ".
void append_repr_string(std::string& out, const std::string& text) {
  const char quote = text.find('\'') != std::string::npos && text.find('"') == std::string::npos ? '"' : '\'';
  out += quote;
  for (unsigned char c : text) {
    if (c == '\\') out += "\\\\";
    else if (c == quote) out += std::string("\\") + char(c);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", c);
      out += escaped;
    } else {
      out += char(c);
    }
  }
  out += quote;
}

void dump_repr(std::string& out, const Json& d) {
  if (d.is_string()) return append_repr_string(out, d.get_ref<const std::string&>());
  if (d.is_array()) {
    out += '[';
    for (size_t i = 0; i < d.size(); i++) {
      if (i > 0) out += ", ";
      dump_repr(out, d[i]);
    }
    out += ']';
    return;
  }
  if (d.is_object()) {
    out += '{';
    bool first = true;
    for (auto it = d.begin(); it != d.end(); ++it) {
      if (!first) out += ", ";
      first = false;
      append_repr_string(out, it.key());
      out += ": ";
      dump_repr(out, it.value());
    }
    out += '}';
    return;
  }
  out += scalar_text(d, true);
}

}  // namespace

std::string python_repr(const Json& data) {
  std::string out;
  dump_repr(out, data);
  return out;
}

std::string python_json(const Json& data, int indent, bool sort_keys) {
  std::string out;
  dump_json(out, data, indent, sort_keys, 0);
  return out;
}

std::string to_str(const Value& value) {
  switch (value.kind) {
    case Value::Kind::undefined:
      return "";
    case Value::Kind::ns:
      return "<Namespace " + python_repr(*value.ns) + ">";
    case Value::Kind::callable:
      return "<function " + value.name + ">";
    case Value::Kind::data:
      break;
  }
  if (value.data.is_string()) return value.data.get<std::string>();
  return python_repr(value.data);
}

std::string type_name(const Value& value) {
  switch (value.kind) {
    case Value::Kind::undefined:
      return value.name.empty() ? "undefined" : "undefined (" + value.name + ")";
    case Value::Kind::ns:
      return "namespace";
    case Value::Kind::callable:
      return "function";
    case Value::Kind::data:
      break;
  }
  const Json& d = value.data;
  if (d.is_null()) return "None";
  if (d.is_boolean()) return "bool";
  if (d.is_number_float()) return "float";
  if (d.is_number()) return "int";
  if (d.is_string()) return "str";
  return d.is_array() ? "list" : "dict";
}

bool equal(const Value& a, const Value& b) {
  if (a.kind != Value::Kind::data || b.kind != Value::Kind::data) {
    if (a.kind == Value::Kind::ns && b.kind == Value::Kind::ns) return a.ns == b.ns;
    return a.kind == b.kind && a.kind == Value::Kind::undefined;
  }
  const bool a_number = a.data.is_number() || a.data.is_boolean(), b_number = b.data.is_number() || b.data.is_boolean();
  if (a_number && b_number) return a.number() == b.number();
  return a.data == b.data;
}

bool less(const Value& a, const Value& b) {
  const bool a_number = a.kind == Value::Kind::data && (a.data.is_number() || a.data.is_boolean());
  const bool b_number = b.kind == Value::Kind::data && (b.data.is_number() || b.data.is_boolean());
  if (a_number && b_number) return a.number() < b.number();
  if (a.is_string() && b.is_string()) return a.str() < b.str();
  if (a.is_list() && b.is_list()) {
    for (size_t i = 0; i < a.data.size() && i < b.data.size(); i++) {
      if (less(Value(a.data[i]), Value(b.data[i]))) return true;
      if (less(Value(b.data[i]), Value(a.data[i]))) return false;
    }
    return a.data.size() < b.data.size();
  }
  throw TemplateFault("'<' is not supported between " + type_name(a) + " and " + type_name(b));
}

std::vector<std::string> code_points(const std::string& text) {
  std::vector<std::string> out;
  for (size_t i = 0; i < text.size();) {
    unsigned char c = text[i];
    size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    out.push_back(text.substr(i, n));
    i += n;
  }
  return out;
}

bool python_index(int64_t size, int64_t& index) {
  if (index < 0) index += size;
  return index >= 0 && index < size;
}

}  // namespace ft::jinja
