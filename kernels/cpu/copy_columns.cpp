// A block of columns copied between two row-matched 2-D views: how fused
// projections (GPT-NeoX's query_key_value) are split into their parts and
// their gradients put back together.
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_util.h"

namespace ft {

void CpuBackend::copy_columns(Tensor& dst, int64_t dst_offset, const Tensor& src, int64_t src_offset,
                              int64_t width) {
  const char* op = "copy_columns";
  cpu::check_float(dst, op, "dst");
  cpu::check_float(src, op, "src");
  FT_CHECK(dst.rows() == src.rows(), op, ": dst ", shape_string(dst.shape), " and src ", shape_string(src.shape),
           " differ in rows");
  FT_CHECK(width >= 0 && dst_offset >= 0 && src_offset >= 0 && dst_offset + width <= dst.cols() &&
               src_offset + width <= src.cols(),
           op, ": columns [", dst_offset, ", ", dst_offset + width, ") of dst ", shape_string(dst.shape),
           " or [", src_offset, ", ", src_offset + width, ") of src ", shape_string(src.shape), " out of range");
  FT_CHECK(dst.data != src.data, op, ": dst and src must not alias");
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
