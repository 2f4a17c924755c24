// Shared by the libFuzzer harnesses of tests/fuzz/.
//
// Each harness feeds one input to one reader. An ft::Error is the expected
// answer to bad input and is swallowed; anything else (a crash, a sanitizer
// report, a leak, an exception of another type such as a library's own)
// stops the fuzzer, which keeps the input as a crash to fix.
#pragma once
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "kernels/error.h"

namespace ft::fuzz {

// Runs call; an ft::Error is a correct refusal of the input.
template <class F>
void expect_success_or_error(F&& call) {
  try {
    call();
  } catch (const Error&) {
  }
}

// A private folder for files the readers insist on opening by path, on a
// memory-backed filesystem where there is one. Removed at exit.
inline const std::filesystem::path& scratch_folder() {
  static const std::filesystem::path folder = [] {
    namespace fs = std::filesystem;
    fs::path root = fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    fs::path path = root / ("ft_fuzz_" + std::to_string(::getpid()));
    fs::create_directories(path);
    std::atexit([] { std::error_code ignored; std::filesystem::remove_all(scratch_folder(), ignored); });
    return path;
  }();
  return folder;
}

// Replaces the file `name` in scratch_folder() with bytes and returns its path.
inline std::string write_scratch_file(const std::string& name, const uint8_t* bytes, size_t size) {
  const std::string path = (scratch_folder() / name).string();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) std::abort();
  for (size_t written = 0; written < size;) {
    ssize_t n = ::write(fd, bytes + written, size - written);
    if (n <= 0) std::abort();
    written += size_t(n);
  }
  ::close(fd);
  return path;
}

}  // namespace ft::fuzz
