// grad += alpha * a^T b with the rows' terms added in row order (the
// contract in kernels/backend.h): one thread per element of grad walks the
// rows n = 0, 1, ... with one fma each. Consecutive threads own consecutive
// columns j, so a warp reads a row of b coalesced and one a[n, i] for all.
// Meant for LoRA's gradients, where one side of grad is the rank (8 to 64):
// a GEMM would block the sum over rows by shape.
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"

namespace ft {
namespace {

constexpr int kBlock = 256;

__global__ void __launch_bounds__(kBlock) accumulate_outer_products_kernel(float* grad, cuda::ConstView a,
                                                                           cuda::ConstView b, int64_t N, int64_t M,
                                                                           int64_t P, float alpha) {
  for (int64_t e = blockIdx.x * int64_t(kBlock) + threadIdx.x; e < M * P; e += int64_t(gridDim.x) * kBlock) {
    const int64_t i = e / P, j = e % P;
    float v = grad[e];
    for (int64_t n = 0; n < N; ++n) v = fmaf(__fmul_rn(alpha, cuda::load(a, n * M + i)), cuda::load(b, n * P + j), v);
    grad[e] = v;
  }
}

}  // namespace

void CudaBackend::accumulate_outer_products_impl(Tensor& grad, const Tensor& a, const Tensor& b, float alpha) {
  const int64_t N = a.rows(), M = a.cols(), P = b.cols();
  if (N == 0 || M == 0 || P == 0) return;
  launch<accumulate_outer_products_kernel>(cuda::elementwise_blocks(M * P, kBlock), kBlock, 0, stream_,
                                           grad.ptr<float>(), cuda::const_view(a), cuda::const_view(b), N, M, P,
                                           alpha);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
