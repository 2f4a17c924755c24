// Weight I/O in Hugging Face's safetensors format.
//
// File layout: u64 little-endian header length N, then N bytes of JSON
// {"name": {"dtype": "F32"|"F16"|"BF16"|"I8"|"I32", "shape": [...],
// "data_offsets": [begin, end]}, "__metadata__": {...}}, then the data block
// (offsets are relative to the start of the data block).
//
// Reading maps the file (mmap) and hands out non-owning views, so loading a
// model never needs a second full copy in memory. Every malformed input is an
// ft::Error whose message names the file, the tensor and what was expected.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/tensor.h"

namespace ft {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  const void* data = nullptr;  // points into the mapping
  size_t size_bytes = 0;
  std::string file;  // path of the file holding it, for messages
};

// The largest JSON header a file may declare. The reference implementation
// (Python safetensors) refuses more than 100 MB too; real headers are a few
// hundred bytes per tensor. Checked before the header is parsed.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// Throws an Error naming the file, the tensor and the first offending element
// when a floating-point entry holds NaN or Inf (integer entries always pass).
// One read of the bytes, at memory bandwidth: loaders call it on every tensor
// they take in, so a corrupt checkpoint never reaches training.
void require_finite(const SafetensorsEntry& entry);
// The index of the first Inf or NaN among count values of dtype at data
// (count when there is none; integer dtypes have none).
size_t first_non_finite_value(const void* data, DType dtype, size_t count);

// One memory-mapped .safetensors file, validated at open.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string path_;
  void* mapping_ = nullptr;
  size_t mapping_bytes_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint: a single .safetensors file, a folder holding model.safetensors,
// or a folder with model.safetensors.index.json naming several shards.
class Checkpoint {
 public:
  explicit Checkpoint(const std::string& path);

  const std::string& path() const { return path_; }
  bool contains(const std::string& name) const;
  // Throws an Error naming the tensor and the checkpoint when it is missing.
  const SafetensorsEntry& entry(const std::string& name) const;
  // A non-owning host view of the tensor's bytes (valid while this lives).
  // Checks require_finite first: every loader reads its tensors through here.
  Tensor view(const std::string& name) const;
  // Drops the tensor's mapped pages from this process's resident set once it
  // has been consumed, so streaming a checkpoint through keeps about one
  // tensor of it resident. The mapping is read-only and private, so nothing
  // is lost: a later view() refaults the bytes from the file (or page cache).
  void release(const std::string& name) const;
  std::vector<std::string> names() const;
  size_t total_bytes() const;

 private:
  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsEntry*> by_name_;
};

// The first file in folder (by name) that makes it a model's folder:
// config.json or weights (*.safetensors, PyTorch's *.bin / *.pt / *.pth, a
// *.gguf); "" when it holds none or does not exist. A command that writes a
// model refuses such a folder rather than write over the model in it.
std::string model_file_in(const std::string& folder);

// The checksum a file may carry in its metadata "checksum" (training states
// always do, our adapters too): over every other metadata entry and every
// tensor's name, dtype, shape and bytes, so a flipped byte anywhere in the
// file changes it or makes the file unreadable. 16 hex digits (checksum.h).
inline constexpr const char* kChecksumKey = "checksum";
std::string safetensors_checksum(const std::vector<SafetensorsEntry>& entries,
                                 const std::map<std::string, std::string>& metadata);
// Throws an Error naming the file when its "checksum" differs from its contents.
void verify_checksum(const SafetensorsFile& file);

// Writes host tensors (in the order given) to path atomically
// (write_file_atomically, atomic_file.h): the previous file survives any failure.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});
// The same, with the metadata "checksum" of the contents added.
void save_safetensors_with_checksum(const std::string& path,
                                    const std::vector<std::pair<std::string, Tensor>>& tensors,
                                    const std::map<std::string, std::string>& metadata);

}  // namespace ft
