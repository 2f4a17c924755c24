// llama.cpp's GGUF file format, version 3 (ggml's gguf.h; the `gguf` Python
// package reads and writes the same bytes). Little-endian throughout:
//
//   "GGUF", u32 version 3, u64 tensor count, u64 metadata count,
//   metadata: string key, u32 value type, value (an array: u32 element type,
//             u64 count, the elements); a string is u64 length + UTF-8 bytes,
//   tensor infos: string name, u32 dimension count, u64 dimensions (ggml's
//             order: the innermost, contiguous one first), u32 ggml type,
//             u64 offset into the data section,
//   padding to 32 bytes (general.alignment), the data section: each tensor
//             at a multiple of 32 from its start.
//
// Writing is atomic (model/atomic_file.h): a failure leaves no partial file.
// Reading holds the whole file in memory: it serves tests and checks of
// files this project wrote.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/tensor.h"

namespace ft {

// ggml's type ids for the tensor types export writes.
enum class GgmlType : uint32_t { f32 = 0, f16 = 1, q8_0 = 8, bf16 = 30 };
// Q8_0: blocks of 32 values, an f16 scale d then 32 int8 codes (34 bytes).
inline constexpr int64_t kQ8BlockValues = 32;
inline constexpr size_t kQ8BlockBytes = 34;
inline constexpr size_t kGgufAlignment = 32;  // GGUF_DEFAULT_ALIGNMENT

const char* ggml_type_name(GgmlType type);  // "F32", "F16", "Q8_0", "BF16"
// Bytes of numel values of type (numel a multiple of 32 for Q8_0).
size_t ggml_size_bytes(GgmlType type, int64_t numel);

// GGUF metadata value types (gguf_type).
enum class GgufType : uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7,
  string = 8, array = 9, u64 = 10, i64 = 11, f64 = 12
};

// One metadata value: a scalar, a string, or an array of either kind.
// Numbers and booleans are kept as their little-endian bytes, exactly as
// stored, so every integer width reads back without loss.
struct GgufValue {
  GgufType type = GgufType::u32;
  GgufType element_type = GgufType::u32;  // an array's elements
  std::vector<uint8_t> bytes;             // numeric / boolean values, back to back
  std::vector<std::string> strings;       // a string, or a string array's elements

  static GgufValue u32(uint32_t value);
  static GgufValue f32(float value);
  static GgufValue boolean(bool value);
  static GgufValue string(std::string value);
  static GgufValue strings_array(std::vector<std::string> values);
  static GgufValue i32_array(const std::vector<int32_t>& values);
  static GgufValue f32_array(const std::vector<float>& values);

  // Number of elements (1 for a scalar or a string).
  size_t count() const;
  // The scalar or element i as the type asked for; a different stored type
  // is an Error naming key.
  uint32_t as_u32(const std::string& key) const;
  float as_f32(const std::string& key) const;
  bool as_bool(const std::string& key) const;
  const std::string& as_string(const std::string& key) const;
  int32_t i32_at(size_t i, const std::string& key) const;
  float f32_at(size_t i, const std::string& key) const;
  bool operator==(const GgufValue& other) const;
};

using GgufMetadata = std::vector<std::pair<std::string, GgufValue>>;

// A tensor to write: its shape in PyTorch's order (outermost first; the file
// stores it reversed) and its bytes already in type.
struct GgufTensor {
  std::string name;
  Shape shape;
  GgmlType type = GgmlType::f32;
  std::vector<uint8_t> data;
};

// Writes path atomically. Duplicate keys or tensor names, or data sizes that
// do not match shape and type, are Errors naming path (nothing is written).
void write_gguf(const std::string& path, const GgufMetadata& metadata, const std::vector<GgufTensor>& tensors);

// Whether path's first four bytes are GGUF's magic ("GGUF"): false for a
// shorter or unreadable file.
bool starts_as_gguf(const std::string& path);

// A GGUF file read and validated whole: every malformed part is an Error
// naming the file and what was expected.
class GgufFile {
 public:
  explicit GgufFile(const std::string& path);

  struct TensorInfo {
    std::string name;
    Shape shape;  // PyTorch's order, as GgufTensor
    GgmlType type = GgmlType::f32;
    const uint8_t* data = nullptr;
    size_t size_bytes = 0;
  };
  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  const GgufMetadata& metadata() const { return metadata_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  bool contains(const std::string& key) const;
  // Errors name the file and the missing key or tensor.
  const GgufValue& value(const std::string& key) const;
  const TensorInfo& tensor(const std::string& name) const;

 private:
  std::string path_;
  std::vector<uint8_t> bytes_;
  uint32_t version_ = 0;
  GgufMetadata metadata_;
  std::vector<TensorInfo> tensors_;
};

}  // namespace ft
