// copy (with dtype conversion) and fill.
#include <algorithm>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_util.h"

namespace ft {

static bool is_floating(DType dtype) { return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16; }

void CpuBackend::copy(Tensor& dst, const Tensor& src) {
  cpu::check_on_cpu(dst, "copy", "dst");
  cpu::check_on_cpu(src, "copy", "src");
  FT_CHECK(dst.numel() == src.numel(), "copy: dst ", shape_string(dst.shape), " and src ", shape_string(src.shape),
           " have different element counts");
  if (dst.dtype == src.dtype) {
    if (dst.data != src.data) std::memcpy(dst.data, src.data, src.size_bytes());
    return;
  }
  FT_CHECK(is_floating(dst.dtype) && is_floating(src.dtype), "copy: cannot convert ", dtype_name(src.dtype), " to ",
           dtype_name(dst.dtype));
  int64_t n = src.numel();
#pragma omp parallel for schedule(static)
  for (int64_t start = 0; start < n; start += cpu::kChunk) {
    float scratch[cpu::kChunk];
    int64_t count = std::min(cpu::kChunk, n - start);
    cpu::load_row(scratch, src, start, count);
    cpu::store_row(dst, start, scratch, count);
  }
}

void CpuBackend::fill(Tensor& dst, float value) {
  cpu::check_on_cpu(dst, "fill", "dst");
  int64_t n = dst.numel();
  if (dst.dtype == DType::f32) {
    std::fill_n(dst.ptr<float>(), n, value);
  } else if (dst.dtype == DType::bf16 || dst.dtype == DType::f16) {
    uint16_t bits = dst.dtype == DType::bf16 ? f32_to_bf16(value) : f32_to_f16(value);
    std::fill_n(dst.ptr<uint16_t>(), n, bits);
  } else {
    for (int64_t i = 0; i < n; ++i) store_from_f32(dst.data, dst.dtype, i, value);
  }
}

}  // namespace ft
