#include "model/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kernels/error.h"

namespace ft {
namespace {

// Returns 0, or the errno of the first failed write.
int write_all(int fd, const void* data, size_t bytes) {
  const char* cursor = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t written = ::write(fd, cursor, std::min(bytes, size_t(1) << 30));
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return written < 0 ? errno : EIO;
    cursor += written;
    bytes -= size_t(written);
  }
  return 0;
}

// Best effort: some filesystems refuse fsync on folders, and the data is
// already durable; the rename then survives on every journalled filesystem.
void sync_parent_folder(const std::string& path) {
  std::string folder = std::filesystem::path(path).parent_path().string();
  int fd = ::open(folder.empty() ? "." : folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

void write_file_atomically(const std::string& path, const std::vector<std::pair<const void*, size_t>>& pieces) {
  const std::string tmp_path = path + ".tmp";
  int fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  int error = fd < 0 ? errno : 0;
  for (const auto& [data, bytes] : pieces)
    if (!error) error = write_all(fd, data, bytes);
  if (!error && ::fsync(fd) != 0) error = errno;
  // close can report a deferred write error (e.g. on NFS), so it is checked too.
  if (fd >= 0 && ::close(fd) != 0 && !error) error = errno;
  if (!error && ::rename(tmp_path.c_str(), path.c_str()) != 0) error = errno;
  if (error) {
    if (fd >= 0) ::unlink(tmp_path.c_str());
    fail(path, ": cannot save (writing ", tmp_path, ": ", std::strerror(error), "); the previous ",
         std::filesystem::path(path).filename().string(), ", if any, is unchanged");
  }
  sync_parent_folder(path);
}

void write_file_atomically(const std::string& path, const std::string& text) {
  write_file_atomically(path, {{text.data(), text.size()}});
}

void copy_file_atomically(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  FT_CHECK(in, from, ": cannot open (", std::strerror(errno), ")");
  std::ostringstream bytes;
  bytes << in.rdbuf();
  FT_CHECK(!in.bad(), from, ": cannot read (", std::strerror(errno), ")");
  write_file_atomically(to, bytes.str());
}

void create_folder(const std::string& folder, const std::string& field) {
  std::error_code error;
  std::filesystem::create_directories(folder, error);
  FT_CHECK(!error, field, ": cannot create the folder ", folder, " (", error.message(),
           error == std::errc::not_a_directory ? ": a file is in the way" : "", ")");
}

}  // namespace ft
