#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "kernels/error.h"
#include "kernels/input_file.h"
#include "model/atomic_file.h"
#include "model/checksum.h"
#include "model/json_input.h"

namespace ft {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

struct DTypeName {
  const char* name;
  DType dtype;
};
// The safetensors spellings of the dtypes we compute with. Others the format
// allows (F64, I64, BOOL, ...) are refused: no kernel could consume them. U8
// holds bitsandbytes' packed 4-bit codes and double-quantised absmax.
constexpr DTypeName kDTypeNames[] = {
    {"F32", DType::f32}, {"F16", DType::f16}, {"BF16", DType::bf16}, {"I8", DType::i8}, {"I32", DType::i32},
    {"U8", DType::u8}};

const char* safetensors_name(DType dtype) {
  for (const DTypeName& entry : kDTypeNames)
    if (entry.dtype == dtype) return entry.name;
  fail("safetensors: no name for dtype ", dtype_name(dtype));
}

std::string errno_text() { return std::strerror(errno); }

// Buffers older transformers saved in checkpoints and every model recomputes
// (rotary inv_freq, GPT-NeoX's causal-mask bias, BOOL or U8, and masked_bias):
// transformers 5 ignores them, and so does this reader, whatever their dtype.
bool is_recomputed_buffer(const std::string& name) {
  for (const std::string suffix : {"rotary_emb.inv_freq", "attention.bias", "attention.masked_bias"})
    if (name.ends_with(suffix)) return true;
  return false;
}

DType parse_dtype(const json& info, const std::string& where) {
  FT_CHECK(info.contains("dtype"), where, "missing \"dtype\"");
  FT_CHECK(info["dtype"].is_string(), where, "\"dtype\" must be a string such as \"BF16\", got ", info["dtype"].dump());
  std::string name = info["dtype"].get<std::string>();
  for (const DTypeName& entry : kDTypeNames)
    if (name == entry.name) return entry.dtype;
  fail(where, "unsupported dtype \"", name, "\" (supported: F32, F16, BF16, I8, I32, U8)");
}

Shape parse_shape(const json& info, const std::string& where) {
  FT_CHECK(info.contains("shape"), where, "missing \"shape\"");
  FT_CHECK(info["shape"].is_array(), where, "\"shape\" must be an array of integers, got ", info["shape"].dump());
  Shape shape;
  for (const json& extent : info["shape"]) {
    FT_CHECK(extent.is_number_integer(), where, "shape ", info["shape"].dump(), " must hold only integers");
    // A negative extent parses as a signed integer; non-negative ones as unsigned.
    FT_CHECK(extent.is_number_unsigned(), where, "negative shape extent in ", info["shape"].dump(),
             " (expected non-negative integers)");
    FT_CHECK(extent.get<uint64_t>() <= uint64_t(INT64_MAX), where, "shape ", info["shape"].dump(), " is too large");
    shape.push_back(extent.get<int64_t>());
  }
  return shape;
}

// Returns [begin, end) relative to the data block, checked against its size.
std::pair<uint64_t, uint64_t> parse_offsets(const json& info, uint64_t data_bytes, const std::string& where) {
  FT_CHECK(info.contains("data_offsets"), where, "missing \"data_offsets\"");
  const json& offsets = info["data_offsets"];
  FT_CHECK(offsets.is_array() && offsets.size() == 2, where, "\"data_offsets\" must be [begin, end], got ", offsets.dump());
  FT_CHECK(offsets[0].is_number_unsigned() && offsets[1].is_number_unsigned(), where, "data_offsets ", offsets.dump(),
           " must be non-negative integers");
  uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
  FT_CHECK(begin <= end, where, "data_offsets ", offsets.dump(), " have begin > end");
  FT_CHECK(end <= data_bytes, where, "data_offsets ", offsets.dump(), " run past the end of the data block (",
           data_bytes, " bytes)");
  return {begin, end};
}

SafetensorsEntry parse_entry(const std::string& path, const std::string& name, const json& info,
                             const uint8_t* data_block, uint64_t data_bytes) {
  std::string where = path + ": tensor \"" + name + "\": ";
  FT_CHECK(info.is_object(), where, "expected an object with dtype, shape and data_offsets, got ", info.dump());
  SafetensorsEntry entry;
  entry.name = name;
  entry.file = path;
  entry.dtype = parse_dtype(info, where);
  entry.shape = parse_shape(info, where);
  auto [begin, end] = parse_offsets(info, data_bytes, where);
  // Overflow-checked dtype size x product(shape): a hostile shape must not wrap around to match.
  uint64_t needed = dtype_size_bytes(entry.dtype);
  for (int64_t extent : entry.shape)
    FT_CHECK(!__builtin_mul_overflow(needed, uint64_t(extent), &needed), where, "shape ", shape_string(entry.shape),
             " is too large");
  FT_CHECK(needed == end - begin, where, "data_offsets hold ", end - begin, " bytes but dtype ", info["dtype"].get<std::string>(),
           " with shape ", shape_string(entry.shape), " needs ", needed, " bytes");
  entry.data = data_block + begin;
  entry.size_bytes = end - begin;
  return entry;
}

std::map<std::string, std::string> parse_metadata(const std::string& path, const json& value) {
  FT_CHECK(value.is_object(), path, ": \"__metadata__\" must be an object of strings, got ", value.dump());
  std::map<std::string, std::string> metadata;
  for (const auto& [key, text] : value.items()) {
    FT_CHECK(text.is_string(), path, ": \"__metadata__\" key \"", key, "\" must hold a string, got ", text.dump());
    metadata[key] = text.get<std::string>();
  }
  return metadata;
}

// Validates the header of a mapped file and returns its entries sorted by offset.
std::vector<SafetensorsEntry> parse_file(const std::string& path, const uint8_t* bytes, uint64_t file_bytes,
                                         std::map<std::string, std::string>& metadata) {
  FT_CHECK(file_bytes >= 8, path, ": file is ", file_bytes, " bytes, shorter than the 8-byte header length");
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | bytes[i];  // little-endian u64
  FT_CHECK(header_bytes <= kMaxSafetensorsHeaderBytes, path, ": header length ", header_bytes,
           " exceeds the limit of ", kMaxSafetensorsHeaderBytes, " bytes (is this a safetensors file?)");
  FT_CHECK(header_bytes <= file_bytes - 8, path, ": header length ", header_bytes, " exceeds the file (",
           file_bytes, " bytes)");
  const char* header_text = reinterpret_cast<const char*>(bytes + 8);
  json header = parse_json(std::string_view(header_text, header_bytes), path + ": header");
  FT_CHECK(header.is_object(), path, ": header must be a JSON object, got ", header.dump());
  const uint8_t* data_block = bytes + 8 + header_bytes;
  uint64_t data_bytes = file_bytes - 8 - header_bytes;
  std::vector<SafetensorsEntry> entries;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__")
      metadata = parse_metadata(path, info);
    else if (!is_recomputed_buffer(name))
      entries.push_back(parse_entry(path, name, info, data_block, data_bytes));
  }
  std::sort(entries.begin(), entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.data != b.data ? a.data < b.data : a.size_bytes < b.size_bytes;
  });
  // Sorted by start, ranges are disjoint iff each starts at or after the previous end.
  // Empty tensors own no bytes, so they can sit anywhere.
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& entry : entries) {
    if (entry.size_bytes == 0) continue;
    const uint8_t* start = static_cast<const uint8_t*>(entry.data);
    FT_CHECK(!previous || static_cast<const uint8_t*>(previous->data) + previous->size_bytes <= start, path,
             ": tensors \"", previous ? previous->name : "", "\" and \"", entry.name,
             "\" have overlapping data_offsets (expected disjoint byte ranges)");
    previous = &entry;
  }
  return entries;
}

// Index of the first element of `values` whose exponent bits are all set
// (NaN or Inf), or count when there is none. Blocks keep the inner loop
// branch-free so it vectorises; only a block holding a bad value is rescanned.
template <class Bits>
size_t first_non_finite(const unsigned char* values, size_t count, Bits exponent_mask) {
  constexpr size_t kBlock = 4096;
  for (size_t start = 0; start < count; start += kBlock) {
    const size_t end = std::min(count, start + kBlock);
    unsigned any = 0;
#pragma omp simd reduction(| : any)
    for (size_t i = start; i < end; ++i)
      any |= unsigned((load_unaligned<Bits>(values, int64_t(i)) & exponent_mask) == exponent_mask);
    if (!any) continue;
    for (size_t i = start; i < end; ++i)
      if ((load_unaligned<Bits>(values, int64_t(i)) & exponent_mask) == exponent_mask) return i;
  }
  return count;
}

}  // namespace

size_t first_non_finite_value(const void* data, DType dtype, size_t count) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  if (dtype == DType::f32) return first_non_finite<uint32_t>(bytes, count, 0x7f800000u);
  if (dtype == DType::bf16 || dtype == DType::f16)
    return first_non_finite<uint16_t>(bytes, count, dtype == DType::bf16 ? 0x7f80 : 0x7c00);
  return count;
}

void require_finite(const SafetensorsEntry& entry) {
  const size_t count = entry.size_bytes / std::max<size_t>(1, dtype_size_bytes(entry.dtype));
  const size_t bad = first_non_finite_value(entry.data, entry.dtype, count);
  const float value = bad < count ? load_as_f32(entry.data, entry.dtype, int64_t(bad)) : 0.0f;
  FT_CHECK(bad == count, entry.file, ": tensor \"", entry.name, "\" holds ", value, " at element ", bad,
           " (expected finite values; the checkpoint is corrupt or was saved after training diverged)");
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FT_CHECK(fd >= 0, path, ": cannot open safetensors file (", errno_text(), ")");
  struct stat info;
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    fail(path, ": not a regular file (expected a .safetensors file)");
  }
  size_t file_bytes = size_t(info.st_size);
  // mmap refuses length 0; such a file fails the size check in parse_file anyway.
  if (file_bytes > 0) {
    void* mapping = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapping == MAP_FAILED) {
      std::string reason = errno_text();
      ::close(fd);
      fail(path, ": cannot mmap (", reason, ")");
    }
    mapping_ = mapping;
    mapping_bytes_ = file_bytes;
  }
  ::close(fd);  // the mapping keeps the file's pages reachable on its own
  try {
    entries_ = parse_file(path, static_cast<const uint8_t*>(mapping_), file_bytes, metadata_);
  } catch (...) {
    // The destructor does not run for a half-built object: unmap here.
    if (mapping_) ::munmap(mapping_, mapping_bytes_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_) ::munmap(mapping_, mapping_bytes_);
}

namespace {

// Reads model.safetensors.index.json: tensor name -> shard file name.
std::map<std::string, std::string> read_weight_map(const std::string& index_path) {
  std::ifstream file = open_input_file(index_path, "shard index");
  std::stringstream text;
  text << file.rdbuf();
  json index = parse_json(text.str(), index_path);
  FT_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(), index_path,
           ": missing \"weight_map\" (expected an object of tensor name -> shard file)");
  std::map<std::string, std::string> weight_map;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    FT_CHECK(shard.is_string(), index_path, ": weight_map entry for tensor \"", name,
             "\" must be a shard file name, got ", shard.dump());
    if (!is_recomputed_buffer(name)) weight_map[name] = shard.get<std::string>();
  }
  return weight_map;
}

}  // namespace

std::string model_file_in(const std::string& folder) {
  std::error_code error;
  if (!fs::is_directory(folder, error)) return "";
  static const std::set<std::string> kWeightExtensions = {".safetensors", ".bin", ".pt", ".pth", ".gguf"};
  std::vector<std::string> found;
  for (const fs::directory_entry& entry : fs::directory_iterator(folder, error)) {
    const std::string name = entry.path().filename().string();
    if (name == "config.json" || kWeightExtensions.contains(entry.path().extension().string())) found.push_back(name);
  }
  std::sort(found.begin(), found.end());
  return found.empty() ? "" : found.front();
}

Checkpoint::Checkpoint(const std::string& path) : path_(path) {
  std::error_code error;
  std::map<std::string, std::string> weight_map;  // tensor -> shard path; empty unless sharded
  std::string index_path = (fs::path(path) / "model.safetensors.index.json").string();
  std::string single_path = (fs::path(path) / "model.safetensors").string();
  if (!fs::is_directory(path, error)) {
    FT_CHECK(fs::exists(path, error), path, ": checkpoint not found (expected a .safetensors file or a folder)");
    files_.push_back(std::make_unique<SafetensorsFile>(path));
  } else if (fs::exists(index_path, error)) {
    for (const auto& [name, shard] : read_weight_map(index_path)) {
      std::string shard_path = (fs::path(path) / shard).string();
      weight_map[name] = shard_path;
      bool opened = std::any_of(files_.begin(), files_.end(), [&](const auto& f) { return f->path() == shard_path; });
      if (opened) continue;
      FT_CHECK(fs::is_regular_file(shard_path, error), index_path, ": weight_map puts tensor \"", name, "\" in shard \"",
               shard, "\" but ", shard_path, " does not exist");
      files_.push_back(std::make_unique<SafetensorsFile>(shard_path));
    }
  } else if (fs::exists(single_path, error)) {
    files_.push_back(std::make_unique<SafetensorsFile>(single_path));
  } else {
    for (const char* pickle : {"pytorch_model.bin", "pytorch_model.bin.index.json"})
      FT_CHECK(!fs::exists(fs::path(path) / pickle, error), path, ": folder holds ", pickle,
               " (PyTorch pickle weights) but no model.safetensors; only safetensors files are read (load it with transformers and "
               "save_pretrained(folder, safe_serialization=True))");
    fail(path, ": folder holds neither model.safetensors nor model.safetensors.index.json (expected a Hugging Face "
         "checkpoint folder)");
  }
  for (const auto& file : files_) {
    for (const SafetensorsEntry& entry : file->entries()) {
      auto [it, inserted] = by_name_.emplace(entry.name, &entry);
      FT_CHECK(inserted, path, ": tensor \"", entry.name, "\" appears in both ", it->second->file, " and ", entry.file);
    }
  }
  for (const auto& [name, shard_path] : weight_map) {
    auto it = by_name_.find(name);
    FT_CHECK(it != by_name_.end() && it->second->file == shard_path, index_path, ": weight_map puts tensor \"", name,
             "\" in ", shard_path, " but that shard does not hold it");
  }
}

bool Checkpoint::contains(const std::string& name) const { return by_name_.count(name) != 0; }

const SafetensorsEntry& Checkpoint::entry(const std::string& name) const {
  auto it = by_name_.find(name);
  FT_CHECK(it != by_name_.end(), path_, ": missing tensor \"", name, "\"");
  return *it->second;
}

Tensor Checkpoint::view(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  require_finite(e);
  // The mapping is read-only (PROT_READ): writing through this view faults.
  return Tensor::view_of(const_cast<void*>(e.data), e.shape, e.dtype, Device::cpu);
}

void Checkpoint::release(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  if (e.size_bytes == 0) return;
  // madvise needs a page-aligned start. Rounding outwards may also drop a
  // neighbour's edge page, which is harmless: it refaults on its next read.
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = uintptr_t(e.data) / page * page;
  const uintptr_t end = (uintptr_t(e.data) + e.size_bytes + page - 1) / page * page;
  FT_CHECK(::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED) == 0, e.file,
           ": cannot release the pages of tensor \"", name, "\" (", errno_text(), ")");
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> result;
  for (const auto& [name, entry] : by_name_) result.push_back(name);
  return result;
}

size_t Checkpoint::total_bytes() const {
  size_t total = 0;
  for (const auto& [name, entry] : by_name_) total += entry->size_bytes;
  return total;
}

namespace {

// The JSON header: tensors in the given order with consecutive data_offsets.
std::string build_header(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    FT_CHECK(!name.empty() && name != "__metadata__", path, ": invalid tensor name \"", name, "\"");
    FT_CHECK(!header.contains(name), path, ": tensor \"", name, "\" given twice");
    FT_CHECK(tensor.device == Device::cpu && (tensor.data || tensor.size_bytes() == 0), path, ": tensor \"", name,
             "\" must be a host tensor with data");
    uint64_t end = offset + tensor.size_bytes();
    header[name] = {{"dtype", safetensors_name(tensor.dtype)},
                    {"shape", tensor.shape},
                    {"data_offsets", nlohmann::ordered_json::array({offset, end})}};
    offset = end;
  }
  std::string text = header.dump();
  // Pad with spaces so the data block starts 8-byte aligned, as the Python writer does.
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace

std::string safetensors_checksum(const std::vector<SafetensorsEntry>& entries,
                                 const std::map<std::string, std::string>& metadata) {
  Checksum checksum;
  for (const auto& [key, value] : metadata) {
    if (key == kChecksumKey) continue;
    checksum.add_text(key);
    checksum.add_text(value);
  }
  std::vector<const SafetensorsEntry*> sorted;
  for (const SafetensorsEntry& entry : entries) sorted.push_back(&entry);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->name < b->name; });
  for (const SafetensorsEntry* entry : sorted) {
    checksum.add_text(entry->name);
    checksum.add_text(dtype_name(entry->dtype));
    checksum.add_text(shape_string(entry->shape));
    checksum.add(entry->data, entry->size_bytes);
  }
  return checksum.hex();
}

void verify_checksum(const SafetensorsFile& file) {
  auto stored = file.metadata().find(kChecksumKey);
  if (stored == file.metadata().end()) return;
  const std::string computed = safetensors_checksum(file.entries(), file.metadata());
  FT_CHECK(stored->second == computed, file.path(), ": corrupt: its checksum is ", stored->second,
           " but its contents give ", computed, "; the file was damaged after it was written (disk, copy or edit)");
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::string header = build_header(path, tensors, metadata);
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = uint8_t(uint64_t(header.size()) >> (8 * i));  // little-endian u64
  std::vector<std::pair<const void*, size_t>> pieces = {{length, 8}, {header.data(), header.size()}};
  for (const auto& [name, tensor] : tensors) pieces.emplace_back(tensor.data, tensor.size_bytes());
  write_file_atomically(path, pieces);
}

void save_safetensors_with_checksum(const std::string& path,
                                    const std::vector<std::pair<std::string, Tensor>>& tensors,
                                    const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsEntry> entries;
  for (const auto& [name, tensor] : tensors)
    entries.push_back({name, tensor.dtype, tensor.shape, tensor.data, tensor.size_bytes(), path});
  std::map<std::string, std::string> with_checksum = metadata;
  with_checksum[kChecksumKey] = safetensors_checksum(entries, metadata);
  save_safetensors(path, tensors, with_checksum);
}

}  // namespace ft
