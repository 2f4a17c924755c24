// LayerNorm as torch.nn.LayerNorm (GPT-NeoX): mean and biased variance in
// f32, out = (x - mean) * rstd * weight + bias rounded once to out's dtype
// (unlike RMSNorm, no rounding of the normalised value for bf16 input). One
// block per row.
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"

namespace ft {
namespace {

constexpr int kBlock = 256;

// Two passes over the row (mean, then squared deviations), as the CPU
// reference: no cancellation when |mean| is large against the spread. Fused
// with the residual add when b.data is set: the input is sum = x + b
// (cuda::load_norm_input).
__global__ void __launch_bounds__(kBlock)
    layernorm_forward_kernel(cuda::View out, float* mean, float* rstd, cuda::View sum, cuda::ConstView x,
                             cuda::ConstView b, cuda::ConstView weight, cuda::ConstView bias, float eps,
                             int64_t channels) {
  __shared__ float scratch[32];
  int64_t row = int64_t(blockIdx.x) * channels;
  float total = 0.0f;
  for (int64_t c = threadIdx.x; c < channels; c += kBlock) total += cuda::load_norm_input(sum, x, b, row + c);
  float m = cuda::block_sum<kBlock>(total, scratch) / float(channels);
  cuda::ConstView input = cuda::norm_input(sum, x, b);
  float sum_sq = 0.0f;
  for (int64_t c = threadIdx.x; c < channels; c += kBlock) {
    float d = cuda::load(input, row + c) - m;
    sum_sq += d * d;
  }
  float r = 1.0f / sqrtf(cuda::block_sum<kBlock>(sum_sq, scratch) / float(channels) + eps);
  if (threadIdx.x == 0) {
    mean[blockIdx.x] = m;
    rstd[blockIdx.x] = r;
  }
  for (int64_t c = threadIdx.x; c < channels; c += kBlock)
    cuda::store(out, row + c, (cuda::load(input, row + c) - m) * r * cuda::load(weight, c) + cuda::load(bias, c));
}

// With n = (x - mean) * r and g = dout * weight:
//   dx = r * (g - mean(g) - n * mean(g * n)),
// plus dresidual when fused (cuda::store_norm_grad).
// Block b handles rows b, b + gridDim.x, ...; it also sums dout * n and dout
// over those rows into row b of dweight_partials / dbias_partials (each
// optional; its own row: no races, and the order is fixed), which
// cuda::add_column_sums_kernel adds up afterwards.
__global__ void __launch_bounds__(kBlock)
    layernorm_backward_kernel(cuda::View dx, float* dweight_partials, float* dbias_partials, cuda::ConstView dout,
                              cuda::ConstView dresidual, cuda::ConstView x, cuda::ConstView weight,
                              const float* mean, const float* rstd, int64_t rows, int64_t channels) {
  __shared__ float scratch[32];
  int64_t own = int64_t(blockIdx.x) * channels;
  float* dw = dweight_partials ? dweight_partials + own : nullptr;
  float* db = dbias_partials ? dbias_partials + own : nullptr;
  for (int64_t n = blockIdx.x; n < rows; n += gridDim.x) {
    int64_t row = n * channels;
    float m = mean[n], r = rstd[n];
    float g_sum = 0.0f, g_dot_n = 0.0f;
    for (int64_t c = threadIdx.x; c < channels; c += kBlock) {
      float g = cuda::load(dout, row + c) * cuda::load(weight, c);
      g_sum += g;
      g_dot_n += g * (cuda::load(x, row + c) - m) * r;
    }
    float mean_g = cuda::block_sum<kBlock>(g_sum, scratch) / float(channels);
    float mean_g_n = cuda::block_sum<kBlock>(g_dot_n, scratch) / float(channels);
    bool first = n == blockIdx.x;
    for (int64_t c = threadIdx.x; c < channels; c += kBlock) {
      float d = cuda::load(dout, row + c), normed = (cuda::load(x, row + c) - m) * r;
      if (dw) dw[c] = (first ? 0.0f : dw[c]) + d * normed;
      if (db) db[c] = (first ? 0.0f : db[c]) + d;
      cuda::store_norm_grad(dx, dresidual, row + c, r * (d * cuda::load(weight, c) - mean_g - normed * mean_g_n));
    }
  }
}

}  // namespace

// sum null: the plain norm of x; else the fused one of sum = x + *b.
void CudaBackend::layernorm_rows(Tensor& out, Tensor& mean, Tensor& rstd, Tensor* sum, const Tensor& x,
                                 const Tensor* b, const Tensor& weight, const Tensor& bias, float eps) {
  FT_CHECK(x.rows() < (int64_t(1) << 31), "layernorm: too many rows (", x.rows(), ") for one launch");
  if (x.rows() == 0) return;
  launch<layernorm_forward_kernel>(unsigned(x.rows()), kBlock, 0, stream_, cuda::view(out), mean.ptr<float>(),
                                   rstd.ptr<float>(), sum ? cuda::view(*sum) : cuda::View{}, cuda::const_view(x),
                                   b ? cuda::const_view(*b) : cuda::ConstView{}, cuda::const_view(weight),
                                   cuda::const_view(bias), eps, x.cols());
  FT_CUDA_CHECK_LAUNCH();
}

void CudaBackend::layernorm_forward_impl(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& weight,
                                         const Tensor& bias, float eps) {
  layernorm_rows(out, mean, rstd, nullptr, x, nullptr, weight, bias, eps);
}

void CudaBackend::add_layernorm_forward_impl(Tensor& sum, Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& a,
                                             const Tensor& b, const Tensor& weight, const Tensor& bias, float eps) {
  layernorm_rows(out, mean, rstd, &sum, a, &b, weight, bias, eps);
}

// dresidual null: the plain backward; else the fused one adding it to dx.
void CudaBackend::layernorm_backward_rows(Tensor& dx, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                                          const Tensor* dresidual, const Tensor& x, const Tensor& weight,
                                          const Tensor& mean, const Tensor& rstd) {
  int64_t rows = x.rows(), channels = x.cols();
  if (rows == 0 || channels == 0) return;
  const int64_t blocks = cuda::partial_rows(rows);
  Tensor dweight_partials = dweight ? scratch(cuda::column_partials_scratch(rows, channels)) : Tensor();
  Tensor dbias_partials = dbias ? scratch(cuda::column_partials_scratch(rows, channels)) : Tensor();
  launch<layernorm_backward_kernel>(unsigned(blocks), kBlock, 0, stream_, cuda::view(dx),
                                    dweight ? dweight_partials.ptr<float>() : nullptr,
                                    dbias ? dbias_partials.ptr<float>() : nullptr, cuda::const_view(dout),
                                    dresidual ? cuda::const_view(*dresidual) : cuda::ConstView{},
                                    cuda::const_view(x), cuda::const_view(weight), mean.ptr<const float>(),
                                    rstd.ptr<const float>(), rows, channels);
  FT_CUDA_CHECK_LAUNCH();
  for (auto [grad, partials] : {std::pair{dweight, &dweight_partials}, std::pair{dbias, &dbias_partials}}) {
    if (!grad) continue;
    launch<cuda::add_column_sums_kernel<kBlock>>(unsigned((channels + kBlock - 1) / kBlock), kBlock, 0, stream_,
                                                 cuda::view(*grad), partials->ptr<const float>(), blocks, channels);
    FT_CUDA_CHECK_LAUNCH();
  }
}

void CudaBackend::layernorm_backward_impl(Tensor& dx, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                                          const Tensor& x, const Tensor& weight, const Tensor& mean,
                                          const Tensor& rstd) {
  layernorm_backward_rows(dx, dweight, dbias, dout, nullptr, x, weight, mean, rstd);
}

void CudaBackend::layernorm_backward_add_impl(Tensor& dx, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                                              const Tensor& dresidual, const Tensor& x, const Tensor& weight,
                                              const Tensor& mean, const Tensor& rstd) {
  layernorm_backward_rows(dx, dweight, dbias, dout, &dresidual, x, weight, mean, rstd);
}

}  // namespace ft
