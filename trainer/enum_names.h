// The spellings of an enum, written once in one table: parsing (the YAML
// config, the command line), printing and the "expected one of ..." messages
// all read it, so they cannot drift apart.
//
// An enum's own table is an overload of enum_names(), declared in the header
// that needs the spelling and found by argument-dependent lookup:
//   EnumNames<Schedule> enum_names(Schedule);  // {"constant", Schedule::constant}, ...
// A command-line flag with spellings of its own (merge --dtype) keeps a table
// of its own and passes it.
#pragma once
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

namespace ft {

template <class E>
struct EnumName {
  const char* name;
  E value;
};

template <class E>
using EnumNames = std::span<const EnumName<E>>;

// value's spelling in its enum's own table; "?" for a value outside it.
template <class E>
const char* enum_name(E value) {
  for (const EnumName<E>& entry : enum_names(E{}))
    if (entry.value == value) return entry.name;
  return "?";
}

// The value spelled text, if names has it.
template <class E>
std::optional<E> enum_value(std::string_view text, EnumNames<E> names) {
  for (const EnumName<E>& entry : names)
    if (text == entry.name) return entry.value;
  return std::nullopt;
}

// Every spelling in table order, for messages ("sft, dpo") and usage lines
// ("sft|dpo"). except (if any) is left out: a message that asks for a
// concrete choice leaves out auto.
template <class E>
std::string enum_spellings(EnumNames<E> names, const char* separator = ", ",
                           std::type_identity_t<std::optional<E>> except = std::nullopt) {
  std::string list;
  for (const EnumName<E>& entry : names)
    if (entry.value != except) list += (list.empty() ? "" : separator) + std::string(entry.name);
  return list;
}

}  // namespace ft
