// Helpers shared by the CPU ops: row conversions between a tensor's storage
// dtype and f32 scratch buffers (the dtype switch sits outside the loop so each
// loop vectorises), and the parallel loop over fixed chunks that elementwise
// ops run those conversions in. Arguments are checked by Backend before an op
// runs.
#pragma once
#include <algorithm>
#include <cstring>

#include "kernels/op_profile.h"
#include "kernels/tensor.h"

namespace ft::cpu {

// dst[0, count) = elements [offset, offset + count) of t as f32.
inline void load_row(float* dst, const Tensor& t, int64_t offset, int64_t count) {
  if (t.dtype == DType::f32) {
    std::memcpy(dst, t.ptr<const float>() + offset, size_t(count) * sizeof(float));
  } else if (t.dtype == DType::bf16) {
    const uint16_t* src = t.ptr<const uint16_t>() + offset;
    for (int64_t i = 0; i < count; ++i) dst[i] = bf16_to_f32(src[i]);
  } else {
    for (int64_t i = 0; i < count; ++i) dst[i] = load_as_f32(t.data, t.dtype, offset + i);
  }
}

// Elements [offset, offset + count) of t = src converted to t's dtype.
inline void store_row(Tensor& t, int64_t offset, const float* src, int64_t count) {
  if (t.dtype == DType::f32) {
    std::memcpy(t.ptr<float>() + offset, src, size_t(count) * sizeof(float));
  } else if (t.dtype == DType::bf16) {
    uint16_t* dst = t.ptr<uint16_t>() + offset;
    for (int64_t i = 0; i < count; ++i) dst[i] = f32_to_bf16(src[i]);
  } else {
    for (int64_t i = 0; i < count; ++i) store_from_f32(t.data, t.dtype, offset + i, src[i]);
  }
}

// A fused norm's input row: row = a + b stored to sum and read back, so the
// statistics see sum as rounded to its dtype, exactly as add followed by the
// norm on sum. b's row goes through scratch; sum may alias a or b.
inline void load_sum_row(float* row, float* scratch, Tensor& sum, const Tensor& a, const Tensor& b, int64_t offset,
                         int64_t count) {
  load_row(row, a, offset, count);
  load_row(scratch, b, offset, count);
  for (int64_t i = 0; i < count; ++i) row[i] += scratch[i];
  store_row(sum, offset, row, count);
  load_row(row, sum, offset, count);
}

// A fused norm backward's output row: grad rounded to dx's dtype (stored and
// read back), plus dresidual, stored rounded again, exactly as the norm's
// backward into a dx-typed tensor followed by add. dresidual is read first,
// so dx may alias it; grad is clobbered.
inline void store_grad_plus_row(Tensor& dx, float* grad, float* scratch, const Tensor& dresidual, int64_t offset,
                                int64_t count) {
  load_row(scratch, dresidual, offset, count);
  store_row(dx, offset, grad, count);
  load_row(grad, dx, offset, count);
  for (int64_t i = 0; i < count; ++i) grad[i] += scratch[i];
  store_row(dx, offset, grad, count);
}

// Elementwise ops work through f32 scratch in chunks of this many elements:
// small enough for the stack and L1, large enough to amortise the loop setup.
constexpr int64_t kChunk = 1024;

// body(start, count) for each chunk [start, start + count) of [0, n), count
// at most kChunk, so a body's scratch fits in kChunk floats on its stack. The
// chunks are shared out among the threads by a static schedule; their bounds
// depend only on n, so per-chunk work (a partial sum, an element's index) is
// the same for any thread count.
template <typename Body>
void for_each_chunk(int64_t n, const Body& body) {
#pragma omp parallel for schedule(static)
  for (int64_t start = 0; start < n; start += kChunk) body(start, std::min(kChunk, n - start));
}

}  // namespace ft::cpu
