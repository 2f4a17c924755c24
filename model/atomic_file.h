// Crash-safe file writes for checkpoints and outputs: the bytes go to
// path + ".tmp", are fsynced, the temp file is renamed over path, and the
// folder is fsynced so the rename itself is durable. A crash or a failed
// write at any moment leaves either the previous file or the new one, never
// a torn file. A failure (ENOSPC, EIO, a read-only folder...) throws an Error
// naming path and the errno text, after removing the temp file.
#pragma once
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace ft {

// The pieces are written in order, as one file.
void write_file_atomically(const std::string& path, const std::vector<std::pair<const void*, size_t>>& pieces);
void write_file_atomically(const std::string& path, const std::string& text);
// Reads from (errors name it) and writes its bytes to to, as above.
void copy_file_atomically(const std::string& from, const std::string& to);
// Creates folder and its parents (nothing if it exists); a failure (a file in
// the way, no permission) is an Error naming `field` (what set the path), the
// folder and the errno text.
void create_folder(const std::string& folder, const std::string& field);

}  // namespace ft
