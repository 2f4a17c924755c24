// RMSNorm as HF LlamaRMSNorm: statistics in f32, the normalised value rounded
// to the input dtype, then scaled by the weight. One block per row.
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"

namespace ft {
namespace {

constexpr int kBlock = 256;

// Fused with the residual add when b.data is set: the input is sum = x + b
// (cuda::load_norm_input).
__global__ void __launch_bounds__(kBlock)
    rmsnorm_forward_kernel(cuda::View out, float* rstd, cuda::View sum, cuda::ConstView x, cuda::ConstView b,
                           cuda::ConstView weight, float eps, int64_t channels) {
  __shared__ float scratch[32];
  int64_t row = int64_t(blockIdx.x) * channels;
  float sum_sq = 0.0f;
  for (int64_t c = threadIdx.x; c < channels; c += kBlock) {
    float v = cuda::load_norm_input(sum, x, b, row + c);
    sum_sq += v * v;
  }
  sum_sq = cuda::block_sum<kBlock>(sum_sq, scratch);
  float r = 1.0f / sqrtf(sum_sq / float(channels) + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  cuda::ConstView input = cuda::norm_input(sum, x, b);
  bool round_to_bf16 = input.dtype == DType::bf16;  // HF: hidden_states.to(input_dtype) before * weight
  for (int64_t c = threadIdx.x; c < channels; c += kBlock) {
    float normed = cuda::load(input, row + c) * r;
    if (round_to_bf16) normed = cuda::round_to_bf16(normed);
    cuda::store(out, row + c, cuda::load(weight, c) * normed);
  }
}

// With n = x * r and g = dout * weight: dx = r * (g - n * mean(g * n)), plus
// dresidual when fused (cuda::store_norm_grad).
// Block b handles rows b, b + gridDim.x, ...; with partials it also sums
// dout * n over those rows into partials[b, :] (its own row: no races, and
// the order is fixed), which cuda::add_column_sums_kernel adds up afterwards.
__global__ void __launch_bounds__(kBlock)
    rmsnorm_backward_kernel(cuda::View dx, float* partials, cuda::ConstView dout, cuda::ConstView dresidual,
                            cuda::ConstView x, cuda::ConstView weight, const float* rstd, int64_t rows,
                            int64_t channels) {
  __shared__ float scratch[32];
  float* partial = partials ? partials + int64_t(blockIdx.x) * channels : nullptr;
  for (int64_t n = blockIdx.x; n < rows; n += gridDim.x) {
    int64_t row = n * channels;
    float r = rstd[n];
    float g_dot_n = 0.0f;
    for (int64_t c = threadIdx.x; c < channels; c += kBlock)
      g_dot_n += cuda::load(dout, row + c) * cuda::load(weight, c) * cuda::load(x, row + c) * r;
    float mean_g_n = cuda::block_sum<kBlock>(g_dot_n, scratch) / float(channels);
    bool first = n == blockIdx.x;
    for (int64_t c = threadIdx.x; c < channels; c += kBlock) {
      float d = cuda::load(dout, row + c), xs = cuda::load(x, row + c);
      if (partial) partial[c] = (first ? 0.0f : partial[c]) + d * xs * r;
      cuda::store_norm_grad(dx, dresidual, row + c, r * (d * cuda::load(weight, c) - xs * r * mean_g_n));
    }
  }
}

}  // namespace

// sum null: the plain norm of x; else the fused one of sum = x + *b.
void CudaBackend::rmsnorm_rows(Tensor& out, Tensor& rstd, Tensor* sum, const Tensor& x, const Tensor* b,
                               const Tensor& weight, float eps) {
  FT_CHECK(x.rows() < (int64_t(1) << 31), "rmsnorm: too many rows (", x.rows(), ") for one launch");
  if (x.rows() == 0) return;
  launch<rmsnorm_forward_kernel>(unsigned(x.rows()), kBlock, 0, stream_, cuda::view(out), rstd.ptr<float>(),
                                 sum ? cuda::view(*sum) : cuda::View{}, cuda::const_view(x),
                                 b ? cuda::const_view(*b) : cuda::ConstView{}, cuda::const_view(weight), eps,
                                 x.cols());
  FT_CUDA_CHECK_LAUNCH();
}

void CudaBackend::rmsnorm_forward_impl(Tensor& out, Tensor& rstd, const Tensor& x, const Tensor& weight, float eps) {
  rmsnorm_rows(out, rstd, nullptr, x, nullptr, weight, eps);
}

void CudaBackend::add_rmsnorm_forward_impl(Tensor& sum, Tensor& out, Tensor& rstd, const Tensor& a, const Tensor& b,
                                           const Tensor& weight, float eps) {
  rmsnorm_rows(out, rstd, &sum, a, &b, weight, eps);
}

// dresidual null: the plain backward; else the fused one adding it to dx.
void CudaBackend::rmsnorm_backward_rows(Tensor& dx, Tensor* dweight, const Tensor& dout, const Tensor* dresidual,
                                        const Tensor& x, const Tensor& weight, const Tensor& rstd) {
  int64_t rows = x.rows(), channels = x.cols();
  if (rows == 0 || channels == 0) return;
  const int64_t blocks = cuda::partial_rows(rows);
  Tensor partials = dweight ? scratch(cuda::column_partials_scratch(rows, channels)) : Tensor();
  launch<rmsnorm_backward_kernel>(unsigned(blocks), kBlock, 0, stream_, cuda::view(dx),
                                  dweight ? partials.ptr<float>() : nullptr, cuda::const_view(dout),
                                  dresidual ? cuda::const_view(*dresidual) : cuda::ConstView{},
                                  cuda::const_view(x), cuda::const_view(weight), rstd.ptr<const float>(), rows,
                                  channels);
  FT_CUDA_CHECK_LAUNCH();
  if (!dweight) return;
  launch<cuda::add_column_sums_kernel<kBlock>>(unsigned((channels + kBlock - 1) / kBlock), kBlock, 0, stream_,
                                               cuda::view(*dweight), partials.ptr<const float>(), blocks, channels);
  FT_CUDA_CHECK_LAUNCH();
}

void CudaBackend::rmsnorm_backward_impl(Tensor& dx, Tensor* dweight, const Tensor& dout, const Tensor& x,
                                        const Tensor& weight, const Tensor& rstd) {
  rmsnorm_backward_rows(dx, dweight, dout, nullptr, x, weight, rstd);
}

void CudaBackend::rmsnorm_backward_add_impl(Tensor& dx, Tensor* dweight, const Tensor& dout, const Tensor& dresidual,
                                            const Tensor& x, const Tensor& weight, const Tensor& rstd) {
  rmsnorm_backward_rows(dx, dweight, dout, &dresidual, x, weight, rstd);
}

}  // namespace ft
