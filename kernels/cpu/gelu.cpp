// GELU in the two forms Hugging Face configs name: the exact erf form
// ("gelu", torch's default) and the tanh approximation ("gelu_new",
// "gelu_fast", "gelu_pytorch_tanh": the same formula). Chunked through f32
// scratch, every input of a chunk loaded before storing, so dx may alias dout.
// T5's MLP activation (relu, or the tanh form gated by up) reuses them.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_util.h"

namespace ft {

static constexpr float kSqrtHalf = 0.70710678118654752f;      // 1 / sqrt(2)
static constexpr float kInvSqrt2Pi = 0.39894228040143268f;    // 1 / sqrt(2 pi)
static constexpr float kSqrt2OverPi = 0.79788456080286536f;   // sqrt(2 / pi)
static constexpr float kCubic = 0.044715f;

static float gelu(float x, GeluKind kind) {
  if (kind == GeluKind::erf) return 0.5f * x * (1.0f + std::erf(x * kSqrtHalf));
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + kCubic * x * x * x)));
}

// erf:  Phi(x) + x * phi(x), phi the standard normal density.
// tanh: with t = tanh(u), u = sqrt(2/pi) (x + c x^3):
//       0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 c x^2).
static float gelu_grad(float x, GeluKind kind) {
  if (kind == GeluKind::erf)
    return 0.5f * (1.0f + std::erf(x * kSqrtHalf)) + x * kInvSqrt2Pi * std::exp(-0.5f * x * x);
  float t = std::tanh(kSqrt2OverPi * (x + kCubic * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
}

void CpuBackend::gelu_forward_impl(Tensor& out, const Tensor& x, GeluKind kind) {
  cpu::for_each_chunk(out.numel(), [&](int64_t start, int64_t count) {
    float v[cpu::kChunk];
    cpu::load_row(v, x, start, count);
    for (int64_t i = 0; i < count; ++i) v[i] = gelu(v[i], kind);
    cpu::store_row(out, start, v, count);
  });
}

void CpuBackend::gelu_backward_impl(Tensor& dx, const Tensor& dout, const Tensor& x, GeluKind kind) {
  cpu::for_each_chunk(dx.numel(), [&](int64_t start, int64_t count) {
    float v[cpu::kChunk], d[cpu::kChunk];
    cpu::load_row(v, x, start, count);
    cpu::load_row(d, dout, start, count);
    for (int64_t i = 0; i < count; ++i) d[i] *= gelu_grad(v[i], kind);
    cpu::store_row(dx, start, d, count);
  });
}

static float activation(float x, Activation kind) {
  return kind == Activation::relu ? std::max(x, 0.0f) : gelu(x, GeluKind::tanh);
}
static float activation_grad(float x, Activation kind) {
  return kind == Activation::relu ? (x > 0.0f ? 1.0f : 0.0f) : gelu_grad(x, GeluKind::tanh);
}

void CpuBackend::activation_forward_impl(Tensor& out, const Tensor& x, const Tensor* up, Activation kind) {
  cpu::for_each_chunk(out.numel(), [&](int64_t start, int64_t count) {
    float v[cpu::kChunk], u[cpu::kChunk];
    cpu::load_row(v, x, start, count);
    if (up) cpu::load_row(u, *up, start, count);
    for (int64_t i = 0; i < count; ++i) v[i] = activation(v[i], kind) * (up ? u[i] : 1.0f);
    cpu::store_row(out, start, v, count);
  });
}

void CpuBackend::activation_backward_impl(Tensor& dx, Tensor* dup, const Tensor& dout, const Tensor& x,
                                          const Tensor* up, Activation kind) {
  cpu::for_each_chunk(dx.numel(), [&](int64_t start, int64_t count) {
    float v[cpu::kChunk], d[cpu::kChunk], u[cpu::kChunk], du[cpu::kChunk];
    cpu::load_row(v, x, start, count);
    cpu::load_row(d, dout, start, count);
    if (up) cpu::load_row(u, *up, start, count);
    for (int64_t i = 0; i < count; ++i) {
      du[i] = d[i] * activation(v[i], kind);
      d[i] *= activation_grad(v[i], kind) * (up ? u[i] : 1.0f);
    }
    cpu::store_row(dx, start, d, count);
    if (dup) cpu::store_row(*dup, start, du, count);
  });
}

}  // namespace ft
