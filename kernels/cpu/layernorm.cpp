// LayerNorm as torch.nn.LayerNorm: per row, mean and biased variance in f32,
// out = (x - mean) * rstd * weight + bias, rounded once to out's dtype
// (PyTorch keeps the normalised value in f32 for bf16 input, unlike HF's RMSNorm).
#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_util.h"

namespace ft {

// The forward of layernorm_forward (sum null: x is the input) and
// add_layernorm_forward (sum = x + *b is the input); one code path, so the
// fused op is bit-identical to add followed by the plain op. Two passes over
// the row (mean, then squared deviations): no cancellation when |mean| is
// large against the spread.
static void layernorm_rows(Tensor& out, Tensor& mean, Tensor& rstd, Tensor* sum, const Tensor& x, const Tensor* b,
                           const Tensor& weight, const Tensor& bias, float eps) {
  int64_t rows = x.rows(), channels = x.cols();
  float* mean_out = mean.ptr<float>();
  float* rstd_out = rstd.ptr<float>();
#pragma omp parallel
  {
    std::vector<float> row(channels), w(channels), bi(channels), scratch(sum ? channels : 0);
    cpu::load_row(w.data(), weight, 0, channels);
    cpu::load_row(bi.data(), bias, 0, channels);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < rows; ++n) {
      if (sum)
        cpu::load_sum_row(row.data(), scratch.data(), *sum, x, *b, n * channels, channels);
      else
        cpu::load_row(row.data(), x, n * channels, channels);
      float total = 0.0f;
#pragma omp simd reduction(+ : total)
      for (int64_t c = 0; c < channels; ++c) total += row[c];
      float m = total / float(channels);
      float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
      for (int64_t c = 0; c < channels; ++c) sum_sq += (row[c] - m) * (row[c] - m);
      float r = 1.0f / std::sqrt(sum_sq / float(channels) + eps);
      mean_out[n] = m;
      rstd_out[n] = r;
      for (int64_t c = 0; c < channels; ++c) row[c] = (row[c] - m) * r * w[c] + bi[c];
      cpu::store_row(out, n * channels, row.data(), channels);
    }
  }
}

void CpuBackend::layernorm_forward_impl(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& weight,
                                        const Tensor& bias, float eps) {
  layernorm_rows(out, mean, rstd, nullptr, x, nullptr, weight, bias, eps);
}

void CpuBackend::add_layernorm_forward_impl(Tensor& sum, Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& a,
                                            const Tensor& b, const Tensor& weight, const Tensor& bias, float eps) {
  layernorm_rows(out, mean, rstd, &sum, a, &b, weight, bias, eps);
}

// With n = (x - mean) * r and g = dout * weight:
//   dx = r * (g - mean(g) - n * mean(g * n)),
//   dweight += sum over rows of dout * n, dbias += sum over rows of dout.
// Each thread sums dweight/dbias for its rows in private buffers, added up
// after the parallel loop. dresidual, when given, is added to dx as
// cpu::store_grad_plus_row says.
static void layernorm_backward_rows(Tensor& dx, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                                    const Tensor* dresidual, const Tensor& x, const Tensor& weight,
                                    const Tensor& mean, const Tensor& rstd) {
  int64_t rows = x.rows(), channels = x.cols();
  int threads = omp_get_max_threads();
  std::vector<float> dweight_partial(dweight ? threads * channels : 0, 0.0f);
  std::vector<float> dbias_partial(dbias ? threads * channels : 0, 0.0f);
  const float* mean_in = mean.ptr<const float>();
  const float* rstd_in = rstd.ptr<const float>();
#pragma omp parallel
  {
    std::vector<float> normed(channels), g(channels), w(channels);
    float* dw = dweight ? dweight_partial.data() + omp_get_thread_num() * channels : nullptr;
    float* db = dbias ? dbias_partial.data() + omp_get_thread_num() * channels : nullptr;
    cpu::load_row(w.data(), weight, 0, channels);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < rows; ++n) {
      cpu::load_row(normed.data(), x, n * channels, channels);
      cpu::load_row(g.data(), dout, n * channels, channels);
      float m = mean_in[n], r = rstd_in[n];
      for (int64_t c = 0; c < channels; ++c) normed[c] = (normed[c] - m) * r;
      if (dw)
        for (int64_t c = 0; c < channels; ++c) dw[c] += g[c] * normed[c];
      if (db)
        for (int64_t c = 0; c < channels; ++c) db[c] += g[c];
      float g_sum = 0.0f, g_dot_n = 0.0f;
#pragma omp simd reduction(+ : g_sum, g_dot_n)
      for (int64_t c = 0; c < channels; ++c) {
        g[c] *= w[c];
        g_sum += g[c];
        g_dot_n += g[c] * normed[c];
      }
      float mean_g = g_sum / float(channels), mean_g_n = g_dot_n / float(channels);
      for (int64_t c = 0; c < channels; ++c) g[c] = r * (g[c] - mean_g - normed[c] * mean_g_n);
      if (dresidual)
        cpu::store_grad_plus_row(dx, g.data(), normed.data(), *dresidual, n * channels, channels);
      else
        cpu::store_row(dx, n * channels, g.data(), channels);
    }
  }
  for (auto [grad, partial] : {std::pair{dweight, &dweight_partial}, std::pair{dbias, &dbias_partial}}) {
    if (!grad) continue;
    std::vector<float> acc(channels);
    cpu::load_row(acc.data(), *grad, 0, channels);
    for (int t = 0; t < threads; ++t)
      for (int64_t c = 0; c < channels; ++c) acc[c] += (*partial)[t * channels + c];
    cpu::store_row(*grad, 0, acc.data(), channels);
  }
}

void CpuBackend::layernorm_backward_impl(Tensor& dx, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                                         const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  layernorm_backward_rows(dx, dweight, dbias, dout, nullptr, x, weight, mean, rstd);
}

void CpuBackend::layernorm_backward_add_impl(Tensor& dx, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                                             const Tensor& dresidual, const Tensor& x, const Tensor& weight,
                                             const Tensor& mean, const Tensor& rstd) {
  layernorm_backward_rows(dx, dweight, dbias, dout, &dresidual, x, weight, mean, rstd);
}

}  // namespace ft
