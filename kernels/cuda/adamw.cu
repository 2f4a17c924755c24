// AdamW, step for step as torch.optim.AdamW's single-tensor path (the CPU
// backend's kernels/cpu/adamw.cpp is the reference), and the sum of squares
// behind global-norm gradient clipping.
#include <cmath>

#include "kernels/cuda/checks.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"

namespace ft {
namespace {

constexpr int kBlock = 256;

// The step's scalars, computed on the host exactly as the CPU backend does.
struct AdamWScalars {
  float grad_scale, decay, lerp_weight, beta2, one_minus_beta2, step_size, bias_correction2_sqrt, eps;
};

// torch.lerp: for small weights start + w * (end - start), otherwise end - (end - start) * (1 - w).
__device__ inline float torch_lerp(float start, float end, float w) {
  return w < 0.5f ? fmaf(w, end - start, start) : end - (end - start) * (1.0f - w);
}

__global__ void __launch_bounds__(kBlock)
    adamw_kernel(float* param, const float* grad, float* m, float* v, AdamWScalars s, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(kBlock) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kBlock) {
    float g = grad[i] * s.grad_scale;
    float p = param[i] * s.decay;
    float m1 = torch_lerp(m[i], g, s.lerp_weight);
    float m2 = v[i] * s.beta2 + s.one_minus_beta2 * g * g;
    m[i] = m1;
    v[i] = m2;
    float denom = sqrtf(m2) / s.bias_correction2_sqrt + s.eps;
    param[i] = p + -s.step_size * (m1 / denom);
  }
}

// Pass 1: block b sums the squares of elements b*kBlock + t, stepping by the
// grid, in double; pass 2 adds the block sums in order.
__global__ void __launch_bounds__(kBlock) sum_squares_kernel(double* partials, cuda::ConstView x, int64_t n) {
  __shared__ double scratch[32];
  double sum = 0.0;
  for (int64_t i = blockIdx.x * int64_t(kBlock) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kBlock) {
    double value = cuda::load(x, i);
    sum += value * value;
  }
  sum = cuda::block_sum<kBlock>(sum, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

__global__ void __launch_bounds__(kBlock) sum_partials_kernel(double* total, const double* partials, int64_t count) {
  __shared__ double scratch[32];
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += kBlock) sum += partials[i];
  sum = cuda::block_sum<kBlock>(sum, scratch);
  if (threadIdx.x == 0) *total = sum;
}

}  // namespace

void CudaBackend::adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& s) {
  const char* op = "adamw_update";
  cuda::check_dtype(param, DType::f32, op, "param");
  cuda::check_dtype(grad, DType::f32, op, "grad");
  cuda::check_dtype(m, DType::f32, op, "m");
  cuda::check_dtype(v, DType::f32, op, "v");
  cuda::check_numel(grad, param.numel(), op, "grad");
  cuda::check_numel(m, param.numel(), op, "m");
  cuda::check_numel(v, param.numel(), op, "v");
  FT_CHECK(s.step >= 1, op, ": step counts from 1, got ", s.step);
  double bias_correction1 = 1.0 - std::pow(double(s.beta1), double(s.step));
  double bias_correction2 = 1.0 - std::pow(double(s.beta2), double(s.step));
  AdamWScalars scalars{s.grad_scale,
                       float(1.0 - double(s.lr) * double(s.weight_decay)),
                       float(1.0 - double(s.beta1)),
                       s.beta2,
                       float(1.0 - double(s.beta2)),
                       float(double(s.lr) / bias_correction1),
                       float(std::sqrt(bias_correction2)),
                       s.eps};
  int64_t n = param.numel();
  if (n == 0) return;
  launch<adamw_kernel>(cuda::elementwise_blocks(n, kBlock), kBlock, 0, stream_, param.ptr<float>(),
                       grad.ptr<const float>(), m.ptr<float>(), v.ptr<float>(), scalars, n);
  FT_CUDA_CHECK_LAUNCH();
}

double CudaBackend::sum_squares(const Tensor& x) {
  cuda::check_float(x, "sum_squares", "x");
  int64_t n = x.numel();
  if (n == 0) return 0.0;
  int64_t blocks = (n + kBlock - 1) / kBlock;
  // A fixed function of the element count: the same result on every GPU and run.
  if (blocks > cuda::kMaxPartialRows) blocks = cuda::kMaxPartialRows;
  // Doubles have no DType; 8 bytes each, carved from i8 scratch.
  Tensor partials = scratch({blocks + 1, 8}, DType::i8);
  double* partial = partials.ptr<double>();
  double* total = partial + blocks;
  launch<sum_squares_kernel>(unsigned(blocks), kBlock, 0, stream_, partial, cuda::const_view(x), n);
  FT_CUDA_CHECK_LAUNCH();
  launch<sum_partials_kernel>(1, kBlock, 0, stream_, total, partial, blocks);
  FT_CUDA_CHECK_LAUNCH();
  double result = 0.0;
  FT_CUDA_CHECK(cudaMemcpyAsync(&result, total, sizeof(double), cudaMemcpyDeviceToHost, stream_));
  FT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return result;
}

}  // namespace ft
