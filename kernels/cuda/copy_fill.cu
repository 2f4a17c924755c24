// copy (host <-> device, device <-> device, with dtype conversion), fill and
// copy_columns.
// Conversions run on the device: a host source is first copied as raw bytes
// into device scratch, a host destination receives raw bytes converted on the
// device, so the host side is always a plain cudaMemcpy.
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"

namespace ft {
namespace {

constexpr int kBlock = 256;

__global__ void __launch_bounds__(kBlock) convert_kernel(cuda::View dst, cuda::ConstView src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(kBlock) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kBlock)
    cuda::store(dst, i, cuda::load(src, i));
}

__global__ void __launch_bounds__(kBlock) fill_kernel(cuda::View dst, float value, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(kBlock) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kBlock)
    cuda::store(dst, i, value);
}

// One thread per copied element (i = row * width + j); dtype conversion as copy's.
__global__ void __launch_bounds__(kBlock)
    copy_columns_kernel(cuda::View dst, int64_t dst_cols, int64_t dst_offset, cuda::ConstView src, int64_t src_cols,
                        int64_t src_offset, int64_t width, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(kBlock) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kBlock) {
    int64_t row = i / width, j = i % width;
    cuda::store(dst, row * dst_cols + dst_offset + j, cuda::load(src, row * src_cols + src_offset + j));
  }
}

}  // namespace

void cuda::convert(Tensor& dst, const Tensor& src, cudaStream_t stream) {
  int64_t n = src.numel();
  launch<convert_kernel>(cuda::elementwise_blocks(n, kBlock), kBlock, 0, stream, cuda::view(dst),
                         cuda::const_view(src), n);
  FT_CUDA_CHECK_LAUNCH();
}

void CudaBackend::copy_impl(Tensor& dst, const Tensor& src) {
  if (src.numel() == 0) return;
  if (dst.dtype == src.dtype) {
    if (dst.data != src.data)
      FT_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.size_bytes(), cudaMemcpyDefault, stream_));
    if (dst.device == Device::cpu) FT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return;
  }
  const std::optional<cuda::ScratchTensor> staging = cuda::copy_scratch(dst, src);
  if (src.device == Device::cpu) {
    Tensor staged = scratch(*staging);
    FT_CUDA_CHECK(cudaMemcpyAsync(staged.data, src.data, src.size_bytes(), cudaMemcpyHostToDevice, stream_));
    cuda::convert(dst, staged, stream_);
  } else if (dst.device == Device::cpu) {
    Tensor converted = scratch(*staging);
    cuda::convert(converted, src, stream_);
    FT_CUDA_CHECK(cudaMemcpyAsync(dst.data, converted.data, dst.size_bytes(), cudaMemcpyDeviceToHost, stream_));
    FT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  } else {
    cuda::convert(dst, src, stream_);
  }
}

void CudaBackend::copy_async_impl(Tensor& dst, const Tensor& src) {
  if (src.numel() == 0) return;
  const cudaMemcpyKind kind = dst.device == Device::cpu ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
  FT_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.size_bytes(), kind, copy_stream_));
}

// Timing off: the events only order the streams.
StreamEvent CudaBackend::make_event_impl() {
  cudaEvent_t event = nullptr;
  FT_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return StreamEvent{std::shared_ptr<void>(event, [](void* e) { cudaEventDestroy(static_cast<cudaEvent_t>(e)); })};
}

void CudaBackend::record_event_impl(StreamEvent& event, Stream stream) {
  FT_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event.handle.get()), stream_of(stream)));
}

void CudaBackend::wait_event_impl(Stream stream, const StreamEvent& event) {
  FT_CUDA_CHECK(cudaStreamWaitEvent(stream_of(stream), static_cast<cudaEvent_t>(event.handle.get()), 0));
}

void CudaBackend::fill_impl(Tensor& dst, float value) {
  int64_t n = dst.numel();
  if (n == 0) return;
  launch<fill_kernel>(cuda::elementwise_blocks(n, kBlock), kBlock, 0, stream_, cuda::view(dst), value, n);
  FT_CUDA_CHECK_LAUNCH();
}

void CudaBackend::copy_columns_impl(Tensor& dst, int64_t dst_offset, const Tensor& src, int64_t src_offset,
                                    int64_t width) {
  int64_t n = dst.rows() * width;
  if (n == 0) return;
  launch<copy_columns_kernel>(cuda::elementwise_blocks(n, kBlock), kBlock, 0, stream_, cuda::view(dst), dst.cols(),
                              dst_offset, cuda::const_view(src), src.cols(), src_offset, width, n);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
