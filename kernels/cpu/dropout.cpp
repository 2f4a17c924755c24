// Dropout with a counter-based mask (kernels/dropout_hash.h): keep[i] depends
// only on (seed, i), so backward redraws it and nothing is saved. Chunks are
// loaded before they are stored, so out may alias x. add_uniform_noise draws
// from the same hash.
#include <algorithm>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/cpu/isa.h"
#include "kernels/dropout_hash.h"

namespace ft {

// buf[i] = keep(first + i) ? buf[i] * scale : 0 for i < count. The hash's
// 64-bit multiplies vectorise with AVX-512's vpmullq and not with AVX2 (the
// kernels' baseline): the x86-64-v4 version (kernels/cpu/isa.h) is 7x the
// baseline's speed where the CPU has it (0.22 against 1.58 ns an element on
// an AVX-512 EPYC), with the same integer arithmetic, so the same mask.
FT_AVX512_VERSIONS(void, mask_run, (float* buf, int64_t count, uint64_t first, uint64_t seed, float p, float scale),
                   (buf, count, first, seed, p, scale)) {
  for (int64_t i = 0; i < count; ++i) buf[i] = dropout_keep(seed, first + uint64_t(i), p) ? buf[i] * scale : 0.0f;
}

// out = x * keep / (1 - p). Dropped elements are selected to 0 rather than
// multiplied, so p = 1 gives zeros (as PyTorch) instead of 0 * inf = NaN.
// Element i of x (cols per row) draws mask index (i / cols) * row_stride + i % cols.
static void apply_dropout_mask(Tensor& out, const Tensor& x, float p, uint64_t seed, int64_t row_stride) {
  const float scale = 1.0f / (1.0f - p);
  const int64_t cols = x.cols();
  cpu::for_each_chunk(out.numel(), [&](int64_t start, int64_t count) {
    float buf[cpu::kChunk];
    cpu::load_row(buf, x, start, count);
    for (int64_t i = 0; i < count;) {  // runs of consecutive mask indices: the chunk's parts of its rows
      const int64_t flat = start + i, run = std::min(count - i, cols - flat % cols);
      mask_run(buf + i, run, uint64_t(flat / cols * row_stride + flat % cols), seed, p, scale);
      i += run;
    }
    cpu::store_row(out, start, buf, count);
  });
}

void CpuBackend::dropout_forward_impl(Tensor& out, const Tensor& x, float p, uint64_t seed, int64_t row_stride) {
  apply_dropout_mask(out, x, p, seed, row_stride);
  note_path(cpu::avx512_versions_isa());
}

// The derivative of x * keep / (1 - p) is the same mask and scale.
void CpuBackend::dropout_backward_impl(Tensor& dx, const Tensor& dout, float p, uint64_t seed, int64_t row_stride) {
  apply_dropout_mask(dx, dout, p, seed, row_stride);
  note_path(cpu::avx512_versions_isa());
}

// buf[i] += element (first + i)'s noise for i < count; as mask_run, the
// AVX-512 version only vectorises the hash's 64-bit multiplies.
FT_AVX512_VERSIONS(void, noise_run, (float* buf, int64_t count, uint64_t first, uint64_t seed, float magnitude),
                   (buf, count, first, seed, magnitude)) {
  for (int64_t i = 0; i < count; ++i) buf[i] = add_uniform_noise_value(buf[i], seed, first + uint64_t(i), magnitude);
}

void CpuBackend::add_uniform_noise_impl(Tensor& x, float magnitude, uint64_t seed) {
  cpu::for_each_chunk(x.numel(), [&](int64_t start, int64_t count) {
    float buf[cpu::kChunk];
    cpu::load_row(buf, x, start, count);
    noise_run(buf, count, uint64_t(start), seed, magnitude);
    cpu::store_row(x, start, buf, count);
  });
  note_path(cpu::avx512_versions_isa());
}

}  // namespace ft
