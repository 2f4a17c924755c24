// Elementwise ops: add and SwiGLU. Each works chunk by chunk through f32
// scratch, loading every input of a chunk before storing, so outputs may alias
// inputs.
#include <cmath>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/vec_exp.h"

namespace ft {

// out[start, start + count) = a + b there.
FT_AVX512_VERSIONS(void, add_chunk, (Tensor& out, const Tensor& a, const Tensor& b, int64_t start, int64_t count),
                   (out, a, b, start, count)) {
  float x[cpu::kChunk], y[cpu::kChunk];
  cpu::load_row(x, a, start, count);
  cpu::load_row(y, b, start, count);
  for (int64_t i = 0; i < count; ++i) x[i] += y[i];
  cpu::store_row(out, start, x, count);
}

void CpuBackend::add_impl(Tensor& out, const Tensor& a, const Tensor& b) {
  cpu::for_each_chunk(out.numel(), [&](int64_t start, int64_t count) { add_chunk(out, a, b, start, count); });
  note_path(cpu::avx512_versions_isa());
}

// s[i] = sigmoid(g[i]) = 1 / (1 + exp(-g[i])), the exponentials on the vector units.
static void sigmoid_row(float* s, const float* g, int64_t count) {
  for (int64_t i = 0; i < count; ++i) s[i] = -g[i];
  cpu::exp_inplace(s, count);
  for (int64_t i = 0; i < count; ++i) s[i] = 1.0f / (1.0f + s[i]);
}

FT_AVX512_VERSIONS(void, swiglu_chunk,
                   (Tensor& out, const Tensor& gate, const Tensor& up, int64_t start, int64_t count),
                   (out, gate, up, start, count)) {
  float g[cpu::kChunk], u[cpu::kChunk], s[cpu::kChunk];
  cpu::load_row(g, gate, start, count);
  cpu::load_row(u, up, start, count);
  sigmoid_row(s, g, count);
  for (int64_t i = 0; i < count; ++i) g[i] = g[i] * s[i] * u[i];
  cpu::store_row(out, start, g, count);
}

void CpuBackend::swiglu_forward_impl(Tensor& out, const Tensor& gate, const Tensor& up) {
  cpu::for_each_chunk(out.numel(), [&](int64_t start, int64_t count) { swiglu_chunk(out, gate, up, start, count); });
  note_path(cpu::avx512_versions_isa());
}

// With s = sigmoid(g): d silu(g)/dg = s * (1 + g * (1 - s)).
FT_AVX512_VERSIONS(void, swiglu_backward_chunk,
                   (Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate, const Tensor& up,
                    int64_t start, int64_t count),
                   (dgate, dup, dout, gate, up, start, count)) {
  float g[cpu::kChunk], u[cpu::kChunk], d[cpu::kChunk], sg[cpu::kChunk];
  cpu::load_row(g, gate, start, count);
  cpu::load_row(u, up, start, count);
  cpu::load_row(d, dout, start, count);
  sigmoid_row(sg, g, count);
  for (int64_t i = 0; i < count; ++i) {
    const float s = sg[i];
    float silu = g[i] * s;
    g[i] = d[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
    u[i] = d[i] * silu;
  }
  cpu::store_row(dgate, start, g, count);
  cpu::store_row(dup, start, u, count);
}

void CpuBackend::swiglu_backward_impl(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                                      const Tensor& up) {
  cpu::for_each_chunk(dout.numel(), [&](int64_t start, int64_t count) {
    swiglu_backward_chunk(dgate, dup, dout, gate, up, start, count);
  });
  note_path(cpu::avx512_versions_isa());
}

}  // namespace ft
