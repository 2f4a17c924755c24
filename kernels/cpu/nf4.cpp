// NF4 dequantisation of a weight tile on the CPU (kernels/nf4.h's rules);
// the NF4 linear ops multiply the tiles with the CPU GEMM
// (kernels/nf4_linear.cpp).
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/nf4.h"

namespace ft {

void CpuBackend::nf4_dequantize_impl(Tensor& tile, const Nf4Weight& w, int64_t row0, int64_t col0) {
  const int64_t R = tile.rows(), C = tile.cols(), K = w.in_features;
  if (R == 0 || C == 0) return;
  // The absmax of the blocks the tile touches, recovered in f32 once.
  const int64_t first_block = (row0 * K + col0) / kNf4BlockSize;
  const int64_t last_block = ((row0 + R - 1) * K + col0 + C - 1) / kNf4BlockSize;
  std::vector<float> absmax(size_t(last_block - first_block + 1));
  if (w.double_quant()) {
    const uint8_t* codes = w.absmax->ptr<const uint8_t>();
    const float* nested = w.nested_absmax->ptr<const float>();
    const float* map = w.nested_map->ptr<const float>();
    for (int64_t b = first_block; b <= last_block; ++b) {
      nf4_dequantize_absmax(&absmax[size_t(b - first_block)], codes + b, 1, nested + b / kNf4NestedBlockSize, map,
                            w.nested_offset);
    }
  } else {
    const float* source = w.absmax->ptr<const float>() + first_block;
    absmax.assign(source, source + absmax.size());
  }
  const uint8_t* packed = w.codes->ptr<const uint8_t>();
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(C));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < R; ++r) {
      const int64_t e0 = (row0 + r) * K + col0;
      for (int64_t c = 0; c < C; ++c) {
        const int64_t e = e0 + c;
        row[c] = kNf4Codes[nf4_index(packed, e)] * absmax[size_t(e / kNf4BlockSize - first_block)];
      }
      cpu::store_row(tile, r * C, row.data(), C);
    }
  }
}

}  // namespace ft
