// Small helpers shared by the tests: random values, host tensors made from
// and read back into plain float vectors, and bitwise tensor equality.
#pragma once
#include <cstring>
#include <random>
#include <vector>

#include "kernels/backend.h"

namespace ft::testing {

inline std::vector<float> gaussian(int64_t n, float sigma, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> values(static_cast<size_t>(n));
  for (float& v : values) v = dist(rng);
  return values;
}

inline Tensor make(Backend& backend, const Shape& shape, const std::vector<float>& values, DType dtype = DType::f32) {
  Tensor t = backend.empty(shape, dtype, MemCategory::activations);
  for (int64_t i = 0; i < t.numel(); ++i) store_from_f32(t.data, dtype, i, values[size_t(i)]);
  return t;
}

inline std::vector<float> read(const Tensor& t) {
  std::vector<float> values(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) values[size_t(i)] = load_as_f32(t.data, t.dtype, i);
  return values;
}

// Same dtype, shape and bytes. An empty tensor's data may be null, which
// memcmp must not see even for 0 bytes.
inline bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype == b.dtype && a.shape == b.shape &&
         (a.size_bytes() == 0 || std::memcmp(a.data, b.data, a.size_bytes()) == 0);
}

}  // namespace ft::testing
