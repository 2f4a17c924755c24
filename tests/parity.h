// Helpers for the tests that compare a model with transformers/PEFT fixtures
// (tests/fixtures/README.md).
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "kernels/allocator.h"
#include "kernels/tensor.h"

namespace ft::parity {

// Relative error of a tensor as one number: max |got - want| / max |want|.
// Per-element relative error is meaningless for entries near zero.
inline double relative_error(const Tensor& got, const Tensor& want) {
  REQUIRE(got.numel() == want.numel());
  double max_diff = 0.0, max_want = 0.0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    double g = load_as_f32(got.data, got.dtype, i), w = load_as_f32(want.data, want.dtype, i);
    max_diff = std::max(max_diff, std::abs(g - w));
    max_want = std::max(max_want, std::abs(w));
  }
  return max_diff / std::max(max_want, 1e-30);
}

// HF's causal-LM loss shifts labels: position t predicts labels[t + 1].
inline Tensor shifted_targets(const Tensor& labels, HostAllocator& host) {
  Tensor targets = Tensor::empty(labels.shape, DType::i32, host, MemCategory::activations);
  const int64_t B = labels.dim(0), T = labels.dim(1);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      targets.ptr<int32_t>()[b * T + t] = t + 1 < T ? labels.ptr<int32_t>()[b * T + t + 1] : -100;
  return targets;
}

}  // namespace ft::parity
