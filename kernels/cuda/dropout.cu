// Dropout with the counter-based mask of kernels/dropout_hash.h: keep[i]
// depends only on (seed, i), so every backend draws the same mask and
// backward redraws it. Each element is loaded before it is stored, so the
// output may alias the input. add_uniform_noise draws from the same hash.
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/dropout_hash.h"

namespace ft {
namespace {

constexpr int kBlock = 256;

// Dropped elements are selected to 0 rather than multiplied, so p = 1 gives
// zeros instead of 0 * inf = NaN (as the CPU backend and PyTorch).
__global__ void __launch_bounds__(kBlock)
    dropout_kernel(cuda::View out, cuda::ConstView x, float p, float scale, uint64_t seed, int64_t n, int64_t cols,
                   int64_t row_stride) {
  for (int64_t i = blockIdx.x * int64_t(kBlock) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kBlock) {
    float value = cuda::load(x, i);
    const int64_t index = row_stride == cols ? i : i / cols * row_stride + i % cols;
    cuda::store(out, i, dropout_keep(seed, uint64_t(index), p) ? value * scale : 0.0f);
  }
}

__global__ void __launch_bounds__(kBlock)
    uniform_noise_kernel(cuda::View x, float magnitude, uint64_t seed, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(kBlock) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kBlock)
    cuda::store(x, i, add_uniform_noise_value(cuda::load(x, i), seed, uint64_t(i), magnitude));
}

void apply_dropout_mask(Tensor& out, const Tensor& x, float p, uint64_t seed, int64_t row_stride,
                        cudaStream_t stream) {
  int64_t n = out.numel();
  if (n == 0) return;
  float scale = 1.0f / (1.0f - p);
  launch<dropout_kernel>(cuda::elementwise_blocks(n, kBlock), kBlock, 0, stream, cuda::view(out),
                         cuda::const_view(x), p, scale, seed, n, x.cols(), row_stride);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void CudaBackend::dropout_forward_impl(Tensor& out, const Tensor& x, float p, uint64_t seed, int64_t row_stride) {
  apply_dropout_mask(out, x, p, seed, row_stride, stream_);
}

// The derivative of x * keep / (1 - p) is the same mask and scale.
void CudaBackend::dropout_backward_impl(Tensor& dx, const Tensor& dout, float p, uint64_t seed, int64_t row_stride) {
  apply_dropout_mask(dx, dout, p, seed, row_stride, stream_);
}

void CudaBackend::add_uniform_noise_impl(Tensor& x, float magnitude, uint64_t seed) {
  const int64_t n = x.numel();
  if (n == 0) return;
  launch<uniform_noise_kernel>(cuda::elementwise_blocks(n, kBlock), kBlock, 0, stream_, cuda::view(x), magnitude,
                               seed, n);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
