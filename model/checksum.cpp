#include "model/checksum.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/error.h"

namespace ft {
namespace {

constexpr uint64_t kPrime1 = 0x9e3779b185ebca87ull, kPrime2 = 0xc2b2ae3d27d4eb4full;

uint64_t rotl(uint64_t x, int bits) { return (x << bits) | (x >> (64 - bits)); }

uint64_t mix_word(uint64_t state, uint64_t word) { return rotl(state ^ (word * kPrime2), 31) * kPrime1; }

uint64_t load_le64(const uint8_t* bytes) {
  uint64_t word = 0;
  for (int i = 7; i >= 0; --i) word = (word << 8) | bytes[i];
  return word;
}

}  // namespace

void Checksum::add(const void* data, size_t bytes) {
  const uint8_t* cursor = static_cast<const uint8_t*>(data);
  size_t pending = size_t(total_bytes_ % 8);
  total_bytes_ += bytes;
  while (pending > 0 && pending < 8 && bytes > 0) tail_[pending++] = *cursor++, --bytes;
  if (pending == 8) state_ = mix_word(state_, load_le64(tail_));
  else if (pending > 0) return;  // still short of a word
  for (; bytes >= 8; cursor += 8, bytes -= 8) state_ = mix_word(state_, load_le64(cursor));
  std::memcpy(tail_, cursor, bytes);
}

void Checksum::add_text(std::string_view text) {
  const uint64_t length = text.size();
  uint8_t length_bytes[8];
  for (int i = 0; i < 8; ++i) length_bytes[i] = uint8_t(length >> (8 * i));
  add(length_bytes, 8);
  add(text.data(), text.size());
}

uint64_t Checksum::value() const {
  uint8_t last[8] = {};
  std::memcpy(last, tail_, size_t(total_bytes_ % 8));
  uint64_t h = mix_word(state_ ^ total_bytes_, load_le64(last));
  // splitmix64's finaliser: every input bit reaches every output bit.
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

std::string Checksum::hex() const {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value()));
  return text;
}

std::string file_fingerprint(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FT_CHECK(fd >= 0, path, ": cannot open (", std::strerror(errno), ")");
  Checksum checksum;
  std::vector<char> buffer(size_t(1) << 20);
  for (;;) {
    ssize_t got = ::read(fd, buffer.data(), buffer.size());
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int error = errno;
      ::close(fd);
      fail(path, ": cannot read (", std::strerror(error), ")");
    }
    if (got == 0) break;
    checksum.add(buffer.data(), size_t(got));
  }
  ::close(fd);
  return std::to_string(checksum.total_bytes()) + " bytes, checksum " + checksum.hex();
}

}  // namespace ft
