// T5's CUDA ops (biased_attention_forward/backward, activation_forward/
// backward) under the emulator against the CPU backend: encoder, decoder and
// cross-attention shapes with odd sizes, f32 and bf16, dbias accumulated.
// Results must be bit-identical across thread schedules.
//
// Tolerances beyond cuda_test_util.h's kF32/kBf16: attention gradients sum
// Tq or Tk products in another order than the CPU and cancel in
// dS = P (dP - Di), so they get an absolute floor of 1e-5 (values are O(1)).
#include <doctest/doctest.h>

#include "tests/emu/cuda_test_util.h"

using namespace cuda_test;

namespace {

struct Case {
  int64_t B, Tq, Tk, H, D;
  bool causal, with_bias;
  std::vector<int32_t> key_lengths = {};  // per row; empty: every key
};

// Encoder self-attention, decoder self-attention, cross-attention (no bias);
// 130 keys or queries > the 128 threads of a block, so threads loop; then
// padded rows (key lengths) in the encoder and in cross-attention.
const Case kCases[] = {{2, 7, 7, 3, 5, false, true},
                       {2, 6, 6, 2, 4, true, true},
                       {2, 5, 9, 3, 6, false, false},
                       {1, 130, 130, 2, 3, true, true},
                       {1, 3, 130, 1, 7, false, false},
                       {2, 7, 7, 3, 5, false, true, {7, 4}},
                       {3, 5, 130, 2, 6, false, false, {130, 3, 129}}};

constexpr Tolerance kGrad{1e-5, 1e-5};

}  // namespace

TEST_CASE("cuda: biased attention forward and backward match the CPU, dbias accumulated") {
  for (const Case& c : kCases)
    for (DType dtype : {DType::f32, DType::bf16}) {
      CAPTURE(c.Tq);
      CAPTURE(c.Tk);
      CAPTURE(c.causal);
      CAPTURE(dtype_name(dtype));
      const Shape q_shape = {c.B, c.Tq, c.H, c.D}, kv_shape = {c.B, c.Tk, c.H, c.D};
      Tensor q = host_random(q_shape, dtype, 50, -2.0f, 2.0f), k = host_random(kv_shape, dtype, 51, -2.0f, 2.0f);
      Tensor v = host_random(kv_shape, dtype, 52), dout = host_random(q_shape, dtype, 53);
      Tensor bias = host_random({c.Tq, c.Tk, c.H}, dtype, 54, -3.0f, 3.0f);
      Tensor dbias_before = host_random({c.Tq, c.Tk, c.H}, DType::f32, 55);
      const Tensor* bias_arg = c.with_bias ? &bias : nullptr;
      const Tensor lengths = c.key_lengths.empty() ? Tensor{} : host_ints(c.key_lengths);
      const Tensor* lengths_arg = c.key_lengths.empty() ? nullptr : &lengths;
      Tensor out = cpu.empty(q_shape, dtype, MemCategory::activations);
      Tensor lse = cpu.empty({c.B, c.H, c.Tq}, DType::f32, MemCategory::activations);
      cpu.biased_attention_forward(out, lse, q, k, v, bias_arg, lengths_arg, c.causal);
      Tensor dq = cpu.empty(q_shape, dtype, MemCategory::activations);
      Tensor dk = cpu.empty(kv_shape, dtype, MemCategory::activations);
      Tensor dv = cpu.empty(kv_shape, dtype, MemCategory::activations);
      Tensor dbias = host_copy(dbias_before);
      cpu.biased_attention_backward(dq, dk, dv, &dbias, dout, q, k, v, out, lse, bias_arg, lengths_arg, c.causal);

      std::vector<float> got = emu_test::same_under_schedules([&] {
        Tensor gq = to_device(q), gk = to_device(k), gv = to_device(v), gdout = to_device(dout);
        Tensor gbias = to_device(bias), gdbias = to_device(dbias_before);
        Tensor glengths = c.key_lengths.empty() ? Tensor{} : to_device(lengths);
        const Tensor* glengths_arg = c.key_lengths.empty() ? nullptr : &glengths;
        Tensor gout = device_empty(q_shape, dtype), glse = device_empty({c.B, c.H, c.Tq}, DType::f32);
        gpu.biased_attention_forward(gout, glse, gq, gk, gv, c.with_bias ? &gbias : nullptr, glengths_arg, c.causal);
        // Backward from the CPU's forward, so only the backward's differences show.
        Tensor cout = to_device(out), clse = to_device(lse);
        Tensor gdq = device_empty(q_shape, dtype), gdk = device_empty(kv_shape, dtype);
        Tensor gdv = device_empty(kv_shape, dtype);
        gpu.biased_attention_backward(gdq, gdk, gdv, &gdbias, gdout, gq, gk, gv, cout, clse,
                                      c.with_bias ? &gbias : nullptr, glengths_arg, c.causal);
        return values({&gout, &glse, &gdq, &gdk, &gdv, &gdbias});
      });
      std::vector<float> forward(got.begin(), got.begin() + out.numel() + lse.numel());
      std::vector<float> backward(got.begin() + out.numel() + lse.numel(), got.end());
      check_close(forward, values({&out, &lse}), tolerance_for(dtype));
      const Tolerance grad_tol = dtype == DType::bf16 ? kBf16 : kGrad;
      check_close(std::vector<float>(backward.begin(), backward.end() - dbias.numel()), values({&dq, &dk, &dv}),
                  grad_tol);
      check_close(std::vector<float>(backward.end() - dbias.numel(), backward.end()), values(dbias), kGrad);
    }
}

TEST_CASE("cuda: activation relu and tanh GELU, plain and gated, match the CPU") {
  const int64_t n = 1043;
  for (Activation kind : {Activation::relu, Activation::gelu_tanh})
    for (bool gated : {false, true})
      for (DType dtype : {DType::f32, DType::bf16}) {
        CAPTURE(int(kind));
        CAPTURE(gated);
        CAPTURE(dtype_name(dtype));
        Tensor x = host_random({n}, dtype, 60, -4.0f, 4.0f), up = host_random({n}, dtype, 61);
        Tensor dout = host_random({n}, dtype, 62);
        const Tensor* up_arg = gated ? &up : nullptr;
        Tensor out = cpu.empty({n}, dtype, MemCategory::activations), dx = host_copy(dout);
        Tensor dup = cpu.empty({n}, dtype, MemCategory::activations);
        cpu.activation_forward(out, x, up_arg, kind);
        cpu.activation_backward(dx, gated ? &dup : nullptr, dx, x, up_arg, kind);
        std::vector<float> got = emu_test::same_under_schedules([&] {
          Tensor gx = to_device(x), gup = to_device(up), gdx = to_device(dout);
          Tensor gout = device_empty({n}, dtype), gdup = device_empty({n}, dtype);
          gpu.activation_forward(gout, gx, gated ? &gup : nullptr, kind);
          gpu.activation_backward(gdx, gated ? &gdup : nullptr, gdx, gx, gated ? &gup : nullptr, kind);
          return gated ? values({&gout, &gdx, &gdup}) : values({&gout, &gdx});
        });
        check_close(got, gated ? values({&out, &dx, &dup}) : values({&out, &dx}), tolerance_for(dtype));
      }
}

TEST_CASE("cuda: biased attention refuses rows that overflow a block's shared memory") {
  Tensor q = device_empty({1, 2, 1, 4}, DType::f32), k = device_empty({1, 7000, 1, 4}, DType::f32);
  Tensor v = device_empty({1, 7000, 1, 4}, DType::f32), out = device_empty({1, 2, 1, 4}, DType::f32);
  Tensor lse = device_empty({1, 1, 2}, DType::f32);
  CHECK_THROWS_WITH_AS(gpu.biased_attention_forward(out, lse, q, k, v, nullptr, nullptr, false),
                       doctest::Contains("shared memory"), Error);
}
