// copy (with dtype conversion) and fill.
#include <algorithm>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_util.h"

namespace ft {

void CpuBackend::copy_impl(Tensor& dst, const Tensor& src) {
  if (dst.dtype == src.dtype) {
    if (dst.data != src.data) std::memcpy(dst.data, src.data, src.size_bytes());
    return;
  }
  cpu::for_each_chunk(src.numel(), [&](int64_t start, int64_t count) {
    float scratch[cpu::kChunk];
    cpu::load_row(scratch, src, start, count);
    cpu::store_row(dst, start, scratch, count);
  });
}

// Everything runs at issue on the CPU: the copy is done when copy_async
// returns, so there is nothing for an event to mark.
void CpuBackend::copy_async_impl(Tensor& dst, const Tensor& src) {
  if (dst.data != src.data) std::memcpy(dst.data, src.data, src.size_bytes());
}
StreamEvent CpuBackend::make_event_impl() { return {}; }
void CpuBackend::record_event_impl(StreamEvent&, Stream) {}
void CpuBackend::wait_event_impl(Stream, const StreamEvent&) {}

void CpuBackend::fill_impl(Tensor& dst, float value) {
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
