// grad += alpha * a^T b with the rows' terms added in row order (the
// contract in kernels/backend.h): each thread owns tiles of grad, held in an
// f32 buffer of at most kTileElements while every row of a and b goes by, so
// an element's sum runs n = 0, 1, ... whatever the tiling. The rows are
// converted to f32 kRowBlock at a time, so the conversion is amortised over
// the tile's width and height.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/cpu/isa.h"

namespace ft {
namespace {

constexpr int64_t kTileElements = 1024;  // 4 KiB of f32 sums per tile: stays in L1
constexpr int64_t kMaxTileCols = 128;
constexpr int64_t kRowBlock = 64;

// sums [rows, cols] += the terms of rows [0, count) of a_block [count, rows]
// and b_block [count, cols], in row order.
FT_AVX512_VERSIONS(void, add_row_terms,
                   (float* sums, const float* a_block, const float* b_block, int64_t count, int64_t rows, int64_t cols,
                    float alpha),
                   (sums, a_block, b_block, count, rows, cols, alpha)) {
  for (int64_t n = 0; n < count; ++n)
    for (int64_t i = 0; i < rows; ++i) {
      const float ai = alpha * a_block[n * rows + i];
      const float* b = b_block + n * cols;
      float* sum = sums + i * cols;
      for (int64_t j = 0; j < cols; ++j) sum[j] = std::fma(ai, b[j], sum[j]);
    }
}

}  // namespace

void CpuBackend::accumulate_outer_products_impl(Tensor& grad, const Tensor& a, const Tensor& b, float alpha) {
  const int64_t N = a.rows(), M = a.cols(), P = b.cols();
  if (N == 0 || M == 0 || P == 0) return;
  const int64_t tile_cols = std::min(P, kMaxTileCols), tile_rows = std::min(M, kTileElements / tile_cols);
  const int64_t row_tiles = (M + tile_rows - 1) / tile_rows, col_tiles = (P + tile_cols - 1) / tile_cols;
#pragma omp parallel
  {
    std::vector<float> sums(size_t(tile_rows * tile_cols));
    std::vector<float> a_block(size_t(kRowBlock * tile_rows)), b_block(size_t(kRowBlock * tile_cols));
#pragma omp for collapse(2) schedule(static)
    for (int64_t ti = 0; ti < row_tiles; ++ti)
      for (int64_t tj = 0; tj < col_tiles; ++tj) {
        const int64_t i0 = ti * tile_rows, j0 = tj * tile_cols;
        const int64_t rows = std::min(tile_rows, M - i0), cols = std::min(tile_cols, P - j0);
        for (int64_t i = 0; i < rows; ++i) cpu::load_row(sums.data() + i * cols, grad, (i0 + i) * P + j0, cols);
        for (int64_t n0 = 0; n0 < N; n0 += kRowBlock) {
          const int64_t count = std::min(kRowBlock, N - n0);
          for (int64_t n = 0; n < count; ++n) {
            cpu::load_row(a_block.data() + n * rows, a, (n0 + n) * M + i0, rows);
            cpu::load_row(b_block.data() + n * cols, b, (n0 + n) * P + j0, cols);
          }
          add_row_terms(sums.data(), a_block.data(), b_block.data(), count, rows, cols, alpha);
        }
        for (int64_t i = 0; i < rows; ++i) cpu::store_row(grad, (i0 + i) * P + j0, sums.data() + i * cols, cols);
      }
  }
  note_path(cpu::avx512_versions_isa());
}

}  // namespace ft
