// RMSNorm as HF LlamaRMSNorm: statistics in f32, normalised value cast back to
// the input dtype, then scaled by the weight.
#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_util.h"

namespace ft {

static void check_rmsnorm_args(const char* op, const Tensor& x, const Tensor& weight, const Tensor& rstd) {
  cpu::check_float(x, op, "x");
  cpu::check_float(weight, op, "weight");
  cpu::check_dtype(rstd, DType::f32, op, "rstd");
  cpu::check_shape(weight, {x.cols()}, op, "weight");
  cpu::check_numel(rstd, x.rows(), op, "rstd");
}

void CpuBackend::rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& x, const Tensor& weight, float eps) {
  const char* op = "rmsnorm_forward";
  check_rmsnorm_args(op, x, weight, rstd);
  cpu::check_float(out, op, "out");
  cpu::check_shape(out, x.shape, op, "out");
  int64_t rows = x.rows(), channels = x.cols();
  bool round_to_bf16 = x.dtype == DType::bf16;  // HF: hidden_states.to(input_dtype) before * weight
  float* rstd_out = rstd.ptr<float>();
#pragma omp parallel
  {
    std::vector<float> row(channels), w(channels);
    cpu::load_row(w.data(), weight, 0, channels);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < rows; ++n) {
      cpu::load_row(row.data(), x, n * channels, channels);
      float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
      for (int64_t c = 0; c < channels; ++c) sum_sq += row[c] * row[c];
      float r = 1.0f / std::sqrt(sum_sq / float(channels) + eps);
      rstd_out[n] = r;
      for (int64_t c = 0; c < channels; ++c) {
        float normed = row[c] * r;
        if (round_to_bf16) normed = bf16_to_f32(f32_to_bf16(normed));
        row[c] = w[c] * normed;
      }
      cpu::store_row(out, n * channels, row.data(), channels);
    }
  }
}

// With n = x * r and g = dout * weight: dx = r * (g - n * mean(g * n)),
// dweight += sum over rows of dout * n. Each thread sums dweight for its rows
// in a private buffer; the buffers are added up after the parallel loop.
void CpuBackend::rmsnorm_backward(Tensor& dx, Tensor* dweight, const Tensor& dout, const Tensor& x,
                                  const Tensor& weight, const Tensor& rstd) {
  const char* op = "rmsnorm_backward";
  check_rmsnorm_args(op, x, weight, rstd);
  cpu::check_float(dx, op, "dx");
  cpu::check_float(dout, op, "dout");
  cpu::check_shape(dx, x.shape, op, "dx");
  cpu::check_shape(dout, x.shape, op, "dout");
  if (dweight) {
    cpu::check_float(*dweight, op, "dweight");
    cpu::check_shape(*dweight, weight.shape, op, "dweight");
  }
  int64_t rows = x.rows(), channels = x.cols();
  int threads = omp_get_max_threads();
  std::vector<float> dweight_partial(dweight ? threads * channels : 0, 0.0f);
  const float* rstd_in = rstd.ptr<const float>();
#pragma omp parallel
  {
    std::vector<float> xs(channels), g(channels), w(channels);
    float* dw = dweight ? dweight_partial.data() + omp_get_thread_num() * channels : nullptr;
    cpu::load_row(w.data(), weight, 0, channels);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < rows; ++n) {
      cpu::load_row(xs.data(), x, n * channels, channels);
      cpu::load_row(g.data(), dout, n * channels, channels);
      float r = rstd_in[n];
      if (dw)
        for (int64_t c = 0; c < channels; ++c) dw[c] += g[c] * xs[c] * r;
      float g_dot_n = 0.0f;
#pragma omp simd reduction(+ : g_dot_n)
      for (int64_t c = 0; c < channels; ++c) {
        g[c] *= w[c];
        g_dot_n += g[c] * xs[c] * r;
      }
      float mean_g_n = g_dot_n / float(channels);
      for (int64_t c = 0; c < channels; ++c) g[c] = r * (g[c] - xs[c] * r * mean_g_n);
      cpu::store_row(dx, n * channels, g.data(), channels);
    }
  }
  if (!dweight) return;
  std::vector<float> acc(channels);
  cpu::load_row(acc.data(), *dweight, 0, channels);
  for (int t = 0; t < threads; ++t)
    for (int64_t c = 0; c < channels; ++c) acc[c] += dweight_partial[t * channels + c];
  cpu::store_row(*dweight, 0, acc.data(), channels);
}

}  // namespace ft
