// The subcommands' options (CLI11) whose values this trainer's own parsers
// read, so that a bad value is one line naming the option and what it expects,
// in the config's words: `--top-k: expected an integer in [0, 2147483648], got "-1"`.
#pragma once
#include <CLI/CLI.hpp>
#include <charconv>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/error.h"
#include "trainer/enum_names.h"

namespace ft {

// text as a Number in [lo, hi] (an integer when Number is one), read whole by
// std::from_chars: no hex, no octal, no trailing junk.
template <class Number>
Number number_in(const std::string& text, Number lo, Number hi) {
  Number value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  FT_CHECK(error == std::errc() && end == text.data() + text.size() && value >= lo && value <= hi, "expected ",
           std::is_integral_v<Number> ? "an integer" : "a number", " in [", lo, ", ", hi, "], got \"", text, "\"");
  return value;
}

// The value names spells text.
template <class E>
E choice_in(const std::string& text, EnumNames<E> names) {
  const std::optional<E> value = enum_value(text, names);
  FT_CHECK(value, "expected one of ", enum_spellings(names), ", got \"", text, "\"");
  return *value;
}

// A repeatable option: each occurrence takes one value (`--set a=1 --set
// b=2`), never the words after it (a positional CONFIG).
inline CLI::Option* add_repeated_option(CLI::App& app, const std::string& name, std::vector<std::string>& values,
                                        const std::string& help) {
  return app.add_option(name, values, help)
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

// The option `name`, its text read by parse into target. An Error from parse
// becomes CLI11's ValidationError, which puts the option's name before it.
template <class T, class Parse>
CLI::Option* add_parsed_option(CLI::App& app, const std::string& name, T& target, Parse parse,
                               const std::string& help) {
  auto read = [name, &target, parse](const std::string& text) {
    try {
      target = parse(text);
    } catch (const Error& error) {
      throw CLI::ValidationError(name, error.what());
    }
  };
  return app.add_option_function<std::string>(name, read, help);
}

template <class Number>
CLI::Option* add_number_option(CLI::App& app, const std::string& name, Number& target, Number lo, Number hi,
                               const std::string& help) {
  auto parse = [lo, hi](const std::string& text) { return number_in(text, lo, hi); };
  return add_parsed_option(app, name, target, parse, help)->type_name(std::is_integral_v<Number> ? "INT" : "NUMBER");
}

// An option spelled as names says (an enum's own table: enum_names(E{})).
// target is an E, or a std::optional<E> that stays empty unless given.
template <class T, class E>
CLI::Option* add_choice_option(CLI::App& app, const std::string& name, T& target, EnumNames<E> names,
                               const std::string& help) {
  auto parse = [names](const std::string& text) { return choice_in(text, names); };
  return add_parsed_option(app, name, target, parse, help)->type_name(enum_spellings(names, "|"));
}

}  // namespace ft
