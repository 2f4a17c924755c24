// AdamW, step for step as torch.optim.AdamW's single-tensor path
// (foreach=False, fused=False), and the sum of squares behind global-norm
// gradient clipping.
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_util.h"

namespace ft {

// torch.lerp: for small weights start + w * (end - start) (an fma in its
// vectorised CPU kernel), otherwise end - (end - start) * (1 - w).
static float torch_lerp(float start, float end, float w) {
  return w < 0.5f ? std::fma(w, end - start, start) : end - (end - start) * (1.0f - w);
}

void CpuBackend::adamw_update_impl(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& s) {
  // The scalars PyTorch computes in Python (double) and then applies to f32
  // tensors. Hyperparameters arrive here as f32, so e.g. 1 - beta1 may differ
  // from Python's 1 - 0.9 in the last f32 bit.
  double bias_correction1 = 1.0 - std::pow(double(s.beta1), double(s.step));
  double bias_correction2 = 1.0 - std::pow(double(s.beta2), double(s.step));
  float decay = float(1.0 - double(s.lr) * double(s.weight_decay));
  float lerp_weight = float(1.0 - double(s.beta1));
  float one_minus_beta2 = float(1.0 - double(s.beta2));
  float step_size = float(double(s.lr) / bias_correction1);
  float bias_correction2_sqrt = float(std::sqrt(bias_correction2));
  float* p = param.ptr<float>();
  const float* g = grad.ptr<const float>();
  float* m1 = m.ptr<float>();
  float* m2 = v.ptr<float>();
  int64_t n = param.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float gi = g[i] * s.grad_scale;
    float pi = p[i] * decay;
    m1[i] = torch_lerp(m1[i], gi, lerp_weight);
    m2[i] = m2[i] * s.beta2 + one_minus_beta2 * gi * gi;
    float denom = std::sqrt(m2[i]) / bias_correction2_sqrt + s.eps;
    p[i] = pi + -step_size * (m1[i] / denom);
  }
}

// Squares are summed in double per fixed chunk and the chunks in order, so
// the result does not depend on the number of threads.
double CpuBackend::sum_squares_impl(const Tensor& x) {
  int64_t n = x.numel();
  std::vector<double> partial((n + cpu::kChunk - 1) / cpu::kChunk);
  cpu::for_each_chunk(n, [&](int64_t start, int64_t count) {
    float buf[cpu::kChunk];
    cpu::load_row(buf, x, start, count);
    double sum = 0.0;
    for (int64_t i = 0; i < count; ++i) sum += double(buf[i]) * double(buf[i]);
    partial[start / cpu::kChunk] = sum;
  });
  double total = 0.0;
  for (double part : partial) total += part;
  return total;
}

void CpuBackend::adamw_update_many_impl(std::span<const AdamWTensors> tensors, const AdamWStep& step) {
  for (const AdamWTensors& t : tensors) adamw_update_impl(*t.param, *t.grad, *t.m, *t.v, t.step_for(step));
}

// In tensor order, so the optimizer's clipping norm is what adding
// sum_squares per gradient gave.
double CpuBackend::sum_squares_many_impl(std::span<const Tensor* const> tensors) {
  double total = 0.0;
  for (const Tensor* x : tensors) total += sum_squares_impl(*x);
  return total;
}

}  // namespace ft
