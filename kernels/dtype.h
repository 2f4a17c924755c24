// Element types and their host-side conversions. BF16 and F16 are stored as raw
// uint16_t bit patterns; conversions from f32 round to nearest even, as
// PyTorch and CUDA's __float2bfloat16_rn do.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

namespace ft {

enum class DType : uint8_t { f32, bf16, f16, i8, i32, u8 };

size_t dtype_size_bytes(DType dtype);
const char* dtype_name(DType dtype);
// torch's spelling of a floating dtype ("bfloat16", "float16", "float32"), as
// config.json's dtype fields and bitsandbytes' quant_state write it.
const char* torch_dtype_name(DType dtype);

inline float bf16_to_f32(uint16_t bits) {
  uint32_t wide = uint32_t(bits) << 16;
  float value;
  std::memcpy(&value, &wide, 4);
  return value;
}

inline uint16_t f32_to_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t((bits + rounding) >> 16);
}

// _Float16 (GCC >= 12 on x86-64) converts with IEEE round-to-nearest-even.
inline float f16_to_f32(uint16_t bits) {
  _Float16 half;
  std::memcpy(&half, &bits, 2);
  return float(half);
}

inline uint16_t f32_to_f16(float value) {
  _Float16 half = _Float16(value);
  uint16_t bits;
  std::memcpy(&bits, &half, 2);
  return bits;
}

// Element i of a buffer of T, read bytewise: the buffer need not be aligned
// to T (a tensor in a safetensors file is packed back to back with the
// others). The memcpy compiles to one load.
template <class T>
inline T load_unaligned(const void* data, int64_t i) {
  T value;
  std::memcpy(&value, static_cast<const unsigned char*>(data) + size_t(i) * sizeof(T), sizeof(T));
  return value;
}

// Reads element i of a buffer of the given dtype as f32; the buffer may be a
// view of a file, so it need not be aligned.
inline float load_as_f32(const void* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::f32: return load_unaligned<float>(data, i);
    case DType::bf16: return bf16_to_f32(load_unaligned<uint16_t>(data, i));
    case DType::f16: return f16_to_f32(load_unaligned<uint16_t>(data, i));
    case DType::i8: return float(static_cast<const int8_t*>(data)[i]);
    case DType::i32: return float(load_unaligned<int32_t>(data, i));
    case DType::u8: return float(static_cast<const uint8_t*>(data)[i]);
  }
  return 0.0f;
}

// Writes an f32 value as element i of a buffer of the given floating dtype.
inline void store_from_f32(void* data, DType dtype, int64_t i, float value) {
  switch (dtype) {
    case DType::f32: static_cast<float*>(data)[i] = value; break;
    case DType::bf16: static_cast<uint16_t*>(data)[i] = f32_to_bf16(value); break;
    case DType::f16: static_cast<uint16_t*>(data)[i] = f32_to_f16(value); break;
    case DType::i8: static_cast<int8_t*>(data)[i] = int8_t(value); break;
    case DType::i32: static_cast<int32_t*>(data)[i] = int32_t(value); break;
    case DType::u8: static_cast<uint8_t*>(data)[i] = uint8_t(value); break;
  }
}

}  // namespace ft
