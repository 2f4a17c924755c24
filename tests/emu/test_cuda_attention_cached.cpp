// CudaBackend::attention_cached against CpuBackend under the emulator: decode
// steps (one query per row, rows at different positions), a whole prefill
// (queries at 0..T-1), GQA, head_dim 20 / 96 / 256, sliding windows, bf16
// caches. The kernel sums keys one at a time where the CPU sums them in tiles
// with an online softmax over each tile, so outputs agree to f32 rounding
// (kF32: 1e-5 relative); the same bits under every thread schedule. With
// bf16 caches the CPU also rounds each probability to bf16 (2^-9 relative)
// before P V, as its bf16 attention does, which moves an output by up to
// 2^-9 max |v| = 2^-9 absolute (v in [-1, 1]), on top of the bf16 ulp of the
// result (kBf16's 1/128 relative).
#include <doctest/doctest.h>

#include <cmath>

#include "tests/emu/cuda_test_util.h"

using namespace cuda_test;

namespace {

struct CachedCase {
  int64_t batch, queries, q_heads, kv_heads, head_dim, cache_seq;
  std::vector<int32_t> positions;  // batch * queries
  DType dtype = DType::f32;
  int64_t window = 0;
};

void run_case(const CachedCase& c) {
  CAPTURE(c.head_dim);
  CAPTURE(c.cache_seq);
  CAPTURE(c.window);
  CAPTURE(dtype_name(c.dtype));
  const int64_t B = c.batch, Tq = c.queries, D = c.head_dim;
  const float scale = 1.0f / std::sqrt(float(D));
  const unsigned seed = unsigned(c.cache_seq * 100 + D);
  Tensor q = host_random({B, Tq, c.q_heads, D}, c.dtype, seed, -2.0f, 2.0f);
  Tensor k = host_random({B, c.cache_seq, c.kv_heads, D}, c.dtype, seed + 1);
  Tensor v = host_random({B, c.cache_seq, c.kv_heads, D}, c.dtype, seed + 2);
  Tensor positions = host_ints(c.positions);
  Tensor want = cpu.empty(q.shape, c.dtype, MemCategory::activations);
  cpu.attention_cached(want, q, k, v, positions, scale, c.window);
  std::vector<float> got = emu_test::same_under_schedules([&] {
    Tensor out = device_empty(q.shape, c.dtype);
    gpu.attention_cached(out, to_device(q), to_device(k), to_device(v), to_device(positions), scale, c.window);
    return values(out);
  });
  const Tolerance bf16_probabilities{1.0 / 512, kBf16.rtol};
  check_close(got, values(want), c.dtype == DType::bf16 ? bf16_probabilities : kF32);
}

}  // namespace

TEST_CASE("cuda: attention_cached decode steps and prefill match the CPU") {
  const DType h = DType::bf16, f = DType::f32;
  const CachedCase cases[] = {
      {3, 1, 4, 2, 20, 90, {0, 41, 89}},                                // decode: first, middle, last slot
      {2, 1, 6, 2, 96, 70, {69, 5}, f, 9},                              // sliding window
      {1, 5, 2, 1, 256, 40, {0, 1, 2, 3, 4}},                           // prefill of 5 queries, head_dim 256
      {2, 3, 4, 4, 20, 70, {64, 65, 66, 1, 2, 3}, h},                   // bf16, rows at different offsets
      {1, 2, 3, 1, 32, 130, {127, 128}, f, 65},                         // window across 64-key tiles
  };
  for (const CachedCase& c : cases) run_case(c);
}

TEST_CASE("cuda: attention_cached rejects bad arguments as the CPU does") {
  Tensor q = device_empty({1, 1, 4, 8}, DType::f32), cache = device_empty({1, 9, 3, 8}, DType::f32);
  Tensor out = device_empty({1, 1, 4, 8}, DType::f32), positions = to_device(host_ints({0}));
  CHECK_THROWS_AS(gpu.attention_cached(out, q, cache, cache, positions, 1.0f, 0), Error);  // 4 heads over 3
  Tensor big_q = device_empty({1, 1, 2, 264}, DType::f32), big_cache = device_empty({1, 9, 2, 264}, DType::f32);
  Tensor big_out = device_empty({1, 1, 2, 264}, DType::f32);
  CHECK_THROWS_AS(gpu.attention_cached(big_out, big_q, big_cache, big_cache, positions, 1.0f, 0), Error);
  Tensor two = to_device(host_ints({0, 1}));
  Tensor q2 = device_empty({1, 1, 2, 8}, DType::f32), cache2 = device_empty({1, 9, 2, 8}, DType::f32);
  Tensor out2 = device_empty({1, 1, 2, 8}, DType::f32);
  CHECK_THROWS_AS(gpu.attention_cached(out2, q2, cache2, cache2, two, 1.0f, 0), Error);  // one position per query
}
