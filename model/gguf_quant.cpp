#include "model/gguf_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/dtype.h"
#include "kernels/error.h"

namespace ft {
namespace {

void quantize_q8_0_block(const float* x, uint8_t* out) {
  float amax = 0.0f;
  for (int64_t j = 0; j < kQ8BlockValues; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
  const uint16_t d_bits = f32_to_f16(d);
  std::memcpy(out, &d_bits, 2);
  for (int64_t j = 0; j < kQ8BlockValues; ++j) out[2 + j] = uint8_t(int8_t(std::round(x[j] * inverse)));
}

}  // namespace

std::vector<uint8_t> to_ggml(const float* values, int64_t numel, GgmlType type) {
  FT_CHECK(type != GgmlType::q8_0 || numel % kQ8BlockValues == 0, "Q8_0 needs a multiple of 32 values, got ", numel);
  std::vector<uint8_t> out(ggml_size_bytes(type, numel));
  switch (type) {
    case GgmlType::f32:
      std::memcpy(out.data(), values, out.size());
      break;
    case GgmlType::f16:
    case GgmlType::bf16:
      for (int64_t i = 0; i < numel; ++i) {
        const uint16_t bits = type == GgmlType::f16 ? f32_to_f16(values[i]) : f32_to_bf16(values[i]);
        std::memcpy(out.data() + 2 * i, &bits, 2);
      }
      break;
    case GgmlType::q8_0:
      for (int64_t block = 0; block < numel / kQ8BlockValues; ++block)
        quantize_q8_0_block(values + block * kQ8BlockValues, out.data() + size_t(block) * kQ8BlockBytes);
      break;
  }
  return out;
}

std::vector<float> from_ggml(const uint8_t* data, int64_t numel, GgmlType type) {
  std::vector<float> out(static_cast<size_t>(numel));
  for (int64_t i = 0; i < numel; ++i) {
    if (type == GgmlType::f32) {
      std::memcpy(&out[i], data + 4 * i, 4);
    } else if (type == GgmlType::q8_0) {
      const uint8_t* block = data + size_t(i / kQ8BlockValues) * kQ8BlockBytes;
      out[i] = f16_to_f32(load_unaligned<uint16_t>(block, 0)) * float(int8_t(block[2 + i % kQ8BlockValues]));
    } else {
      const uint16_t bits = load_unaligned<uint16_t>(data, i);
      out[i] = type == GgmlType::f16 ? f16_to_f32(bits) : bf16_to_f32(bits);
    }
  }
  return out;
}

}  // namespace ft
