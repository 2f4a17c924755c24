// Backend::attention_cached on the CPU against attention_forward: a query at
// position p over a cache holding a sequence's keys and values gives
// attention_forward's row p of that sequence bit for bit (f32 and bf16, GQA,
// sliding windows across the 32-query and 64-key tiles), for decode steps
// (one query per row, rows at different positions) and a whole prefill.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/cpu/cpu_backend.h"

using namespace ft;

namespace {

HostAllocator host;
CpuBackend cpu(host);

Tensor random_tensor(const Shape& shape, DType dtype, unsigned seed) {
  Tensor t = cpu.empty(shape, dtype, MemCategory::activations);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  for (int64_t i = 0; i < t.numel(); ++i) store_from_f32(t.data, dtype, i, dist(rng));
  return t;
}

Tensor ints(const std::vector<int32_t>& values) {
  Tensor t = cpu.empty({int64_t(values.size())}, DType::i32, MemCategory::activations);
  std::memcpy(t.data, values.data(), values.size() * sizeof(int32_t));
  return t;
}

// Row (b, t) of a [B, T, H, D] tensor as f32.
std::vector<float> row(const Tensor& x, int64_t b, int64_t t) {
  const int64_t width = x.dim(2) * x.dim(3), at = (b * x.dim(1) + t) * width;
  std::vector<float> out(static_cast<size_t>(width));
  for (int64_t i = 0; i < width; ++i) out[size_t(i)] = load_as_f32(x.data, x.dtype, at + i);
  return out;
}

void check_rows_match(int64_t T, int64_t Hq, int64_t Hkv, int64_t D, DType dtype, int64_t window) {
  CAPTURE(T);
  CAPTURE(window);
  CAPTURE(dtype_name(dtype));
  const int64_t B = 2;
  const float scale = 1.0f / std::sqrt(float(D));
  Tensor q = random_tensor({B, T, Hq, D}, dtype, 1), k = random_tensor({B, T, Hkv, D}, dtype, 2);
  Tensor v = random_tensor({B, T, Hkv, D}, dtype, 3);
  Tensor want = cpu.empty(q.shape, dtype, MemCategory::activations);
  Tensor lse = cpu.empty({B, Hq, T}, DType::f32, MemCategory::activations);
  cpu.attention_forward(want, lse, q, k, v, scale, window);

  // Prefill: every query of every row at its own position.
  std::vector<int32_t> all;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) all.push_back(int32_t(t));
  Tensor prefill = cpu.empty(q.shape, dtype, MemCategory::activations);
  cpu.attention_cached(prefill, q, k, v, ints(all), scale, window);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) REQUIRE(row(prefill, b, t) == row(want, b, t));

  // Decode: one query per row, the rows at different positions.
  for (int64_t p : {int64_t(0), T / 2, T - 1}) {
    const int64_t other = T - 1 - p;
    Tensor step_q = cpu.empty({B, 1, Hq, D}, dtype, MemCategory::activations);
    std::memcpy(step_q.ptr<char>(), q.ptr<char>() + size_t(p * Hq * D) * dtype_size_bytes(dtype),
                size_t(Hq * D) * dtype_size_bytes(dtype));
    std::memcpy(step_q.ptr<char>() + size_t(Hq * D) * dtype_size_bytes(dtype),
                q.ptr<char>() + size_t((T + other) * Hq * D) * dtype_size_bytes(dtype), size_t(Hq * D) * dtype_size_bytes(dtype));
    Tensor out = cpu.empty(step_q.shape, dtype, MemCategory::activations);
    cpu.attention_cached(out, step_q, k, v, ints({int32_t(p), int32_t(other)}), scale, window);
    CHECK(row(out, 0, 0) == row(want, 0, p));
    CHECK(row(out, 1, 0) == row(want, 1, other));
  }
}

}  // namespace

TEST_CASE("attention_cached gives attention_forward's rows bit for bit") {
  check_rows_match(1, 2, 2, 8, DType::f32, 0);
  check_rows_match(70, 6, 2, 20, DType::f32, 0);   // three 32-query tiles, two 64-key tiles, GQA 3:1
  check_rows_match(150, 4, 1, 16, DType::f32, 0);  // three key tiles
  check_rows_match(150, 4, 2, 16, DType::f32, 40);  // a window not aligned to the tiles
  check_rows_match(70, 2, 2, 96, DType::f32, 5);
  check_rows_match(70, 6, 2, 20, DType::bf16, 0);
  check_rows_match(100, 4, 2, 32, DType::bf16, 33);
}

TEST_CASE("attention_cached rejects a position outside the cache and mismatched shapes") {
  Tensor q = cpu.empty({1, 1, 2, 8}, DType::f32, MemCategory::activations);
  Tensor cache = cpu.empty({1, 5, 2, 8}, DType::f32, MemCategory::activations);
  Tensor out = cpu.empty({1, 1, 2, 8}, DType::f32, MemCategory::activations);
  CHECK_THROWS_WITH_AS(cpu.attention_cached(out, q, cache, cache, ints({5}), 1.0f, 0),
                       doctest::Contains("position 5 of query 0 is outside the cache's 5 slots"), Error);
  CHECK_THROWS_WITH_AS(cpu.attention_cached(out, q, cache, cache, ints({0, 1}), 1.0f, 0),
                       doctest::Contains("positions"), Error);
  Tensor odd_cache = cpu.empty({1, 5, 3, 8}, DType::f32, MemCategory::activations);
  CHECK_THROWS_WITH_AS(cpu.attention_cached(out, q, odd_cache, odd_cache, ints({0}), 1.0f, 0),
                       doctest::Contains("multiple of kv heads"), Error);
  Tensor bf16_out = cpu.empty({1, 1, 2, 8}, DType::bf16, MemCategory::activations);
  CHECK_NOTHROW(cpu.attention_cached(bf16_out, q, cache, cache, ints({4}), 1.0f, 0));
}
