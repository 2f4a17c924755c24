// The FT_*_ENGINE environment variables: whether a vendor library's kernel
// may run where the build and the GPU have it (auto, the default) or ours
// alone (ours). Plain C++.
#pragma once
#include <cstdlib>
#include <string>

#include "kernels/error.h"

namespace ft::cuda {

// False where `variable` says ours; throws on a value other than auto or
// ours. auto_means: what auto picks, for the message.
inline bool library_engine_wanted(const char* variable, const char* auto_means) {
  const char* engine = std::getenv(variable);
  if (engine == nullptr || std::string(engine) == "auto") return true;
  FT_CHECK(std::string(engine) == "ours", variable, " is '", engine, "'; expected 'auto' (", auto_means,
           ") or 'ours'");
  return false;
}

}  // namespace ft::cuda
