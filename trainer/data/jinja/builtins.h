// Jinja2's filters and tests, Python's str/dict methods, attribute and item
// lookup, as HF chat templates use them. Each throws a TemplateFault on
// misuse; an unknown name is a TemplateFault naming it.
#pragma once
#include <string>

#include "trainer/data/jinja/value.h"

namespace ft::jinja {

Value apply_filter(const std::string& name, const Value& input, const Args& args);
// Why a filter or test name cannot run, "" when it can: one Jinja2 has that
// is not run here, or one Jinja2 has not either (which Jinja2 refuses when it
// compiles the template). compile() checks every name with these.
std::string unknown_filter(const std::string& name);
std::string unknown_test(const std::string& name);
bool apply_test(const std::string& name, const Value& input, const Args& args);
// object.name(args): str, dict and list methods.
Value call_method(const Value& object, const std::string& name, const Args& args);
// object.name (attribute, else item) and object[key] (item, else attribute), as Jinja2's getattr/getitem.
Value get_attribute(const Value& object, const std::string& name);
Value get_item(const Value& object, const Value& key);
// object[start:stop:step] on a list or str; absent parts are Undefined.
Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step);
// A length a template asks for (a width, a repetition), refused past 16 MiB
// so that a faulty template is an error rather than memory exhausted.
int64_t bounded_length(int64_t length, const char* what);
// Python's `format % args`: args a tuple (a list here), a mapping for
// %(key)s, else the one value; flags, width and precision as printf's.
Value percent_format(const Value& format, const Value& args);
// The items a for loop or a filter walks: list items, dict keys, str characters.
std::vector<Value> iterate(const Value& value);

}  // namespace ft::jinja
