// RMSNorm as HF LlamaRMSNorm: statistics in f32, normalised value cast back to
// the input dtype, then scaled by the weight.
#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_util.h"

namespace ft {

// The forward of rmsnorm_forward (sum null: x is the input) and
// add_rmsnorm_forward (sum = x + *b is the input); one code path, so the
// fused op is bit-identical to add followed by the plain op.
static void rmsnorm_rows(Tensor& out, Tensor& rstd, Tensor* sum, const Tensor& x, const Tensor* b,
                         const Tensor& weight, float eps) {
  int64_t rows = x.rows(), channels = x.cols();
  // HF: hidden_states.to(input_dtype) before * weight; the input is sum when fused.
  bool round_to_bf16 = (sum ? sum->dtype : x.dtype) == DType::bf16;
  float* rstd_out = rstd.ptr<float>();
#pragma omp parallel
  {
    std::vector<float> row(channels), w(channels), scratch(sum ? channels : 0);
    cpu::load_row(w.data(), weight, 0, channels);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < rows; ++n) {
      if (sum)
        cpu::load_sum_row(row.data(), scratch.data(), *sum, x, *b, n * channels, channels);
      else
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

void CpuBackend::rmsnorm_forward_impl(Tensor& out, Tensor& rstd, const Tensor& x, const Tensor& weight, float eps) {
  rmsnorm_rows(out, rstd, nullptr, x, nullptr, weight, eps);
}

void CpuBackend::add_rmsnorm_forward_impl(Tensor& sum, Tensor& out, Tensor& rstd, const Tensor& a, const Tensor& b,
                                          const Tensor& weight, float eps) {
  rmsnorm_rows(out, rstd, &sum, a, &b, weight, eps);
}

// With n = x * r and g = dout * weight: dx = r * (g - n * mean(g * n)),
// dweight += sum over rows of dout * n. Each thread sums dweight for its rows
// in a private buffer; the buffers are added up after the parallel loop.
// dresidual, when given, is added to dx as cpu::store_grad_plus_row says.
static void rmsnorm_backward_rows(Tensor& dx, Tensor* dweight, const Tensor& dout, const Tensor* dresidual,
                                  const Tensor& x, const Tensor& weight, const Tensor& rstd) {
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
      if (dresidual)
        cpu::store_grad_plus_row(dx, g.data(), xs.data(), *dresidual, n * channels, channels);
      else
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

void CpuBackend::rmsnorm_backward_impl(Tensor& dx, Tensor* dweight, const Tensor& dout, const Tensor& x,
                                       const Tensor& weight, const Tensor& rstd) {
  rmsnorm_backward_rows(dx, dweight, dout, nullptr, x, weight, rstd);
}

void CpuBackend::rmsnorm_backward_add_impl(Tensor& dx, Tensor* dweight, const Tensor& dout, const Tensor& dresidual,
                                           const Tensor& x, const Tensor& weight, const Tensor& rstd) {
  rmsnorm_backward_rows(dx, dweight, dout, &dresidual, x, weight, rstd);
}

}  // namespace ft
