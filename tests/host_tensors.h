// Small helpers shared by the op tests: random values, and host tensors made
// from and read back into plain float vectors.
#pragma once
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

}  // namespace ft::testing
