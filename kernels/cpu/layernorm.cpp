// LayerNorm as torch.nn.LayerNorm: per row, mean and biased variance in f32,
// out = (x - mean) * rstd * weight + bias, rounded once to out's dtype
// (PyTorch keeps the normalised value in f32 for bf16 input, unlike HF's RMSNorm).
#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_util.h"

namespace ft {

static void check_layernorm_args(const char* op, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                 const Tensor& rstd) {
  cpu::check_float(x, op, "x");
  cpu::check_float(weight, op, "weight");
  cpu::check_dtype(mean, DType::f32, op, "mean");
  cpu::check_dtype(rstd, DType::f32, op, "rstd");
  cpu::check_shape(weight, {x.cols()}, op, "weight");
  cpu::check_numel(mean, x.rows(), op, "mean");
  cpu::check_numel(rstd, x.rows(), op, "rstd");
}

// Two passes over the row (mean, then squared deviations): no cancellation
// when |mean| is large against the spread.
void CpuBackend::layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& weight,
                                   const Tensor& bias, float eps) {
  const char* op = "layernorm_forward";
  check_layernorm_args(op, x, weight, mean, rstd);
  cpu::check_float(bias, op, "bias");
  cpu::check_shape(bias, weight.shape, op, "bias");
  cpu::check_float(out, op, "out");
  cpu::check_shape(out, x.shape, op, "out");
  int64_t rows = x.rows(), channels = x.cols();
  float* mean_out = mean.ptr<float>();
  float* rstd_out = rstd.ptr<float>();
#pragma omp parallel
  {
    std::vector<float> row(channels), w(channels), b(channels);
    cpu::load_row(w.data(), weight, 0, channels);
    cpu::load_row(b.data(), bias, 0, channels);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < rows; ++n) {
      cpu::load_row(row.data(), x, n * channels, channels);
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t c = 0; c < channels; ++c) sum += row[c];
      float m = sum / float(channels);
      float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
      for (int64_t c = 0; c < channels; ++c) sum_sq += (row[c] - m) * (row[c] - m);
      float r = 1.0f / std::sqrt(sum_sq / float(channels) + eps);
      mean_out[n] = m;
      rstd_out[n] = r;
      for (int64_t c = 0; c < channels; ++c) row[c] = (row[c] - m) * r * w[c] + b[c];
      cpu::store_row(out, n * channels, row.data(), channels);
    }
  }
}

// With n = (x - mean) * r and g = dout * weight:
//   dx = r * (g - mean(g) - n * mean(g * n)),
//   dweight += sum over rows of dout * n, dbias += sum over rows of dout.
// Each thread sums dweight/dbias for its rows in private buffers, added up
// after the parallel loop.
void CpuBackend::layernorm_backward(Tensor& dx, Tensor* dweight, Tensor* dbias, const Tensor& dout, const Tensor& x,
                                    const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  const char* op = "layernorm_backward";
  check_layernorm_args(op, x, weight, mean, rstd);
  cpu::check_float(dx, op, "dx");
  cpu::check_float(dout, op, "dout");
  cpu::check_shape(dx, x.shape, op, "dx");
  cpu::check_shape(dout, x.shape, op, "dout");
  for (auto [grad, name] : {std::pair{dweight, "dweight"}, std::pair{dbias, "dbias"}}) {
    if (!grad) continue;
    cpu::check_float(*grad, op, name);
    cpu::check_shape(*grad, weight.shape, op, name);
  }
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

}  // namespace ft
