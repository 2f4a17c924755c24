// A block of columns copied between two row-matched 2-D views: how fused
// projections (GPT-NeoX's query_key_value) are split into their parts and
// their gradients put back together.
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_util.h"

namespace ft {

void CpuBackend::copy_columns_impl(Tensor& dst, int64_t dst_offset, const Tensor& src, int64_t src_offset,
                                   int64_t width) {
  int64_t rows = dst.rows();
#pragma omp parallel
  {
    std::vector<float> row(width);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < rows; ++n) {
      cpu::load_row(row.data(), src, n * src.cols() + src_offset, width);
      cpu::store_row(dst, n * dst.cols() + dst_offset, row.data(), width);
    }
  }
}

}  // namespace ft
