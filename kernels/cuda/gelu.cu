// GELU in the two forms Hugging Face configs name (GeluKind): the exact erf
// form and the tanh approximation. Every thread loads all inputs of its
// element before storing, so out may alias x and dx may alias dout. T5's MLP
// activation (relu, or the tanh form gated by up) reuses them.
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

__device__ inline float activation(float x, Activation kind) {
  return kind == Activation::relu ? fmaxf(x, 0.0f) : gelu(x, GeluKind::tanh);
}
__device__ inline float activation_grad(float x, Activation kind) {
  return kind == Activation::relu ? (x > 0.0f ? 1.0f : 0.0f) : gelu_grad(x, GeluKind::tanh);
}

// up.data null: no gate.
__global__ void __launch_bounds__(kBlock)
    activation_forward_kernel(cuda::View out, cuda::ConstView x, cuda::ConstView up, Activation kind, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(kBlock) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kBlock) {
    const float u = up.data ? cuda::load(up, i) : 1.0f;
    cuda::store(out, i, activation(cuda::load(x, i), kind) * u);
  }
}

// dup.data null: no gate gradient.
__global__ void __launch_bounds__(kBlock)
    activation_backward_kernel(cuda::View dx, cuda::View dup, cuda::ConstView dout, cuda::ConstView x,
                               cuda::ConstView up, Activation kind, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(kBlock) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kBlock) {
    const float d = cuda::load(dout, i), v = cuda::load(x, i), u = up.data ? cuda::load(up, i) : 1.0f;
    cuda::store(dx, i, d * activation_grad(v, kind) * u);
    if (dup.data) cuda::store(dup, i, d * activation(v, kind));
  }
}

}  // namespace

void CudaBackend::activation_forward_impl(Tensor& out, const Tensor& x, const Tensor* up, Activation kind) {
  int64_t n = out.numel();
  if (n == 0) return;
  const cuda::ConstView gate = up ? cuda::const_view(*up) : cuda::ConstView{nullptr, x.dtype};
  launch<activation_forward_kernel>(cuda::elementwise_blocks(n, kBlock), kBlock, 0, stream_, cuda::view(out),
                                    cuda::const_view(x), gate, kind, n);
  FT_CUDA_CHECK_LAUNCH();
}

void CudaBackend::activation_backward_impl(Tensor& dx, Tensor* dup, const Tensor& dout, const Tensor& x,
                                           const Tensor* up, Activation kind) {
  int64_t n = dx.numel();
  if (n == 0) return;
  const cuda::ConstView gate = up ? cuda::const_view(*up) : cuda::ConstView{nullptr, x.dtype};
  const cuda::View dgate = dup ? cuda::view(*dup) : cuda::View{nullptr, x.dtype};
  launch<activation_backward_kernel>(cuda::elementwise_blocks(n, kBlock), kBlock, 0, stream_, cuda::view(dx), dgate,
                                     cuda::const_view(dout), cuda::const_view(x), gate, kind, n);
  FT_CUDA_CHECK_LAUNCH();
}

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
