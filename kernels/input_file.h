// Opening a file the user named, for reading: one error naming the path and
// what was expected there. std::ifstream opens a directory on Linux and then
// reads it as empty (or throws from deep inside the stream), so a folder
// where a file belongs would surface as a parse error about nothing.
#pragma once
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "kernels/error.h"

namespace ft {

// path opened for reading, or ft::Error "PATH: is a directory, expected WHAT"
// / "PATH: cannot open WHAT".
inline std::ifstream open_input_file(const std::filesystem::path& path, const std::string& what,
                                     std::ios::openmode mode = std::ios::in) {
  std::error_code error;
  FT_CHECK(!std::filesystem::is_directory(path, error), path.string(), ": is a directory, expected ", what);
  std::ifstream file(path, mode);
  FT_CHECK(file.good(), path.string(), ": cannot open ", what);
  return file;
}

}  // namespace ft
