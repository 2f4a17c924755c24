// A 64-bit checksum for detecting corruption and change (not an adversary):
// checkpoint files carry one, and a run's identity records those of the files
// it was made from. Word-at-a-time multiply-rotate mixing, a few GB/s.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ft {

class Checksum {
 public:
  void add(const void* data, size_t bytes);
  // The length first, so ("ab", "c") and ("a", "bc") differ.
  void add_text(std::string_view text);
  uint64_t value() const;
  std::string hex() const;  // 16 lowercase hex digits
  uint64_t total_bytes() const { return total_bytes_; }

 private:
  uint64_t state_ = 0x9e3779b97f4a7c15ull;
  uint64_t total_bytes_ = 0;
  uint8_t tail_[8] = {};  // bytes not yet mixed (total_bytes_ % 8 of them)
};

// "<size> bytes, checksum <hex>" of a file's contents; errors name the file.
std::string file_fingerprint(const std::string& path);

}  // namespace ft
