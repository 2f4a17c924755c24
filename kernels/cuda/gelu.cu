// GELU in the two forms Hugging Face configs name (GeluKind): the exact erf
// form and the tanh approximation. Every thread loads all inputs of its
// element before storing, so out may alias x and dx may alias dout.
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"

namespace ft {
namespace {

constexpr int kBlock = 256;
constexpr float kSqrtHalf = 0.70710678118654752f;     // 1 / sqrt(2)
constexpr float kInvSqrt2Pi = 0.39894228040143268f;   // 1 / sqrt(2 pi)
constexpr float kSqrt2OverPi = 0.79788456080286536f;  // sqrt(2 / pi)
constexpr float kCubic = 0.044715f;

// erff/tanhf/expf, not fast intrinsics: __expf's error grows for large |x|.
__device__ inline float gelu(float x, GeluKind kind) {
  if (kind == GeluKind::erf) return 0.5f * x * (1.0f + erff(x * kSqrtHalf));
  return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kCubic * x * x * x)));
}

// erf:  Phi(x) + x * phi(x), phi the standard normal density.
// tanh: with t = tanh(u), u = sqrt(2/pi) (x + c x^3):
//       0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 c x^2).
__device__ inline float gelu_grad(float x, GeluKind kind) {
  if (kind == GeluKind::erf) return 0.5f * (1.0f + erff(x * kSqrtHalf)) + x * kInvSqrt2Pi * expf(-0.5f * x * x);
  float t = tanhf(kSqrt2OverPi * (x + kCubic * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
}

__global__ void __launch_bounds__(kBlock) gelu_forward_kernel(cuda::View out, cuda::ConstView x, GeluKind kind,
                                                              int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(kBlock) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kBlock)
    cuda::store(out, i, gelu(cuda::load(x, i), kind));
}

__global__ void __launch_bounds__(kBlock)
    gelu_backward_kernel(cuda::View dx, cuda::ConstView dout, cuda::ConstView x, GeluKind kind, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(kBlock) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kBlock)
    cuda::store(dx, i, cuda::load(dout, i) * gelu_grad(cuda::load(x, i), kind));
}

}  // namespace

void CudaBackend::gelu_forward_impl(Tensor& out, const Tensor& x, GeluKind kind) {
  int64_t n = out.numel();
  if (n == 0) return;
  launch<gelu_forward_kernel>(cuda::elementwise_blocks(n, kBlock), kBlock, 0, stream_, cuda::view(out),
                              cuda::const_view(x), kind, n);
  FT_CUDA_CHECK_LAUNCH();
}

void CudaBackend::gelu_backward_impl(Tensor& dx, const Tensor& dout, const Tensor& x, GeluKind kind) {
  int64_t n = dx.numel();
  if (n == 0) return;
  launch<gelu_backward_kernel>(cuda::elementwise_blocks(n, kBlock), kBlock, 0, stream_, cuda::view(dx),
                               cuda::const_view(dout), cuda::const_view(x), kind, n);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
