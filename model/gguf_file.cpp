#include "model/gguf_file.h"

#include <cstring>
#include <fstream>
#include <set>

#include "kernels/error.h"
#include "model/atomic_file.h"

namespace ft {
namespace {

constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};
constexpr uint32_t kVersion = 3;
constexpr uint32_t kMaxDims = 4;  // GGML_MAX_DIMS

// Bytes of one numeric or boolean element; 0 for string and array.
size_t scalar_bytes(GgufType type) {
  switch (type) {
    case GgufType::u8: case GgufType::i8: case GgufType::boolean: return 1;
    case GgufType::u16: case GgufType::i16: return 2;
    case GgufType::u32: case GgufType::i32: case GgufType::f32: return 4;
    case GgufType::u64: case GgufType::i64: case GgufType::f64: return 8;
    case GgufType::string: case GgufType::array: return 0;
  }
  return 0;
}

bool known_type(uint32_t type) { return type <= uint32_t(GgufType::f64); }

template <class T>
std::vector<uint8_t> bytes_of(const T* values, size_t count) {
  std::vector<uint8_t> bytes(count * sizeof(T));
  if (count) std::memcpy(bytes.data(), values, bytes.size());
  return bytes;
}

size_t padding_to(size_t offset) { return (kGgufAlignment - offset % kGgufAlignment) % kGgufAlignment; }

// The file's bytes as they are appended: header, metadata and tensor infos.
class Encoder {
 public:
  template <class T>
  void put(T value) {
    const size_t at = out.size();
    out.resize(at + sizeof(T));
    std::memcpy(out.data() + at, &value, sizeof(T));
  }
  void put_string(const std::string& text) {
    put<uint64_t>(text.size());
    out.insert(out.end(), text.begin(), text.end());
  }
  void put_value(const GgufValue& value) {
    put<uint32_t>(uint32_t(value.type));
    if (value.type == GgufType::string) return put_string(value.strings[0]);
    if (value.type == GgufType::array) {
      put<uint32_t>(uint32_t(value.element_type));
      put<uint64_t>(value.count());
      for (const std::string& text : value.strings) put_string(text);
    }
    out.insert(out.end(), value.bytes.begin(), value.bytes.end());
  }
  std::vector<uint8_t> out;
};

// Bounds-checked reads from the file's bytes; errors name the file.
class Decoder {
 public:
  Decoder(const std::vector<uint8_t>& bytes, const std::string& path) : bytes_(bytes), path_(path) {}
  size_t offset() const { return offset_; }
  size_t left() const { return bytes_.size() - offset_; }
  void need(size_t count, const std::string& what) const {
    FT_CHECK(count <= left(), path_, ": truncated at byte ", offset_, " (", what, " needs ", count, " bytes, ", left(),
             " left)");
  }
  template <class T>
  T get(const std::string& what) {
    need(sizeof(T), what);
    T value;
    std::memcpy(&value, bytes_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return value;
  }
  std::string get_string(const std::string& what) {
    const uint64_t size = get<uint64_t>(what);
    need(size, what);
    std::string text(reinterpret_cast<const char*>(bytes_.data() + offset_), size);
    offset_ += size;
    return text;
  }
  std::vector<uint8_t> get_bytes(size_t count, const std::string& what) {
    need(count, what);
    std::vector<uint8_t> out(bytes_.begin() + long(offset_), bytes_.begin() + long(offset_ + count));
    offset_ += count;
    return out;
  }
  GgufValue get_value(const std::string& key) {
    const uint32_t type = get<uint32_t>(key);
    FT_CHECK(known_type(type), path_, ": metadata \"", key, "\" has unknown value type ", type);
    GgufValue value;
    value.type = GgufType(type);
    if (value.type == GgufType::string) {
      value.strings.push_back(get_string(key));
    } else if (value.type == GgufType::array) {
      const uint32_t element = get<uint32_t>(key);
      FT_CHECK(known_type(element) && GgufType(element) != GgufType::array, path_, ": metadata \"", key,
               "\" is an array of unsupported element type ", element);
      value.element_type = GgufType(element);
      const uint64_t count = get<uint64_t>(key);
      if (value.element_type == GgufType::string) {
        need(count * sizeof(uint64_t), key);  // each string takes at least its length
        for (uint64_t i = 0; i < count; ++i) value.strings.push_back(get_string(key));
      } else {
        const size_t each = scalar_bytes(value.element_type);
        FT_CHECK(count <= left() / each, path_, ": metadata \"", key, "\" declares ", count,
                 " elements, more than the file holds");
        value.bytes = get_bytes(count * each, key);
      }
    } else {
      value.bytes = get_bytes(scalar_bytes(value.type), key);
    }
    return value;
  }
 private:
  const std::vector<uint8_t>& bytes_;
  const std::string& path_;
  size_t offset_ = 0;
};

const char* type_word(GgufType type) {
  static const char* const names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                      "bool", "string", "array", "u64", "i64", "f64"};
  return names[uint32_t(type)];
}

// The stored scalar type of value (or its element type) must be type.
void require(const GgufValue& value, GgufType type, const std::string& key) {
  const GgufType stored = value.type == GgufType::array ? value.element_type : value.type;
  FT_CHECK(stored == type, "metadata \"", key, "\" is ", type_word(stored), ", expected ", type_word(type));
}

template <class T>
T element(const GgufValue& value, size_t i, GgufType type, const std::string& key) {
  require(value, type, key);
  FT_CHECK(i < value.count(), "metadata \"", key, "\": element ", i, " of ", value.count());
  T out;
  std::memcpy(&out, value.bytes.data() + i * sizeof(T), sizeof(T));
  return out;
}

}  // namespace

const char* ggml_type_name(GgmlType type) {
  switch (type) {
    case GgmlType::f32: return "F32";
    case GgmlType::f16: return "F16";
    case GgmlType::q8_0: return "Q8_0";
    case GgmlType::bf16: return "BF16";
  }
  return "?";
}

size_t ggml_size_bytes(GgmlType type, int64_t numel) {
  switch (type) {
    case GgmlType::f32: return size_t(numel) * 4;
    case GgmlType::f16: case GgmlType::bf16: return size_t(numel) * 2;
    case GgmlType::q8_0: return size_t(numel / kQ8BlockValues) * kQ8BlockBytes;
  }
  return 0;
}

GgufValue GgufValue::u32(uint32_t value) { return {GgufType::u32, GgufType::u32, bytes_of(&value, 1), {}}; }
GgufValue GgufValue::f32(float value) { return {GgufType::f32, GgufType::u32, bytes_of(&value, 1), {}}; }
GgufValue GgufValue::boolean(bool value) {
  const uint8_t byte = value ? 1 : 0;
  return {GgufType::boolean, GgufType::u32, {byte}, {}};
}
GgufValue GgufValue::string(std::string value) { return {GgufType::string, GgufType::u32, {}, {std::move(value)}}; }
GgufValue GgufValue::strings_array(std::vector<std::string> values) {
  return {GgufType::array, GgufType::string, {}, std::move(values)};
}
GgufValue GgufValue::i32_array(const std::vector<int32_t>& values) {
  return {GgufType::array, GgufType::i32, bytes_of(values.data(), values.size()), {}};
}
GgufValue GgufValue::f32_array(const std::vector<float>& values) {
  return {GgufType::array, GgufType::f32, bytes_of(values.data(), values.size()), {}};
}

size_t GgufValue::count() const {
  if (type != GgufType::array) return 1;
  return element_type == GgufType::string ? strings.size() : bytes.size() / scalar_bytes(element_type);
}

uint32_t GgufValue::as_u32(const std::string& key) const { return element<uint32_t>(*this, 0, GgufType::u32, key); }
float GgufValue::as_f32(const std::string& key) const { return element<float>(*this, 0, GgufType::f32, key); }
bool GgufValue::as_bool(const std::string& key) const { return element<uint8_t>(*this, 0, GgufType::boolean, key); }
const std::string& GgufValue::as_string(const std::string& key) const {
  require(*this, GgufType::string, key);
  FT_CHECK(type == GgufType::string, "metadata \"", key, "\" is an array, expected a string");
  return strings[0];
}
int32_t GgufValue::i32_at(size_t i, const std::string& key) const {
  return element<int32_t>(*this, i, GgufType::i32, key);
}
float GgufValue::f32_at(size_t i, const std::string& key) const { return element<float>(*this, i, GgufType::f32, key); }

bool GgufValue::operator==(const GgufValue& other) const {
  const bool array = type == GgufType::array;
  return type == other.type && (!array || element_type == other.element_type) && bytes == other.bytes &&
         strings == other.strings;
}

void write_gguf(const std::string& path, const GgufMetadata& metadata, const std::vector<GgufTensor>& tensors) {
  std::set<std::string> seen;
  for (const auto& [key, value] : metadata)
    FT_CHECK(seen.insert(key).second, path, ": metadata key \"", key, "\" given twice");
  seen.clear();
  Encoder header;
  header.out.assign(kMagic, kMagic + 4);
  header.put<uint32_t>(kVersion);
  header.put<uint64_t>(tensors.size());
  header.put<uint64_t>(metadata.size());
  for (const auto& [key, value] : metadata) {
    header.put_string(key);
    header.put_value(value);
  }
  size_t data_offset = 0;
  for (const GgufTensor& tensor : tensors) {
    FT_CHECK(seen.insert(tensor.name).second, path, ": tensor \"", tensor.name, "\" given twice");
    const int64_t numel = shape_numel(tensor.shape);
    FT_CHECK(!tensor.shape.empty() && tensor.shape.size() <= kMaxDims, path, ": tensor \"", tensor.name,
             "\" has ", tensor.shape.size(), " dimensions (GGUF holds 1 to ", kMaxDims, ")");
    FT_CHECK(tensor.type != GgmlType::q8_0 || tensor.shape.back() % kQ8BlockValues == 0, path, ": tensor \"",
             tensor.name, "\": Q8_0 needs rows of a multiple of 32 values, got ", shape_string(tensor.shape));
    FT_CHECK(tensor.data.size() == ggml_size_bytes(tensor.type, numel), path, ": tensor \"", tensor.name, "\" holds ",
             tensor.data.size(), " bytes, ", ggml_type_name(tensor.type), " ", shape_string(tensor.shape), " needs ",
             ggml_size_bytes(tensor.type, numel));
    header.put_string(tensor.name);
    header.put<uint32_t>(uint32_t(tensor.shape.size()));
    for (auto dim = tensor.shape.rbegin(); dim != tensor.shape.rend(); ++dim) header.put<uint64_t>(uint64_t(*dim));
    header.put<uint32_t>(uint32_t(tensor.type));
    header.put<uint64_t>(data_offset);
    data_offset += tensor.data.size() + padding_to(tensor.data.size());
  }
  static const uint8_t zeros[kGgufAlignment] = {};
  std::vector<std::pair<const void*, size_t>> pieces = {{header.out.data(), header.out.size()},
                                                        {zeros, padding_to(header.out.size())}};
  for (const GgufTensor& tensor : tensors) {
    pieces.emplace_back(tensor.data.data(), tensor.data.size());
    pieces.emplace_back(zeros, padding_to(tensor.data.size()));
  }
  write_file_atomically(path, pieces);
}

bool starts_as_gguf(const std::string& path) {
  char magic[4] = {};
  std::ifstream in(path, std::ios::binary);
  return in.read(magic, 4) && std::equal(magic, magic + 4, kMagic);
}

GgufFile::GgufFile(const std::string& path) : path_(path) {
  std::ifstream in(path, std::ios::binary);
  FT_CHECK(in, path, ": cannot open (", std::strerror(errno), ")");
  bytes_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  Decoder file(bytes_, path_);
  const std::vector<uint8_t> magic = file.get_bytes(4, "the magic");
  FT_CHECK(std::equal(magic.begin(), magic.end(), kMagic), path, ": not a GGUF file (it does not start with \"GGUF\")");
  version_ = file.get<uint32_t>("the version");
  FT_CHECK(version_ == kVersion, path, ": GGUF version ", version_, ", expected ", kVersion);
  const uint64_t tensor_count = file.get<uint64_t>("the tensor count");
  const uint64_t metadata_count = file.get<uint64_t>("the metadata count");
  // Each entry takes at least 8 bytes, so a count above the file's size is corrupt.
  FT_CHECK(tensor_count <= file.left() / 8 && metadata_count <= file.left() / 8, path, ": declares ", tensor_count,
           " tensors and ", metadata_count, " metadata entries, more than the file holds");
  for (uint64_t i = 0; i < metadata_count; ++i) {
    std::string key = file.get_string("a metadata key");
    FT_CHECK(!contains(key), path, ": metadata key \"", key, "\" appears twice");
    GgufValue value = file.get_value(key);
    metadata_.emplace_back(std::move(key), std::move(value));
  }
  std::vector<uint64_t> offsets;
  for (uint64_t i = 0; i < tensor_count; ++i) {
    TensorInfo info;
    info.name = file.get_string("a tensor name");
    const uint32_t dims = file.get<uint32_t>(info.name);
    FT_CHECK(dims >= 1 && dims <= kMaxDims, path, ": tensor \"", info.name, "\" has ", dims, " dimensions");
    info.shape.resize(dims);
    for (uint32_t d = 0; d < dims; ++d) {
      const uint64_t size = file.get<uint64_t>(info.name);
      FT_CHECK(size >= 1 && size <= bytes_.size(), path, ": tensor \"", info.name, "\" dimension ", d, " is ", size);
      info.shape[dims - 1 - d] = int64_t(size);
    }
    const uint32_t type = file.get<uint32_t>(info.name);
    const std::set<uint32_t> types = {0, 1, 8, 30};
    FT_CHECK(types.count(type), path, ": tensor \"", info.name, "\" has ggml type ", type,
             " (this reader knows F32, F16, Q8_0 and BF16)");
    info.type = GgmlType(type);
    FT_CHECK(info.type != GgmlType::q8_0 || info.shape.back() % kQ8BlockValues == 0, path, ": Q8_0 tensor \"",
             info.name, "\" has rows of ", info.shape.back(), " values (not a multiple of 32)");
    info.size_bytes = ggml_size_bytes(info.type, shape_numel(info.shape));
    offsets.push_back(file.get<uint64_t>(info.name));
    tensors_.push_back(std::move(info));
  }
  const size_t alignment = contains("general.alignment") ? value("general.alignment").as_u32("general.alignment")
                                                         : kGgufAlignment;
  FT_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0, path, ": general.alignment ", alignment,
           " is not a power of two");
  const size_t data_start = file.offset() + (alignment - file.offset() % alignment) % alignment;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    TensorInfo& info = tensors_[i];
    FT_CHECK(offsets[i] % alignment == 0, path, ": tensor \"", info.name, "\" offset ", offsets[i],
             " is not a multiple of ", alignment);
    FT_CHECK(data_start <= bytes_.size() && offsets[i] <= bytes_.size() - data_start &&
                 info.size_bytes <= bytes_.size() - data_start - offsets[i],
             path, ": tensor \"", info.name, "\" (", info.size_bytes, " bytes at ", offsets[i],
             ") runs past the end of the file");
    info.data = bytes_.data() + data_start + offsets[i];
    for (size_t j = 0; j < i; ++j) FT_CHECK(tensors_[j].name != info.name, path, ": tensor \"", info.name, "\" appears twice");
  }
}

bool GgufFile::contains(const std::string& key) const {
  for (const auto& entry : metadata_)
    if (entry.first == key) return true;
  return false;
}

const GgufValue& GgufFile::value(const std::string& key) const {
  for (const auto& entry : metadata_)
    if (entry.first == key) return entry.second;
  fail(path_, ": no metadata \"", key, "\"");
}

const GgufFile::TensorInfo& GgufFile::tensor(const std::string& name) const {
  for (const TensorInfo& info : tensors_)
    if (info.name == name) return info;
  fail(path_, ": no tensor \"", name, "\"");
}

}  // namespace ft
