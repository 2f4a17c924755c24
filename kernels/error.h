// One error type for everything the user can cause (bad files, bad configs,
// shape mismatches). The entry point catches it, prints it and exits non-zero.
#pragma once
#include <sstream>
#include <stdexcept>

namespace ft {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::ostringstream message;
  (message << ... << parts);
  throw Error(message.str());
}

}  // namespace ft

#define FT_CHECK(cond, ...)                  \
  do {                                       \
    if (!(cond)) ::ft::fail(__VA_ARGS__);    \
  } while (0)
