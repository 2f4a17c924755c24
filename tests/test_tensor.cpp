// Tensors and the tracking allocator.
#include <doctest/doctest.h>

#include "kernels/error.h"
#include "kernels/tensor.h"

using namespace ft;

TEST_CASE("tracking allocator counts current and peak bytes per category") {
  HostAllocator host;
  TrackingAllocator tracker(host);
  {
    Tensor weights = Tensor::empty({3, 5}, DType::bf16, tracker, MemCategory::weights);
    Tensor scratch = Tensor::empty({7}, DType::f32, tracker, MemCategory::activations);
    CHECK(tracker.stats().current(MemCategory::weights) == 30);
    CHECK(tracker.stats().current(MemCategory::activations) == 28);
    CHECK(tracker.stats().total_current_bytes == 58);
  }
  MemoryStats stats = tracker.stats();
  CHECK(stats.total_current_bytes == 0);
  CHECK(stats.peak(MemCategory::weights) == 30);
  CHECK(stats.total_peak_bytes == 58);
  tracker.reset_peaks();
  CHECK(tracker.stats().total_peak_bytes == 0);
}

TEST_CASE("meta tensors have shapes and byte counts but no data") {
  MetaAllocator meta;
  TrackingAllocator tracker(meta);
  Tensor big = Tensor::empty({50432, 6144}, DType::bf16, tracker, MemCategory::weights);
  CHECK(big.data == nullptr);
  CHECK(big.device == Device::meta);
  CHECK(tracker.stats().current(MemCategory::weights) == size_t(50432) * 6144 * 2);
}

TEST_CASE("views share storage and check their ranges") {
  HostAllocator host;
  Tensor matrix = Tensor::empty({4, 3}, DType::f32, host, MemCategory::activations);
  for (int i = 0; i < 12; ++i) matrix.ptr<float>()[i] = float(i);
  Tensor rows = matrix.slice_rows(1, 2);
  CHECK(rows.shape == Shape{2, 3});
  CHECK(rows.ptr<float>()[0] == 3.0f);
  CHECK(matrix.reshaped({2, 6}).dim(-1) == 6);
  CHECK_THROWS_AS(matrix.slice_rows(3, 2), Error);
  CHECK_THROWS_AS(matrix.reshaped({5, 2}), Error);
}

TEST_CASE("bf16 conversion rounds to nearest even") {
  // 1 + 2^-8 lies exactly between two bf16 values (1 and 1 + 2^-7): ties go to even (1).
  CHECK(f32_to_bf16(1.0f + 1.0f / 256) == f32_to_bf16(1.0f));
  // 1 + 3*2^-8 ties between 1 + 2^-7 (odd mantissa) and 1 + 2^-6 (even): rounds up.
  CHECK(bf16_to_f32(f32_to_bf16(1.0f + 3.0f / 256)) == 1.0f + 1.0f / 64);
  CHECK(bf16_to_f32(f32_to_bf16(3.14159265f)) == 3.140625f);
  CHECK(f16_to_f32(f32_to_f16(3.14159265f)) == 3.140625f);
}
