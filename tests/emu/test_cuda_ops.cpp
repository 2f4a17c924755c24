// The CUDA backend (kernels/cuda/) under the emulator: every op against the
// CPU backend on random inputs of odd sizes, under every thread schedule
// (results must be bit-identical across schedules). Device tensors come from
// a plain DeviceAllocator, so each is its own emulator allocation: fresh
// memory reads as NaN (an output with NaN means a kernel read memory nobody
// wrote) and writes past either end throw cuda_emu::Error.

#include <doctest/doctest.h>

#include <cstring>

#include "kernels/dropout_hash.h"
#include "model/rope.h"
#include "tests/emu/cuda_test_util.h"
#include "tests/wide_cross_entropy.h"

using namespace cuda_test;

TEST_CASE("cuda: copy between host and device with dtype conversion") {
  const DType floats[] = {DType::f32, DType::bf16, DType::f16};
  for (DType from : floats)
    for (DType to : floats) {
      CAPTURE(dtype_name(from));
      CAPTURE(dtype_name(to));
      Tensor src = host_random({7, 13}, from, 1, -100.0f, 100.0f);
      Tensor want = cpu.empty({7, 13}, to, MemCategory::activations);
      cpu.copy(want, src);
      // host -> device with conversion, device -> device, device -> host with conversion.
      std::vector<float> got = emu_test::same_under_schedules([&] {
        Tensor on_device = device_empty({91}, to);
        gpu.copy(on_device, src);
        Tensor wide = device_empty({7, 13}, DType::f32);
        gpu.copy(wide, on_device);
        Tensor back = cpu.empty({7, 13}, to, MemCategory::activations);
        gpu.copy(back, wide);
        return values({&on_device, &back});
      });
      std::vector<float> expected = values(want);
      expected.insert(expected.end(), expected.begin(), expected.end());
      CHECK(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)) == 0);
    }
  Tensor ids = host_ints({3, -7, 1 << 30, 0, 42});
  CHECK(values(host_copy(to_device(ids))) == values(ids));
  Tensor i32 = device_empty({5}, DType::i32), f32 = device_empty({5}, DType::f32);
  CHECK_THROWS_AS(gpu.copy(f32, to_device(ids)), Error);
  CHECK_THROWS_AS(gpu.copy(i32, host_random({6}, DType::f32, 2)), Error);
}

TEST_CASE("cuda: fill") {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::i8, DType::i32}) {
    CAPTURE(dtype_name(dtype));
    Tensor want = cpu.empty({3, 37}, dtype, MemCategory::activations);
    cpu.fill(want, -3.3f);
    std::vector<float> got = emu_test::same_under_schedules([&] {
      Tensor t = device_empty({3, 37}, dtype);
      gpu.fill(t, -3.3f);
      return values(t);
    });
    CHECK(got == values(want));
  }
}

TEST_CASE("cuda: matmul (tiled GEMM) with transposes, mixed dtypes, alpha and beta") {
  struct Case {
    DType a, b, out;
  };
  const Case cases[] = {{DType::f32, DType::f32, DType::f32},
                        {DType::bf16, DType::bf16, DType::bf16},
                        {DType::bf16, DType::bf16, DType::f32},
                        {DType::f32, DType::bf16, DType::f32},
                        {DType::bf16, DType::f32, DType::bf16}};
  const int64_t M = 70, N = 67, K = 83;  // two tiles each way, six k slices, ragged edges
  for (const Case& c : cases)
    for (int transposes = 0; transposes < 4; ++transposes) {
      bool ta = transposes & 1, tb = transposes & 2;
      CAPTURE(dtype_name(c.a));
      CAPTURE(dtype_name(c.b));
      CAPTURE(dtype_name(c.out));
      CAPTURE(transposes);
      Tensor a = host_random(ta ? Shape{K, M} : Shape{M, K}, c.a, 3);
      Tensor b = host_random(tb ? Shape{N, K} : Shape{K, N}, c.b, 4);
      Tensor out0 = host_random({M, N}, c.out, 5);
      Tensor want = host_copy(out0);
      cpu.matmul(want, a, b, ta, tb, 0.5f, transposes == 3 ? 0.0f : 0.75f);
      std::vector<float> got = emu_test::same_under_schedules([&] {
        Tensor out = transposes == 3 ? device_empty({M, N}, c.out) : to_device(out0);  // beta = 0: NaN is ignored
        gpu.matmul(out, to_device(a), to_device(b), ta, tb, 0.5f, transposes == 3 ? 0.0f : 0.75f);
        return values(out);
      });
      Tolerance tol = tolerance_for(c.out);
      check_close(got, values(want), {tol.atol + 1e-5, tol.rtol});  // sums of 83 terms of size ~1
    }
  // K = 0: out = beta * out.
  Tensor empty_a = to_device(host_random({5, 0}, DType::f32, 6));
  Tensor empty_b = to_device(host_random({0, 3}, DType::f32, 7));
  Tensor out = device_empty({5, 3}, DType::f32);
  gpu.matmul(out, empty_a, empty_b, false, false, 1.0f, 0.0f);
  CHECK(values(out) == std::vector<float>(15, 0.0f));
}

TEST_CASE("cuda: accumulate_outer_products is the CPU's, bit for bit") {
  // A LoRA A-like grad (5 x 67) and a B-like one (70 x 4), bf16 and f32
  // operands, 83 rows: the same row-ordered fma chain on both backends.
  struct Size {
    int64_t M, P;
  };
  const int64_t N = 83;
  unsigned seed = 20;
  for (const Size& s : {Size{5, 67}, Size{70, 4}})
    for (DType dtype : {DType::f32, DType::bf16}) {
      CAPTURE(s.M);
      CAPTURE(dtype_name(dtype));
      Tensor a = host_random({N, s.M}, dtype, seed++), b = host_random({N, s.P}, dtype, seed++);
      Tensor grad0 = host_random({s.M, s.P}, DType::f32, seed++);
      Tensor want = host_copy(grad0);
      cpu.accumulate_outer_products(want, a, b, 0.625f);
      std::vector<float> got = emu_test::same_under_schedules([&] {
        Tensor grad = to_device(grad0);
        gpu.accumulate_outer_products(grad, to_device(a), to_device(b), 0.625f);
        return values(grad);
      });
      CHECK(got == values(want));
    }
}

TEST_CASE("cuda: batched strided GEMM") {
  // Three column-major 9 x 11 = (9 x 13) @ (13 x 11) products with padded leading dimensions.
  const int64_t m = 9, n = 11, k = 13, batch = 3, lda = 10, ldb = 14, ldc = 12;
  Tensor a = host_random({batch, k, lda}, DType::bf16, 8), b = host_random({batch, n, ldb}, DType::bf16, 9);
  std::unique_ptr<cuda::Gemm> gemm = cuda::make_gemm(cuda::GemmKind::tiled, device_allocator);
  std::vector<float> got = emu_test::same_under_schedules([&] {
    Tensor da = to_device(a), db = to_device(b), c = device_empty({batch, n, ldc}, DType::f32);
    gpu.fill(c, 7.0f);  // the padding must survive
    cuda::GemmArgs args{m, n, k, int(batch), 1.0f, 0.0f, {da.data, DType::bf16, false, lda, k * lda},
                        {db.data, DType::bf16, false, ldb, n * ldb}, {c.data, DType::f32, ldc, n * ldc}};
    gemm->gemm(args, nullptr);
    return values(c);
  });
  std::vector<float> av = values(a), bv = values(b);
  for (int64_t z = 0; z < batch; ++z)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < ldc; ++i) {
        float want = 7.0f;
        if (i < m) {
          double acc = 0.0;
          for (int64_t p = 0; p < k; ++p) acc += double(av[z * k * lda + i + p * lda]) * bv[z * n * ldb + p + j * ldb];
          want = float(acc);
        }
        CHECK(std::abs(got[z * n * ldc + j * ldc + i] - want) <= 1e-5 + 1e-5 * std::abs(want));
      }
}

TEST_CASE("cuda: add, in place and with mixed dtypes") {
  Tensor a = host_random({9, 23}, DType::f32, 10), b = host_random({9, 23}, DType::bf16, 11);
  for (DType out_dtype : {DType::f32, DType::bf16}) {
    Tensor want = cpu.empty({9, 23}, out_dtype, MemCategory::activations);
    cpu.add(want, a, b);
    std::vector<float> got = emu_test::same_under_schedules([&] {
      Tensor out = device_empty({9, 23}, out_dtype);
      gpu.add(out, to_device(a), to_device(b));
      return values(out);
    });
    check_close(got, values(want), tolerance_for(out_dtype));
  }
  Tensor want = host_copy(a);
  cpu.add(want, want, b);
  std::vector<float> got = emu_test::same_under_schedules([&] {
    Tensor x = to_device(a);
    gpu.add(x, x, to_device(b));
    return values(x);
  });
  check_close(got, values(want), kF32);
}

TEST_CASE("cuda: embedding forward and backward with repeated ids") {
  const int64_t V = 11, C = 37;
  Tensor ids = host_ints({3, 0, 10, 3, 7, 3, 10});
  for (DType dtype : {DType::f32, DType::bf16}) {
    CAPTURE(dtype_name(dtype));
    Tensor table = host_random({V, C}, dtype, 12), dout = host_random({7, C}, dtype, 13);
    Tensor want_out = cpu.empty({7, C}, dtype, MemCategory::activations), want_dtable = host_copy(table);
    cpu.embedding_forward(want_out, ids, table);
    cpu.embedding_backward(want_dtable, ids, dout);
    std::vector<float> got = emu_test::same_under_schedules([&] {
      Tensor out = device_empty({7, C}, dtype), dtable = to_device(table), device_ids = to_device(ids);
      gpu.embedding_forward(out, device_ids, dtable);
      gpu.embedding_backward(dtable, device_ids, to_device(dout));
      return values({&out, &dtable});
    });
    check_close(got, values({&want_out, &want_dtable}), tolerance_for(dtype));
  }
}

TEST_CASE("cuda: rmsnorm forward and backward, dweight accumulated") {
  struct Case {
    int64_t rows, channels;
    DType x, weight;
  };
  // 300 rows > 256 row blocks: some blocks sum two rows into their dweight partials.
  const Case cases[] = {{13, 75, DType::f32, DType::f32}, {13, 301, DType::bf16, DType::bf16},
                        {300, 7, DType::bf16, DType::f32}};
  for (const Case& c : cases) {
    CAPTURE(c.rows);
    CAPTURE(dtype_name(c.x));
    Tensor x = host_random({c.rows, c.channels}, c.x, 14, -2.0f, 2.0f);
    Tensor weight = host_random({c.channels}, c.weight, 15);
    Tensor dout = host_random({c.rows, c.channels}, c.x, 16);
    Tensor dweight0 = host_random({c.channels}, c.weight, 17);
    Tensor want_out = cpu.empty(x.shape, c.x, MemCategory::activations);
    Tensor want_rstd = cpu.empty({c.rows}, DType::f32, MemCategory::activations);
    Tensor want_dx = cpu.empty(x.shape, c.x, MemCategory::activations), want_dweight = host_copy(dweight0);
    cpu.rmsnorm_forward(want_out, want_rstd, x, weight, 1e-5f);
    cpu.rmsnorm_backward(want_dx, &want_dweight, dout, x, weight, want_rstd);
    std::vector<float> got = emu_test::same_under_schedules([&] {
      Tensor out = device_empty(x.shape, c.x), rstd = device_empty({c.rows}, DType::f32);
      Tensor dx = device_empty(x.shape, c.x), dweight = to_device(dweight0);
      Tensor dx_only = device_empty(x.shape, c.x);
      Tensor dx_in = to_device(x), dweight_in = to_device(weight), ddout = to_device(dout);
      gpu.rmsnorm_forward(out, rstd, dx_in, dweight_in, 1e-5f);
      gpu.rmsnorm_backward(dx, &dweight, ddout, dx_in, dweight_in, rstd);
      gpu.rmsnorm_backward(dx_only, nullptr, ddout, dx_in, dweight_in, rstd);
      return values({&out, &rstd, &dx, &dweight, &dx_only});
    });
    size_t n = size_t(x.numel()), r = size_t(c.rows), ch = size_t(c.channels);
    auto part = [&](size_t from, size_t count) {
      return std::vector<float>(got.begin() + long(from), got.begin() + long(from + count));
    };
    Tolerance tol = tolerance_for(c.x);
    check_close(part(0, n), values(want_out), normed_out_tolerance(c.x));
    check_close(part(n, r), values(want_rstd), kF32);
    // dx = r * (g - n * mean(g n)) cancels: compare against the row's scale, not each element.
    check_close(part(n + r, n), values(want_dx), {2e-5, tol.rtol});
    check_close(part(2 * n + r, ch), values(want_dweight), {1e-5 * double(c.rows), tolerance_for(c.weight).rtol});
    CHECK(part(2 * n + r + ch, n) == part(n + r, n));
  }
}

TEST_CASE("cuda: rope forward and backward") {
  for (int rotary_dim : {10, 6}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      CAPTURE(rotary_dim);
      CAPTURE(dtype_name(dtype));
      Tensor x = host_random({5, 3, 10}, dtype, 18);
      Tensor positions = host_ints({0, 1, 17, 1999, 4095});
      Tensor want_fwd = host_copy(x), want_bwd = host_copy(x);
      // Scaled frequencies (llama3-like bands): each feature's own inv_freq is used.
      std::vector<float> inv_freq = ft::default_rope_inv_freq(10000.0f, rotary_dim);
      for (size_t i = inv_freq.size() / 2; i < inv_freq.size(); ++i) inv_freq[i] /= 8.0f;
      cpu.rope_forward(want_fwd, positions, inv_freq);
      cpu.rope_backward(want_bwd, positions, inv_freq);
      std::vector<float> got = emu_test::same_under_schedules([&] {
        Tensor fwd = to_device(x), bwd = to_device(x), device_positions = to_device(positions);
        gpu.rope_forward(fwd, device_positions, inv_freq);
        gpu.rope_backward(bwd, device_positions, inv_freq);
        return values({&fwd, &bwd});
      });
      check_close(got, values({&want_fwd, &want_bwd}), tolerance_for(dtype));
    }
  }
}

TEST_CASE("cuda: swiglu forward and backward") {
  for (DType dtype : {DType::f32, DType::bf16}) {
    CAPTURE(dtype_name(dtype));
    Tensor gate = host_random({7, 29}, dtype, 19, -6.0f, 6.0f), up = host_random({7, 29}, dtype, 20);
    Tensor dout = host_random({7, 29}, dtype, 21);
    Tensor want_out = cpu.empty({7, 29}, dtype, MemCategory::activations);
    Tensor want_dgate = cpu.empty({7, 29}, dtype, MemCategory::activations);
    Tensor want_dup = cpu.empty({7, 29}, dtype, MemCategory::activations);
    cpu.swiglu_forward(want_out, gate, up);
    cpu.swiglu_backward(want_dgate, want_dup, dout, gate, up);
    std::vector<float> got = emu_test::same_under_schedules([&] {
      Tensor out = device_empty({7, 29}, dtype), dgate = device_empty({7, 29}, dtype);
      Tensor dup = device_empty({7, 29}, dtype), dgate_in = to_device(gate), dup_in = to_device(up);
      gpu.swiglu_forward(out, dgate_in, dup_in);
      gpu.swiglu_backward(dgate, dup, to_device(dout), dgate_in, dup_in);
      return values({&out, &dgate, &dup});
    });
    check_close(got, values({&want_out, &want_dgate, &want_dup}), tolerance_for(dtype));
  }
}

TEST_CASE("cuda: cross-entropy with ignored rows, dlogits separate and in place") {
  const int64_t N = 9, V = 1001;  // V > the 256 threads of a row block
  Tensor targets = host_ints({5, -100, 1000, 0, 77, -100, 999, 3, 500});
  for (DType dtype : {DType::f32, DType::bf16}) {
    CAPTURE(dtype_name(dtype));
    Tensor logits = host_random({N, V}, dtype, 22, -8.0f, 8.0f);
    Tensor want_losses = cpu.empty({N}, DType::f32, MemCategory::activations);
    Tensor want_dlogits = cpu.empty({N, V}, dtype, MemCategory::activations);
    cpu.cross_entropy(want_losses, &want_dlogits, logits, targets, 1.0f / 7.0f);
    std::vector<float> got = emu_test::same_under_schedules([&] {
      Tensor losses = device_empty({N}, DType::f32), losses_only = device_empty({N}, DType::f32);
      Tensor dlogits = device_empty({N, V}, dtype), device_targets = to_device(targets);
      Tensor in_place = to_device(logits), losses_in_place = device_empty({N}, DType::f32);
      gpu.cross_entropy(losses, &dlogits, to_device(logits), device_targets, 1.0f / 7.0f);
      gpu.cross_entropy(losses_only, nullptr, to_device(logits), device_targets, 1.0f / 7.0f);
      gpu.cross_entropy(losses_in_place, &in_place, in_place, device_targets, 1.0f / 7.0f);
      return values({&losses, &dlogits, &losses_only, &in_place, &losses_in_place});
    });
    std::vector<float> want = values({&want_losses, &want_dlogits});
    std::vector<float> want_all = want;
    want_all.insert(want_all.end(), want.begin(), want.begin() + N);
    want_all.insert(want_all.end(), want.begin() + N, want.end());
    want_all.insert(want_all.end(), want.begin(), want.begin() + N);
    check_close(got, want_all, {1e-6, dtype == DType::bf16 ? kBf16.rtol : 1e-5});

    // Per-row gradient scales, as the CPU applies them.
    Tensor scales = host_random({N}, DType::f32, 23, -3.0f, 3.0f);
    cpu.cross_entropy(want_losses, &want_dlogits, logits, targets, 1.0f / 7.0f, &scales);
    std::vector<float> scaled = emu_test::same_under_schedules([&] {
      Tensor losses = device_empty({N}, DType::f32), dlogits = device_empty({N, V}, dtype);
      Tensor device_scales = to_device(scales);
      gpu.cross_entropy(losses, &dlogits, to_device(logits), to_device(targets), 1.0f / 7.0f, &device_scales);
      return values({&losses, &dlogits});
    });
    check_close(scaled, values({&want_losses, &want_dlogits}), {1e-6, dtype == DType::bf16 ? kBf16.rtol : 1e-5});
  }
}

TEST_CASE("cuda: cross-entropy on 50k and 128k vocabularies within 1e-6 of float64") {
  for (int64_t vocab : {50257, 128256}) {
    CAPTURE(vocab);
    ft::testing::WideRows w = ft::testing::wide_rows(3, vocab, uint32_t(vocab) + 1);
    Tensor logits = cpu.empty({w.rows, vocab}, DType::f32, MemCategory::activations);
    std::memcpy(logits.data, w.logits.data(), w.logits.size() * sizeof(float));
    const float dloss = 0.5f;
    ft::testing::CrossEntropyF64 want = ft::testing::cross_entropy_f64(w.logits, w.targets, vocab, dloss);
    std::vector<float> got = emu_test::same_under_schedules([&] {
      Tensor losses = device_empty({w.rows}, DType::f32), dlogits = device_empty({w.rows, vocab}, DType::f32);
      gpu.cross_entropy(losses, &dlogits, to_device(logits), to_device(host_ints(w.targets)), dloss);
      return values({&losses, &dlogits});
    });
    std::vector<float> got_losses(got.begin(), got.begin() + w.rows), got_dlogits(got.begin() + w.rows, got.end());
    CHECK(ft::testing::worst_relative_error(got_losses, want.losses) <= 1e-6);
    // As on the CPU: exp(x - max) with x - max rounded to f32 (2^-24 * |x - max|
    // relative, < 1.9e-6 here), plus expf's 2 ulp on a GPU.
    CHECK(ft::testing::worst_relative_error(got_dlogits, want.dlogits) <= 4e-6);
  }
}

TEST_CASE("cuda: dropout forward and backward, in place, p = 0 and p = 1") {
  for (float p : {0.0f, 0.3f, 1.0f}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      CAPTURE(p);
      CAPTURE(dtype_name(dtype));
      Tensor x = host_random({11, 19}, dtype, 23), want = host_copy(x), want_back = host_copy(x);
      cpu.dropout_forward(want, x, p, 1234);
      cpu.dropout_backward(want_back, want_back, p, 99);
      std::vector<float> got = emu_test::same_under_schedules([&] {
        Tensor out = device_empty({11, 19}, dtype), back = to_device(x);
        gpu.dropout_forward(out, to_device(x), p, 1234);
        gpu.dropout_backward(back, back, p, 99);
        return values({&out, &back});
      });
      CHECK(got == values({&want, &want_back}));  // the same products and roundings: exact
    }
  }
  // A shard of a wider tensor's columns (row_stride): the same mask as the CPU's.
  Tensor x = host_random({11, 19}, DType::bf16, 29), want = host_copy(x), want_back = host_copy(x);
  cpu.dropout_forward(want, x, 0.3f, seed_at(1234, 5), 50);
  cpu.dropout_backward(want_back, want_back, 0.3f, seed_at(99, 5), 50);
  Tensor out = device_empty({11, 19}, DType::bf16), back = to_device(x);
  gpu.dropout_forward(out, to_device(x), 0.3f, seed_at(1234, 5), 50);
  gpu.dropout_backward(back, back, 0.3f, seed_at(99, 5), 50);
  CHECK(values({&out, &back}) == values({&want, &want_back}));
}

TEST_CASE("cuda: add_uniform_noise equals the CPU's bit for bit, f32 and bf16") {
  for (DType dtype : {DType::f32, DType::bf16}) {
    CAPTURE(dtype_name(dtype));
    Tensor x = host_random({13, 301}, dtype, 31), want = host_copy(x);
    cpu.add_uniform_noise(want, 0.0125f, 1234);
    std::vector<float> got = emu_test::same_under_schedules([&] {
      Tensor noisy = to_device(x);
      gpu.add_uniform_noise(noisy, 0.0125f, 1234);
      return values({&noisy});
    });
    CHECK(got == values({&want}));  // the same draw and one fused rounding: exact
    CHECK(got != values({&x}));
  }
}

TEST_CASE("cuda: AdamW over several steps") {
  const int64_t n = 1001;
  Tensor param = host_random({n}, DType::f32, 24), m = host_random({n}, DType::f32, 25, 0.0f, 0.0f);
  Tensor v = host_random({n}, DType::f32, 26, 0.0f, 0.0f);
  std::vector<Tensor> grads;
  for (unsigned s = 0; s < 3; ++s) grads.push_back(host_random({n}, DType::f32, 27 + s));
  Tensor want_param = host_copy(param), want_m = host_copy(m), want_v = host_copy(v);
  auto step = [](int64_t t) { return AdamWStep{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 0.7f, t}; };
  for (int64_t t = 1; t <= 3; ++t) cpu.adamw_update(want_param, grads[size_t(t - 1)], want_m, want_v, step(t));
  std::vector<float> got = emu_test::same_under_schedules([&] {
    Tensor dp = to_device(param), dm = to_device(m), dv = to_device(v);
    for (int64_t t = 1; t <= 3; ++t) gpu.adamw_update(dp, to_device(grads[size_t(t - 1)]), dm, dv, step(t));
    return values({&dp, &dm, &dv});
  });
  check_close(got, values({&want_param, &want_m, &want_v}), {1e-9, 1e-5});
}

TEST_CASE("cuda: sum_squares is deterministic and matches the CPU") {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int64_t n : {int64_t(1), int64_t(1000), int64_t(70001)}) {  // 70001 > 256 blocks of 256
      CAPTURE(dtype_name(dtype));
      CAPTURE(n);
      Tensor x = host_random({n}, dtype, 30, -3.0f, 3.0f);
      double want = cpu.sum_squares(x);
      std::vector<double> got =
          emu_test::same_under_schedules([&] { return std::vector<double>{gpu.sum_squares(to_device(x))}; });
      CHECK(std::abs(got[0] - want) <= 1e-12 * want);
    }
  }
}

TEST_CASE("cuda: quantize_rows_int8") {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(dtype));
    Tensor x = host_random({6, 301}, dtype, 32, -4.0f, 4.0f);
    for (int64_t k = 0; k < 301; ++k) store_from_f32(x.data, dtype, 2 * 301 + k, 0.0f);  // an all-zero row
    store_from_f32(x.data, dtype, 4 * 301 + 5, 127.0f);  // codes at exact .5 boundaries: 0.5 * k steps
    for (int64_t k = 6; k < 20; ++k) store_from_f32(x.data, dtype, 4 * 301 + k, 0.5f * float(k));
    Tensor want_q = cpu.empty(x.shape, DType::i8, MemCategory::weights);
    Tensor want_scales = cpu.empty({6}, DType::f32, MemCategory::weights);
    cpu.quantize_rows_int8(want_q, want_scales, x);
    std::vector<float> got = emu_test::same_under_schedules([&] {
      Tensor q = device_empty(x.shape, DType::i8), scales = device_empty({6}, DType::f32);
      gpu.quantize_rows_int8(q, scales, to_device(x));
      return values({&q, &scales});
    });
    CHECK(got == values({&want_q, &want_scales}));  // exact: the same double arithmetic
  }
}

TEST_CASE("cuda: argument checks and CUDA error reporting") {
  Tensor host = host_random({4, 5}, DType::f32, 31), device = to_device(host);
  CHECK_THROWS_WITH_AS(gpu.add(device, host, device), doctest::Contains("must be a CUDA tensor"), Error);
  Tensor wrong = device_empty({5, 4}, DType::f32);
  CHECK_THROWS_WITH_AS(gpu.swiglu_forward(device, wrong, device), doctest::Contains("has shape [5, 4]"), Error);
  CHECK_THROWS_WITH_AS(device_allocator.allocate(size_t(1) << 60, MemCategory::activations),
                       doctest::Contains("cudaMalloc"), Error);
  CHECK_THROWS_WITH_AS(FT_CUDA_CHECK(cudaErrorMemoryAllocation),
                       doctest::Contains("cudaErrorMemoryAllocation failed: out of memory (" __FILE__ ":"), Error);
  CHECK_THROWS_AS(CudaBackend{host_allocator}, Error);
}

TEST_CASE("cuda: caching allocator reuses blocks, so a repeated step does no cudaMalloc") {
  CHECK(cuda::caching_size_class(1) == 512);
  CHECK(cuda::caching_size_class(513) == 1024);
  CHECK(cuda::caching_size_class((1 << 20) + 1) == (1 << 20) + (1 << 17));
  CachingAllocator caching(device_allocator);
  CudaBackend backend(caching);
  // What the backend holds for its lifetime: cuBLASLt's workspace on a GPU,
  // nothing with the emulator's tiled GEMM.
  const CachingStats held = caching.stats();
  CHECK(held.current_bytes == (cuda::default_gemm_kind() == cuda::GemmKind::cublaslt
                                   ? cuda::caching_block_bytes(cuda::kCublasLtWorkspaceBytes, MemCategory::workspace)
                                   : 0));
  auto step = [&] {
    Tensor x = backend.empty({17, 33}, DType::bf16, MemCategory::activations);
    backend.fill(x, 1.0f);
    Tensor y = backend.empty({17, 33}, DType::f32, MemCategory::activations);
    backend.copy(y, x);
    Tensor h = cpu.empty({17, 33}, DType::f32, MemCategory::activations);
    backend.copy(h, x);  // device bf16 -> host f32 converts in scratch
    return backend.sum_squares(y);  // scratch for the partial sums
  };
  CHECK(step() == 17.0 * 33.0);
  CachingStats first = caching.stats();
  CHECK(first.allocation_count > 0);
  CHECK(first.current_bytes == held.current_bytes);
  CHECK(first.peak_bytes > held.current_bytes);
  CHECK(first.reserved_bytes >= first.peak_bytes);
  for (int i = 0; i < 3; ++i) step();
  CachingStats later = caching.stats();
  CHECK(later.allocation_count == first.allocation_count);
  CHECK(later.peak_bytes == first.peak_bytes);
  caching.release_cached();
  CHECK(caching.stats().reserved_bytes == held.current_bytes);
}
