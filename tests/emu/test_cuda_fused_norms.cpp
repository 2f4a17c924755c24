// The fused residual norms (add_rmsnorm_forward, add_layernorm_forward,
// rmsnorm_backward_add, layernorm_backward_add) under the emulator: odd
// sizes, f32, bf16 and mixed dtypes, sum aliasing a and dx aliasing
// dresidual as the models call them, accumulated parameter gradients.
//
// Two comparisons: against the CUDA backend's own unfused sequence (add, then
// the norm; the norm's backward, then add), which must match bit for bit
// (the same kernels read the same rounded sum, and the gradient is rounded to
// dx's dtype before the residual is added, as the separate add does); and
// against the CPU backend, to the tolerances of the unfused norms' tests
// (test_cuda_ops.cpp, test_cuda_neox_ops.cpp), except dx: the norm's gradient
// is rounded to dx's dtype before dresidual is added, so an f32 difference
// that flips that rounding shows as one ulp of the gradient's scale (~1 here)
// even where the sum cancels: absolute 2^-7 for bf16, 2e-5 for f32. sum is
// one add and one rounding on both backends: exact.

#include <doctest/doctest.h>

#include "tests/emu/cuda_test_util.h"

using namespace cuda_test;

namespace {

struct Case {
  int64_t rows, channels;
  DType a, b, act;  // a: the residual stream, b: the block output, act: sum/out/gradients/weights
};
// 300 rows > 256 row blocks: some blocks sum two rows into their partials.
const Case kCases[] = {{13, 75, DType::f32, DType::f32, DType::f32},
                       {300, 7, DType::bf16, DType::bf16, DType::bf16},
                       {5, 1043, DType::f32, DType::bf16, DType::bf16},
                       {9, 301, DType::bf16, DType::f32, DType::f32}};

std::vector<float> slice(const std::vector<float>& v, size_t from, size_t count) {
  return std::vector<float>(v.begin() + long(from), v.begin() + long(from + count));
}

Tensor host_empty(const Shape& shape, DType dtype) { return cpu.empty(shape, dtype, MemCategory::activations); }

// A device tensor that sum may alias: a copy of a when a has sum's dtype.
Tensor device_sum_for(const Tensor& a, DType act) {
  return a.dtype == act ? to_device(a) : device_empty(a.shape, act);
}

struct Inputs {
  Tensor a, b, weight, bias, dout, dres, dweight0, dbias0;
};

// b spans a larger range than a, so sum's rounding to bf16 is visible.
Inputs inputs(const Case& c, unsigned seed) {
  const Shape rows{c.rows, c.channels}, cols{c.channels};
  return {host_random(rows, c.a, seed, -2.0f, 2.0f), host_random(rows, c.b, seed + 1, -8.0f, 8.0f),
          host_random(cols, c.act, seed + 2, 0.5f, 1.5f), host_random(cols, c.act, seed + 3),
          host_random(rows, c.act, seed + 4), host_random(rows, c.act, seed + 5),
          host_random(cols, c.act, seed + 6), host_random(cols, c.act, seed + 7)};
}

// The fused results (first half) must equal the unfused ones (second half).
void check_fused_equals_unfused(const std::vector<float>& got) {
  size_t half = got.size() / 2;
  CHECK(slice(got, 0, half) == slice(got, half, half));
}

Tolerance dx_tolerance(DType dtype) {
  return dtype == DType::bf16 ? Tolerance{1.0 / 128, 1.0 / 128} : Tolerance{2e-5, 1e-5};
}

}  // namespace

TEST_CASE("cuda: add_rmsnorm_forward and rmsnorm_backward_add equal add + rmsnorm, and the CPU's") {
  for (const Case& c : kCases) {
    CAPTURE(c.rows);
    CAPTURE(c.channels);
    CAPTURE(dtype_name(c.act));
    const int64_t N = c.rows, C = c.channels;
    const float eps = 1e-5f;
    Inputs in = inputs(c, 60);
    Tensor want_sum = host_empty({N, C}, c.act), want_out = host_empty({N, C}, c.act);
    Tensor want_rstd = host_empty({N}, DType::f32), want_dx = host_copy(in.dres);
    Tensor want_dweight = host_copy(in.dweight0);
    cpu.add_rmsnorm_forward(want_sum, want_out, want_rstd, in.a, in.b, in.weight, eps);
    cpu.rmsnorm_backward_add(want_dx, &want_dweight, in.dout, want_dx, want_sum, in.weight, want_rstd);
    std::vector<float> got = emu_test::same_under_schedules([&] {
      Tensor a = to_device(in.a), b = to_device(in.b), weight = to_device(in.weight), dout = to_device(in.dout);
      Tensor sum = device_sum_for(in.a, c.act), out = device_empty({N, C}, c.act);
      Tensor rstd = device_empty({N}, DType::f32), dx = to_device(in.dres), dweight = to_device(in.dweight0);
      gpu.add_rmsnorm_forward(sum, out, rstd, in.a.dtype == c.act ? sum : a, b, weight, eps);
      gpu.rmsnorm_backward_add(dx, &dweight, dout, dx, sum, weight, rstd);
      Tensor sum2 = device_empty({N, C}, c.act), out2 = device_empty({N, C}, c.act);
      Tensor rstd2 = device_empty({N}, DType::f32), dnorm = device_empty({N, C}, c.act);
      Tensor dx2 = to_device(in.dres), dweight2 = to_device(in.dweight0);
      gpu.add(sum2, a, b);
      gpu.rmsnorm_forward(out2, rstd2, sum2, weight, eps);
      gpu.rmsnorm_backward(dnorm, &dweight2, dout, sum2, weight, rstd2);
      gpu.add(dx2, dx2, dnorm);
      return values({&sum, &out, &rstd, &dx, &dweight, &sum2, &out2, &rstd2, &dx2, &dweight2});
    });
    check_fused_equals_unfused(got);
    size_t n = size_t(N * C), r = size_t(N), ch = size_t(C);
    Tolerance tol = tolerance_for(c.act);
    CHECK(slice(got, 0, n) == values(want_sum));
    check_close(slice(got, n, n), values(want_out), normed_out_tolerance(c.act));
    check_close(slice(got, 2 * n, r), values(want_rstd), kF32);
    check_close(slice(got, 2 * n + r, n), values(want_dx), dx_tolerance(c.act));
    check_close(slice(got, 3 * n + r, ch), values(want_dweight), {1e-5 * double(N), tol.rtol});
  }
}

TEST_CASE("cuda: add_layernorm_forward and layernorm_backward_add equal add + layernorm, and the CPU's") {
  for (const Case& c : kCases) {
    CAPTURE(c.rows);
    CAPTURE(c.channels);
    CAPTURE(dtype_name(c.act));
    const int64_t N = c.rows, C = c.channels;
    const float eps = 1e-5f;
    Inputs in = inputs(c, 70);
    Tensor want_sum = host_empty({N, C}, c.act), want_out = host_empty({N, C}, c.act);
    Tensor want_mean = host_empty({N}, DType::f32), want_rstd = host_empty({N}, DType::f32);
    Tensor want_dx = host_copy(in.dres), want_dweight = host_copy(in.dweight0), want_dbias = host_copy(in.dbias0);
    cpu.add_layernorm_forward(want_sum, want_out, want_mean, want_rstd, in.a, in.b, in.weight, in.bias, eps);
    cpu.layernorm_backward_add(want_dx, &want_dweight, &want_dbias, in.dout, want_dx, want_sum, in.weight, want_mean,
                               want_rstd);
    std::vector<float> got = emu_test::same_under_schedules([&] {
      Tensor a = to_device(in.a), b = to_device(in.b), weight = to_device(in.weight), bias = to_device(in.bias);
      Tensor dout = to_device(in.dout), sum = device_sum_for(in.a, c.act), out = device_empty({N, C}, c.act);
      Tensor mean = device_empty({N}, DType::f32), rstd = device_empty({N}, DType::f32);
      Tensor dx = to_device(in.dres), dweight = to_device(in.dweight0), dbias = to_device(in.dbias0);
      gpu.add_layernorm_forward(sum, out, mean, rstd, in.a.dtype == c.act ? sum : a, b, weight, bias, eps);
      gpu.layernorm_backward_add(dx, &dweight, &dbias, dout, dx, sum, weight, mean, rstd);
      Tensor sum2 = device_empty({N, C}, c.act), out2 = device_empty({N, C}, c.act);
      Tensor mean2 = device_empty({N}, DType::f32), rstd2 = device_empty({N}, DType::f32);
      Tensor dnorm = device_empty({N, C}, c.act), dx2 = to_device(in.dres);
      Tensor dweight2 = to_device(in.dweight0), dbias2 = to_device(in.dbias0);
      gpu.add(sum2, a, b);
      gpu.layernorm_forward(out2, mean2, rstd2, sum2, weight, bias, eps);
      gpu.layernorm_backward(dnorm, &dweight2, &dbias2, dout, sum2, weight, mean2, rstd2);
      gpu.add(dx2, dx2, dnorm);
      return values({&sum, &out, &mean, &rstd, &dx, &dweight, &dbias, &sum2, &out2, &mean2, &rstd2, &dx2, &dweight2,
                     &dbias2});
    });
    check_fused_equals_unfused(got);
    size_t n = size_t(N * C), r = size_t(N), ch = size_t(C);
    Tolerance tol = tolerance_for(c.act);
    CHECK(slice(got, 0, n) == values(want_sum));
    // LayerNorm's n * weight + bias cancels: an absolute floor on the row's scale.
    check_close(slice(got, n, n), values(want_out), {1e-5, tol.rtol});
    check_close(slice(got, 2 * n, r), values(want_mean), kF32);
    check_close(slice(got, 2 * n + r, r), values(want_rstd), kF32);
    size_t at = 2 * n + 2 * r;
    check_close(slice(got, at, n), values(want_dx), dx_tolerance(c.act));
    check_close(slice(got, at + n, ch), values(want_dweight), {1e-5 * double(N), tol.rtol});
    check_close(slice(got, at + n + ch, ch), values(want_dbias), {1e-5 * double(N), tol.rtol});
  }
}

TEST_CASE("cuda: fused residual norms reject mismatched residual operands") {
  Tensor x = device_empty({3, 4}, DType::f32), wrong = device_empty({3, 5}, DType::f32);
  Tensor w = device_empty({4}, DType::f32), stat = device_empty({3}, DType::f32);
  Tensor out = device_empty({3, 4}, DType::f32), host = host_empty({3, 4}, DType::f32);
  CHECK_THROWS_AS(gpu.add_rmsnorm_forward(out, out, stat, x, wrong, w, 1e-5f), Error);
  CHECK_THROWS_AS(gpu.add_rmsnorm_forward(wrong, out, stat, x, x, w, 1e-5f), Error);
  CHECK_THROWS_AS(gpu.add_layernorm_forward(out, out, stat, stat, x, host, w, w, 1e-5f), Error);
  CHECK_THROWS_AS(gpu.rmsnorm_backward_add(out, nullptr, x, wrong, x, w, stat), Error);
  CHECK_THROWS_AS(gpu.layernorm_backward_add(out, nullptr, nullptr, x, host, x, w, stat, stat), Error);
}
