// Elementwise ops: add and SwiGLU. Every thread loads all inputs of its
// element before storing, so outputs may alias inputs.
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"

namespace ft {
namespace {

constexpr int kBlock = 256;

__global__ void __launch_bounds__(kBlock) add_kernel(cuda::View out, cuda::ConstView a, cuda::ConstView b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(kBlock) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kBlock)
    cuda::store(out, i, cuda::load(a, i) + cuda::load(b, i));
}

// expf, not __expf: the fast intrinsic's error grows for large |x|.
__device__ inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__global__ void __launch_bounds__(kBlock)
    swiglu_forward_kernel(cuda::View out, cuda::ConstView gate, cuda::ConstView up, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(kBlock) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kBlock) {
    float g = cuda::load(gate, i), u = cuda::load(up, i);
    cuda::store(out, i, g * sigmoid(g) * u);
  }
}

// With s = sigmoid(g): d silu(g)/dg = s * (1 + g * (1 - s)).
__global__ void __launch_bounds__(kBlock) swiglu_backward_kernel(cuda::View dgate, cuda::View dup, cuda::ConstView dout,
                                                                 cuda::ConstView gate, cuda::ConstView up, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(kBlock) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kBlock) {
    float g = cuda::load(gate, i), u = cuda::load(up, i), d = cuda::load(dout, i);
    float s = sigmoid(g);
    cuda::store(dgate, i, d * u * s * (1.0f + g * (1.0f - s)));
    cuda::store(dup, i, d * (g * s));
  }
}

}  // namespace

void CudaBackend::add_impl(Tensor& out, const Tensor& a, const Tensor& b) {
  int64_t n = out.numel();
  if (n == 0) return;
  launch<add_kernel>(cuda::elementwise_blocks(n, kBlock), kBlock, 0, stream_, cuda::view(out), cuda::const_view(a),
                     cuda::const_view(b), n);
  FT_CUDA_CHECK_LAUNCH();
}

void CudaBackend::swiglu_forward_impl(Tensor& out, const Tensor& gate, const Tensor& up) {
  int64_t n = out.numel();
  if (n == 0) return;
  launch<swiglu_forward_kernel>(cuda::elementwise_blocks(n, kBlock), kBlock, 0, stream_, cuda::view(out),
                                cuda::const_view(gate), cuda::const_view(up), n);
  FT_CUDA_CHECK_LAUNCH();
}

void CudaBackend::swiglu_backward_impl(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                                       const Tensor& up) {
  int64_t n = dout.numel();
  if (n == 0) return;
  launch<swiglu_backward_kernel>(cuda::elementwise_blocks(n, kBlock), kBlock, 0, stream_, cuda::view(dgate),
                                 cuda::view(dup), cuda::const_view(dout), cuda::const_view(gate),
                                 cuda::const_view(up), n);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
