// Dropout with a counter-based mask (kernels/dropout_hash.h): keep[i] depends
// only on (seed, i), so backward redraws it and nothing is saved. Chunks are
// loaded before they are stored, so out may alias x.
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/dropout_hash.h"

namespace ft {

// out = x * keep / (1 - p). Dropped elements are selected to 0 rather than
// multiplied, so p = 1 gives zeros (as PyTorch) instead of 0 * inf = NaN.
// Element i of x (cols per row) draws mask index (i / cols) * row_stride + i % cols.
static void apply_dropout_mask(Tensor& out, const Tensor& x, float p, uint64_t seed, int64_t row_stride) {
  const float scale = 1.0f / (1.0f - p);
  const int64_t cols = x.cols();
  cpu::for_each_chunk(out.numel(), [&](int64_t start, int64_t count) {
    float buf[cpu::kChunk];
    cpu::load_row(buf, x, start, count);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t flat = start + i;
      const int64_t index = row_stride == cols ? flat : flat / cols * row_stride + flat % cols;
      buf[i] = dropout_keep(seed, uint64_t(index), p) ? buf[i] * scale : 0.0f;
    }
    cpu::store_row(out, start, buf, count);
  });
}

void CpuBackend::dropout_forward_impl(Tensor& out, const Tensor& x, float p, uint64_t seed, int64_t row_stride) {
  apply_dropout_mask(out, x, p, seed, row_stride);
}

// The derivative of x * keep / (1 - p) is the same mask and scale.
void CpuBackend::dropout_backward_impl(Tensor& dx, const Tensor& dout, float p, uint64_t seed, int64_t row_stride) {
  apply_dropout_mask(dx, dout, p, seed, row_stride);
}

}  // namespace ft
