#include "kernels/nf4.h"

#include <algorithm>
#include <cmath>

#include "kernels/error.h"

namespace ft {

void nf4_quantize(const float* x, int64_t n, uint8_t* packed, float* absmax) {
  float midpoints[15];
  for (int i = 0; i < 15; ++i) midpoints[i] = (kNf4Codes[i] + kNf4Codes[i + 1]) / 2.0f;
  std::fill_n(packed, nf4_packed_bytes(n), uint8_t(0));
  for (int64_t b = 0; b < nf4_blocks(n); ++b) {
    const int64_t begin = b * kNf4BlockSize, end = std::min(n, begin + kNf4BlockSize);
    float block_max = 0.0f;
    for (int64_t e = begin; e < end; ++e) block_max = std::max(block_max, std::fabs(x[e]));
    absmax[b] = block_max;
    const float inverse = 1.0f / std::max(block_max, 1e-38f);
    for (int64_t e = begin; e < end; ++e) {
      const float s = std::clamp(x[e] * inverse, -1.0f, 1.0f);
      int index = 0;
      while (index < 15 && midpoints[index] < s) ++index;
      packed[e / 2] |= uint8_t(e % 2 == 0 ? index << 4 : index);
    }
  }
}

// torch.linspace(0.1, 1, steps) in f32 as PyTorch's CPU kernel computes it:
// from the start for the first half, from the end for the rest, each value
// one fused multiply-add (the compiled kernel's contraction; checked against
// bitsandbytes' map in tests/test_nf4.cpp).
static std::vector<float> linspace_f32(int64_t steps) {
  const float start = 0.1f, end = 1.0f, step = (end - start) / float(steps - 1);
  std::vector<float> values(static_cast<size_t>(steps));
  for (int64_t i = 0; i < steps; ++i)
    values[i] = i < steps / 2 ? std::fma(step, float(i), start) : std::fma(-step, float(steps - i - 1), end);
  return values;
}

// torch.mean of f32 values as PyTorch's CPU sum computes it with AVX2: four
// accumulators of eight lanes over chunks of 32, added lane-wise, then the
// remaining 8-wide vectors, the lanes in order and the scalar tail, all in
// f32, divided by n in f32. bitsandbytes takes the double-quantisation
// offset from it; matched on all 15 absmax arrays of tests/fixtures/nf4/
// (PyTorch on an AVX-512 machine uses 16 lanes and may differ by an ulp).
static float torch_mean_f32(const float* x, int64_t n) {
  constexpr int64_t kLanes = 8, kAccumulators = 4, kChunk = kLanes * kAccumulators;
  float acc[kAccumulators][kLanes] = {};
  int64_t i = 0;
  for (; i + kChunk <= n; i += kChunk)
    for (int64_t a = 0; a < kAccumulators; ++a)
      for (int64_t l = 0; l < kLanes; ++l) acc[a][l] += x[i + a * kLanes + l];
  float lanes[kLanes];
  for (int64_t l = 0; l < kLanes; ++l) {
    lanes[l] = acc[0][l];
    for (int64_t a = 1; a < kAccumulators; ++a) lanes[l] += acc[a][l];
  }
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] += x[i + l];
  float sum = 0.0f;
  for (int64_t l = 0; l < kLanes; ++l) sum += lanes[l];
  for (; i < n; ++i) sum += x[i];
  return sum / float(n);
}

std::vector<float> dynamic_map_8bit() {
  constexpr int kExponentBits = 7;
  std::vector<float> map;
  for (int i = 0; i < kExponentBits; ++i) {
    const std::vector<float> bounds = linspace_f32((int64_t(1) << i) + 1);
    // A Python float times an f32 tensor: PyTorch multiplies in f32.
    const float scale = float(std::pow(10.0, double(-(kExponentBits - 1) + i)));
    for (size_t j = 0; j + 1 < bounds.size(); ++j) {
      const float mean = (bounds[j] + bounds[j + 1]) / 2.0f;
      map.push_back(scale * mean);
      map.push_back(-scale * mean);
    }
  }
  map.push_back(0.0f);
  map.push_back(1.0f);
  FT_CHECK(map.size() == 256, "dynamic_map_8bit: built ", map.size(), " values, expected 256");
  std::sort(map.begin(), map.end());
  return map;
}

// The nearest map value to v, ties to the lower index; map[0] read as -1.
// bitsandbytes' native kernel finds an index by an approximate bucket search
// and compares it with the next only, so it can keep the second-nearest code
// (rarely: tests/fixtures/README.md, nf4/); this is the exact nearest.
static uint8_t nearest_code(const std::vector<float>& map, float v) {
  auto value = [&](size_t i) { return i == 0 ? -1.0f : map[i]; };
  size_t left = 0;
  while (left + 1 < map.size() && value(left + 1) <= v) ++left;
  if (left + 1 < map.size() && std::fabs(v - value(left + 1)) < std::fabs(v - value(left))) ++left;
  return uint8_t(left);
}

Nf4DoubleQuant nf4_double_quantize(const float* absmax, int64_t blocks, const std::vector<float>& map) {
  Nf4DoubleQuant q;
  q.offset = blocks > 0 ? torch_mean_f32(absmax, blocks) : 0.0f;
  q.codes.resize(size_t(blocks));
  q.nested_absmax.resize(size_t(nf4_nested_blocks(blocks)));
  const size_t zero = size_t(std::find(map.begin(), map.end(), 0.0f) - map.begin());
  for (int64_t nb = 0; nb < int64_t(q.nested_absmax.size()); ++nb) {
    const int64_t begin = nb * kNf4NestedBlockSize, end = std::min(blocks, begin + kNf4NestedBlockSize);
    float block_max = 0.0f;
    for (int64_t b = begin; b < end; ++b) block_max = std::max(block_max, std::fabs(absmax[b] - q.offset));
    q.nested_absmax[nb] = block_max;
    for (int64_t b = begin; b < end; ++b)
      q.codes[b] = block_max == 0.0f ? uint8_t(zero) : nearest_code(map, (absmax[b] - q.offset) / block_max);
  }
  return q;
}

void nf4_dequantize_absmax(float* absmax, const uint8_t* codes, int64_t blocks, const float* nested_absmax,
                           const float* map, float offset) {
  for (int64_t b = 0; b < blocks; ++b) {
    // volatile: the product is rounded before the add, never fused into an fma.
    volatile float scaled = map[codes[b]] * nested_absmax[b / kNf4NestedBlockSize];
    absmax[b] = scaled + offset;
  }
}

}  // namespace ft
