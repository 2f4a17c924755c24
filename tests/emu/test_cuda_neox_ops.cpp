// GPT-NeoX's CUDA ops (copy_columns, add_bias, bias_backward, LayerNorm,
// GELU) under the emulator against the CPU backend: odd sizes, f32 and bf16
// (mixed where the op accepts it), accumulated parameter gradients, aliasing,
// argument errors. Results must be bit-identical across thread schedules.
//
// Tolerances beyond cuda_test_util.h's kF32/kBf16 (both stated where used):
// outputs that cancel (LayerNorm's n * weight + bias, its dx) get an absolute
// floor on the scale of the row, 1e-5 (f32) or 2e-5 (dx), since the kernels
// sum in another order than the CPU; column sums over R rows of values in
// [-1, 1] get 1e-5 * R. bf16 outputs keep kBf16's 2^-7 relative (two ulps).

#include <doctest/doctest.h>

#include "tests/emu/cuda_test_util.h"

using namespace cuda_test;

namespace {

std::vector<float> slice(const std::vector<float>& v, size_t from, size_t count) {
  return std::vector<float>(v.begin() + long(from), v.begin() + long(from + count));
}

Tensor host_empty(const Shape& shape, DType dtype) { return cpu.empty(shape, dtype, MemCategory::activations); }

}  // namespace

TEST_CASE("cuda: copy_columns splits a fused [N, 3C] tensor and puts it back together") {
  struct Case {
    int64_t rows, channels;
    DType fused, part;
  };
  const Case cases[] = {{5, 1, DType::f32, DType::f32}, {37, 7, DType::bf16, DType::f32},
                        {9, 300, DType::f32, DType::bf16}, {3, 1043, DType::bf16, DType::bf16}};
  for (const Case& c : cases) {
    CAPTURE(c.channels);
    CAPTURE(dtype_name(c.fused));
    CAPTURE(dtype_name(c.part));
    const int64_t N = c.rows, C = c.channels;
    Tensor fused = host_random({N, 3 * C}, c.fused, 40);
    std::vector<Tensor> want_parts;
    for (int64_t i = 0; i < 3; ++i) {
      want_parts.push_back(host_empty({N, C}, c.part));
      cpu.copy_columns(want_parts.back(), 0, fused, i * C, C);
    }
    Tensor want_back = host_empty({N, 3 * C}, c.fused);
    for (int64_t i = 0; i < 3; ++i) cpu.copy_columns(want_back, i * C, want_parts[size_t(i)], 0, C);
    // A window in the middle of both tensors: columns outside it keep their values.
    Tensor want_window = host_random({N, 3 * C}, c.fused, 41);
    cpu.copy_columns(want_window, C, fused, C / 2 + 1, C + C / 2);
    std::vector<float> got = emu_test::same_under_schedules([&] {
      Tensor device_fused = to_device(fused), back = device_empty({N, 3 * C}, c.fused);
      Tensor window = to_device(host_random({N, 3 * C}, c.fused, 41));
      std::vector<Tensor> parts;
      for (int64_t i = 0; i < 3; ++i) {
        parts.push_back(device_empty({N, C}, c.part));
        gpu.copy_columns(parts.back(), 0, device_fused, i * C, C);
      }
      for (int64_t i = 0; i < 3; ++i) gpu.copy_columns(back, i * C, parts[size_t(i)], 0, C);
      gpu.copy_columns(window, C, device_fused, C / 2 + 1, C + C / 2);
      return values({&parts[0], &parts[1], &parts[2], &back, &window});
    });
    // Exact: a copy, or one rounding to bf16 as the CPU's.
    CHECK(got == values({&want_parts[0], &want_parts[1], &want_parts[2], &want_back, &want_window}));
  }
}

TEST_CASE("cuda: add_bias and bias_backward with mixed dtypes, dbias accumulated") {
  struct Case {
    Shape shape;
    DType out, bias;
  };
  // 300 rows > 256 row groups: some groups sum two rows.
  const Case cases[] = {{{5, 1}, DType::f32, DType::f32},
                        {{37, 300}, DType::bf16, DType::f32},
                        {{300, 7}, DType::f32, DType::bf16},
                        {{2, 3, 1043}, DType::bf16, DType::bf16}};
  for (const Case& c : cases) {
    CAPTURE(shape_string(c.shape));
    CAPTURE(dtype_name(c.out));
    CAPTURE(dtype_name(c.bias));
    const int64_t C = c.shape.back();
    Tensor out0 = host_random(c.shape, c.out, 42), bias = host_random({C}, c.bias, 43);
    Tensor dbias0 = host_random({C}, c.bias, 44);
    Tensor want_out = host_copy(out0), want_dbias = host_copy(dbias0);
    cpu.add_bias(want_out, bias);
    cpu.bias_backward(want_dbias, out0);
    std::vector<float> got = emu_test::same_under_schedules([&] {
      Tensor out = to_device(out0), dbias = to_device(dbias0);
      gpu.add_bias(out, to_device(bias));
      gpu.bias_backward(dbias, to_device(out0));
      return values({&out, &dbias});
    });
    size_t n = size_t(out0.numel());
    check_close(slice(got, 0, n), values(want_out), tolerance_for(c.out));
    double rows = double(out0.rows());
    check_close(slice(got, n, size_t(C)), values(want_dbias), {1e-5 * rows, tolerance_for(c.bias).rtol});
  }
}

TEST_CASE("cuda: layernorm forward and backward, mixed dtypes, dweight and dbias accumulated") {
  struct Case {
    int64_t rows, channels;
    DType x, weight, out;
  };
  // 300 rows > 256 row blocks: some blocks sum two rows into their partials.
  // channels 1: zero variance, out = bias and dx = 0.
  const Case cases[] = {{5, 1, DType::f32, DType::f32, DType::f32},
                        {13, 7, DType::bf16, DType::f32, DType::f32},
                        {37, 300, DType::bf16, DType::bf16, DType::bf16},
                        {9, 1043, DType::f32, DType::bf16, DType::bf16},
                        {300, 75, DType::f32, DType::f32, DType::bf16}};
  for (const Case& c : cases) {
    CAPTURE(c.rows);
    CAPTURE(c.channels);
    CAPTURE(dtype_name(c.x));
    const int64_t N = c.rows, C = c.channels;
    // Values around 4 with spread ~0.6: the mean is large against the spread.
    Tensor x = host_random({N, C}, c.x, 45, 3.0f, 5.0f);
    Tensor weight = host_random({C}, c.weight, 46), bias = host_random({C}, c.weight, 47);
    Tensor dout = host_random({N, C}, c.out, 48);
    Tensor dweight0 = host_random({C}, c.weight, 49), dbias0 = host_random({C}, c.weight, 50);
    Tensor want_out = host_empty({N, C}, c.out), want_mean = host_empty({N}, DType::f32);
    Tensor want_rstd = host_empty({N}, DType::f32), want_dx = host_empty({N, C}, c.x);
    Tensor want_dweight = host_copy(dweight0), want_dbias = host_copy(dbias0);
    cpu.layernorm_forward(want_out, want_mean, want_rstd, x, weight, bias, 1e-5f);
    cpu.layernorm_backward(want_dx, &want_dweight, &want_dbias, dout, x, weight, want_mean, want_rstd);
    std::vector<float> got = emu_test::same_under_schedules([&] {
      Tensor out = device_empty({N, C}, c.out), mean = device_empty({N}, DType::f32);
      Tensor rstd = device_empty({N}, DType::f32), dx = device_empty({N, C}, c.x);
      Tensor dx_only = device_empty({N, C}, c.x), dx_bias = device_empty({N, C}, c.x);
      Tensor dweight = to_device(dweight0), dbias = to_device(dbias0), dbias_alone = to_device(dbias0);
      Tensor dev_x = to_device(x), dev_weight = to_device(weight), dev_dout = to_device(dout);
      gpu.layernorm_forward(out, mean, rstd, dev_x, dev_weight, to_device(bias), 1e-5f);
      gpu.layernorm_backward(dx, &dweight, &dbias, dev_dout, dev_x, dev_weight, mean, rstd);
      gpu.layernorm_backward(dx_only, nullptr, nullptr, dev_dout, dev_x, dev_weight, mean, rstd);
      gpu.layernorm_backward(dx_bias, nullptr, &dbias_alone, dev_dout, dev_x, dev_weight, mean, rstd);
      return values({&out, &mean, &rstd, &dx, &dweight, &dbias, &dx_only, &dx_bias, &dbias_alone});
    });
    size_t n = size_t(N * C), r = size_t(N), ch = size_t(C);
    Tolerance out_tol = tolerance_for(c.out), x_tol = tolerance_for(c.x), w_tol = tolerance_for(c.weight);
    check_close(slice(got, 0, n), values(want_out), {1e-5, out_tol.rtol});
    check_close(slice(got, n, r), values(want_mean), kF32);
    check_close(slice(got, n + r, r), values(want_rstd), kF32);
    size_t at = n + 2 * r;
    check_close(slice(got, at, n), values(want_dx), {2e-5, x_tol.rtol});
    check_close(slice(got, at + n, ch), values(want_dweight), {1e-5 * double(N), w_tol.rtol});
    check_close(slice(got, at + n + ch, ch), values(want_dbias), {1e-5 * double(N), w_tol.rtol});
    // Without (some) parameter gradients: dx bit for bit the same, dbias too.
    at += n + 2 * ch;
    CHECK(slice(got, at, n) == slice(got, n + 2 * r, n));
    CHECK(slice(got, at + n, n) == slice(got, n + 2 * r, n));
    CHECK(slice(got, at + 2 * n, ch) == slice(got, n + 2 * r + n + ch, ch));
  }
}

TEST_CASE("cuda: gelu forward and backward, both forms, separate and in place") {
  struct Case {
    Shape shape;
    DType x, out;
  };
  const Case cases[] = {{{7, 29}, DType::f32, DType::f32},
                        {{5, 1043}, DType::bf16, DType::bf16},
                        {{3, 1, 11}, DType::bf16, DType::f32},
                        {{13, 7}, DType::f32, DType::bf16}};
  for (GeluKind kind : {GeluKind::erf, GeluKind::tanh}) {
    for (const Case& c : cases) {
      CAPTURE(kind == GeluKind::erf ? "erf" : "tanh");
      CAPTURE(shape_string(c.shape));
      CAPTURE(dtype_name(c.x));
      CAPTURE(dtype_name(c.out));
      // [-6, 6] reaches both tails, where gelu -> 0 and gelu -> x.
      Tensor x = host_random(c.shape, c.x, 51, -6.0f, 6.0f), dout = host_random(c.shape, c.out, 52);
      Tensor want_out = host_empty(c.shape, c.out), want_dx = host_empty(c.shape, c.out);
      Tensor want_in_place = host_copy(x), want_dx_in_place = host_copy(dout);
      cpu.gelu_forward(want_out, x, kind);
      cpu.gelu_forward(want_in_place, want_in_place, kind);
      cpu.gelu_backward(want_dx, dout, x, kind);
      cpu.gelu_backward(want_dx_in_place, want_dx_in_place, x, kind);
      std::vector<float> got = emu_test::same_under_schedules([&] {
        Tensor dev_x = to_device(x), dev_dout = to_device(dout);
        Tensor out = device_empty(c.shape, c.out), dx = device_empty(c.shape, c.out);
        Tensor in_place = to_device(x), dx_in_place = to_device(dout);
        gpu.gelu_forward(out, dev_x, kind);
        gpu.gelu_forward(in_place, in_place, kind);
        gpu.gelu_backward(dx, dev_dout, dev_x, kind);
        gpu.gelu_backward(dx_in_place, dx_in_place, dev_x, kind);
        return values({&out, &dx, &in_place, &dx_in_place});
      });
      size_t n = size_t(x.numel());
      Tolerance out_tol = tolerance_for(c.out), x_tol = tolerance_for(c.x);
      check_close(slice(got, 0, 2 * n), values({&want_out, &want_dx}), out_tol);
      check_close(slice(got, 2 * n, n), values(want_in_place), x_tol);
      check_close(slice(got, 3 * n, n), values(want_dx_in_place), out_tol);
    }
  }
}

TEST_CASE("cuda: copy_columns, bias, layernorm and gelu reject wrong shapes, dtypes and column ranges") {
  Tensor x = to_device(host_random({4, 6}, DType::f32, 53)), fused = to_device(host_random({4, 18}, DType::f32, 54));
  Tensor w = to_device(host_random({6}, DType::f32, 55)), w5 = device_empty({5}, DType::f32);
  Tensor mean = device_empty({4}, DType::f32), rstd = device_empty({4}, DType::f32);
  Tensor out = device_empty({4, 6}, DType::f32), rows5 = device_empty({5, 6}, DType::f32);
  auto has_shape = doctest::Contains("has shape");
  CHECK_THROWS_WITH_AS(gpu.copy_columns(x, 0, fused, 13, 6), doctest::Contains("out of range"), Error);
  CHECK_THROWS_WITH_AS(gpu.copy_columns(x, 1, fused, 0, 6), doctest::Contains("out of range"), Error);
  CHECK_THROWS_WITH_AS(gpu.copy_columns(x, 0, fused, -1, 3), doctest::Contains("out of range"), Error);
  CHECK_THROWS_WITH_AS(gpu.copy_columns(rows5, 0, fused, 0, 6), doctest::Contains("differ in rows"), Error);
  CHECK_THROWS_WITH_AS(gpu.copy_columns(x, 0, x, 3, 3), doctest::Contains("must not alias"), Error);
  CHECK_THROWS_WITH_AS(gpu.add_bias(x, w5), has_shape, Error);
  CHECK_THROWS_WITH_AS(gpu.bias_backward(w5, x), has_shape, Error);
  CHECK_THROWS_WITH_AS(gpu.layernorm_forward(out, mean, rstd, x, w5, w, 1e-5f), has_shape, Error);
  CHECK_THROWS_WITH_AS(gpu.layernorm_forward(out, mean, rstd, x, w, w5, 1e-5f), has_shape, Error);
  CHECK_THROWS_WITH_AS(gpu.layernorm_forward(rows5, mean, rstd, x, w, w, 1e-5f), has_shape, Error);
  CHECK_THROWS_WITH_AS(gpu.layernorm_forward(out, w5, rstd, x, w, w, 1e-5f), doctest::Contains("expected 4 elements"),
                       Error);
  Tensor ids = to_device(host_ints({0, 1, 2, 3}));
  CHECK_THROWS_WITH_AS(gpu.layernorm_forward(out, ids, rstd, x, w, w, 1e-5f), doctest::Contains("must be f32"),
                       Error);
  CHECK_THROWS_WITH_AS(gpu.layernorm_backward(out, &w5, nullptr, x, x, w, mean, rstd), has_shape, Error);
  CHECK_THROWS_WITH_AS(gpu.layernorm_backward(rows5, nullptr, nullptr, x, x, w, mean, rstd), has_shape, Error);
  CHECK_THROWS_WITH_AS(gpu.gelu_forward(rows5, x, GeluKind::erf), has_shape, Error);
  CHECK_THROWS_WITH_AS(gpu.gelu_backward(out, rows5, x, GeluKind::tanh), has_shape, Error);
  Tensor host = host_random({4, 6}, DType::f32, 56);
  CHECK_THROWS_WITH_AS(gpu.gelu_forward(out, host, GeluKind::erf), doctest::Contains("must be a CUDA tensor"), Error);
}
