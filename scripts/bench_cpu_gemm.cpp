// bench_cpu_gemm REPEATS: GFLOP/s of CpuBackend's GEMMs, reference kernels and
// oneDNN (where built), on 2048^3 and on the GEMMs and attention of one
// training step of scripts/bench_cpu's Llama shape (1024 tokens, hidden 768,
// MLP 2048, vocab 32000, 12 heads of 64), and the machine's multiply-add
// peaks from register-only loops. One JSON object per line; the median time
// of REPEATS runs after one warm-up. Compiled and run by scripts/bench_cpu.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <immintrin.h>
#include <omp.h>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/onednn_gemm.h"

using namespace ft;

namespace {

double median_seconds(const std::function<void()>& run, int repeats) {
  run();
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    auto start = std::chrono::steady_clock::now();
    run();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

Tensor random_tensor(Backend& backend, const Shape& shape, DType dtype, float scale, std::mt19937& rng) {
  Tensor t = backend.empty(shape, dtype, MemCategory::activations);
  std::normal_distribution<float> dist(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) store_from_f32(t.data, dtype, i, dist(rng));
  return t;
}

// One result as a JSON line (bench_cpu_vs_torch.py reads them).
void print_row(const std::string& op, const char* gemm, const char* dtype, int64_t M, int64_t N, int64_t K,
               double gflops) {
  std::printf("{\"op\": \"%s\", \"gemm\": \"%s\", \"dtype\": \"%s\", \"M\": %ld, \"N\": %ld, \"K\": %ld, "
              "\"gflops\": %.1f}\n",
              op.c_str(), gemm, dtype, long(M), long(N), long(K), gflops);
}

// out[M, N] = a[M, K] @ b[N, K]^T (a linear layer's forward) in dtype.
void bench_matmul(CpuBackend& backend, const char* gemm, const std::string& name, int64_t M, int64_t N, int64_t K,
                  DType dtype, int repeats) {
  std::mt19937 rng(1);
  Tensor a = random_tensor(backend, {M, K}, dtype, 1.0f, rng), b = random_tensor(backend, {N, K}, dtype, 0.05f, rng);
  Tensor out = backend.empty({M, N}, DType::f32, MemCategory::activations);
  double seconds = median_seconds([&] { backend.matmul(out, a, b, false, true, 1.0f, 0.0f); }, repeats);
  print_row(name, gemm, dtype_name(dtype), M, N, K, 2.0 * M * N * K / seconds / 1e9);
}

// int8_linear_forward (x [N, K], weight [O, K], threshold 6, no outliers in
// gaussian x of sigma 1 at these sizes is not guaranteed: a few are part of
// the op) and int8_linear_backward (dx [N, K] from dout [N, O]), with f32 and
// with bf16 dout and dx (a bf16 tile: a bf16 GEMM, native where the CPU has
// AVX512-BF16 or AMX).
void bench_int8(CpuBackend& backend, const char* gemm, const std::string& name, int64_t N, int64_t O, int64_t K,
                int repeats) {
  std::mt19937 rng(2);
  Tensor w = random_tensor(backend, {O, K}, DType::f32, 0.05f, rng);
  Tensor q = backend.empty({O, K}, DType::i8, MemCategory::weights), s = backend.empty({O}, DType::f32, MemCategory::weights);
  backend.quantize_rows_int8(q, s, w);
  Tensor x = random_tensor(backend, {N, K}, DType::f32, 1.0f, rng), dout = random_tensor(backend, {N, O}, DType::f32, 1.0f, rng);
  Tensor out = backend.empty({N, O}, DType::f32, MemCategory::activations);
  Tensor dx = backend.empty({N, K}, DType::f32, MemCategory::activations);
  double forward = median_seconds([&] { backend.int8_linear_forward(out, x, q, s, 6.0f); }, repeats);
  double backward = median_seconds([&] { backend.int8_linear_backward(dx, dout, q, s, false); }, repeats);
  Tensor dout_bf16 = random_tensor(backend, {N, O}, DType::bf16, 1.0f, rng);
  Tensor dx_bf16 = backend.empty({N, K}, DType::bf16, MemCategory::activations);
  double backward_bf16 =
      median_seconds([&] { backend.int8_linear_backward(dx_bf16, dout_bf16, q, s, false); }, repeats);
  const double flops = 2.0 * N * O * K;
  print_row(name + " forward", gemm, "int8", N, O, K, flops / forward / 1e9);
  print_row(name + " backward", gemm, "int8", N, K, O, flops / backward / 1e9);
  print_row(name + " backward", gemm, "bf16", N, K, O, flops / backward_bf16 / 1e9);
}

// The machine's multiply-add peak, all threads, from loops that keep
// independent sums in registers: f32 FMA, and int16 pairs multiplied and
// summed into int32 (vpmaddwd + vpaddd: what an int8 product uses without
// VNNI). 2 operations per multiply-add. Compiled for AVX2 + FMA, run only
// where the CPU has them.
__attribute__((target("avx2,fma"))) double f32_fma_loop(long iters) {
  __m256 sums[12], a = _mm256_set1_ps(1.0000001f), b = _mm256_set1_ps(0.9999999f);
#pragma GCC unroll 12
  for (int i = 0; i < 12; ++i) sums[i] = _mm256_set1_ps(1e-9f * float(i));  // distinct, so none is merged
  for (long n = 0; n < iters; ++n) {
#pragma GCC unroll 12
    for (auto& sum : sums) sum = _mm256_fmadd_ps(a, b, sum);
    asm volatile("" : "+x"(a));
  }
  float total = 0.0f;
  for (auto& sum : sums) total += _mm256_cvtss_f32(sum);
  return total;
}

// Six sums and six multipliers: with twelve, the 16 AVX registers spill.
// x changes each iteration so that no product is hoisted out of the loop.
__attribute__((target("avx2,fma"))) double int16_madd_loop(long iters) {
  __m256i sums[6], y[6], x = _mm256_set1_epi16(3), flip = _mm256_set1_epi16(1);
#pragma GCC unroll 6
  for (int i = 0; i < 6; ++i) sums[i] = _mm256_setzero_si256(), y[i] = _mm256_set1_epi16(short(i + 1));
  for (long n = 0; n < iters; ++n) {
#pragma GCC unroll 6
    for (int i = 0; i < 6; ++i) sums[i] = _mm256_add_epi32(sums[i], _mm256_madd_epi16(x, y[i]));
    x = _mm256_xor_si256(x, flip);
  }
  long total = 0;
  for (auto& sum : sums) total += _mm256_cvtsi256_si32(sum);
  return double(total);
}

void bench_peaks() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return;
  const long iters = 20'000'000;
  const struct {
    const char* op;
    const char* dtype;
    double (*loop)(long);
    double ops_per_iter;
  } loops[] = {{"peak: f32 FMA loop", "f32", f32_fma_loop, 12 * 8 * 2},
               {"peak: int16 multiply-add loop", "int8", int16_madd_loop, 6 * 16 * 2}};
  for (const auto& l : loops) {
    double sink = 0.0;
    auto start = std::chrono::steady_clock::now();
#pragma omp parallel reduction(+ : sink)
    sink += l.loop(iters);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("{\"op\": \"%s\", \"gemm\": \"machine\", \"dtype\": \"%s\", \"M\": 0, \"N\": 0, \"K\": 0, "
                "\"gflops\": %.1f, \"sink\": %g}\n",
                l.op, l.dtype, omp_get_max_threads() * iters * l.ops_per_iter / seconds / 1e9, sink);
  }
}

// Causal attention forward and backward, [4, 256, 12, 64] (the bench shape)
// in f32 and in bf16 (its bf16 tile products: AMX or AVX512-BF16 where the
// CPU has them): FLOPs of the causal half, 4 T^2 H D / 2 forward and 2.5x that backward.
void bench_attention(CpuBackend& backend, DType dtype, int repeats) {
  std::mt19937 rng(3);
  const int64_t B = 4, T = 256, H = 12, D = 64;
  auto operand = [&] { return random_tensor(backend, {B, T, H, D}, dtype, 1.0f, rng); };
  Tensor q = operand(), k = operand(), v = operand(), dout = operand();
  auto empty = [&] { return backend.empty({B, T, H, D}, dtype, MemCategory::activations); };
  Tensor out = empty(), dq = empty(), dk = empty(), dv = empty();
  Tensor lse = backend.empty({B, H, T}, DType::f32, MemCategory::activations);
  const float scale = 0.125f;
  double forward = median_seconds([&] { backend.attention_forward(out, lse, q, k, v, scale, 0); }, repeats);
  double backward = median_seconds([&] { backend.attention_backward(dq, dk, dv, dout, q, k, v, out, lse, scale, 0); },
                                   repeats);
  const double flops = 2.0 * B * H * T * (T + 1) * D;  // QK^T and PV over the visible half
  print_row("attention forward", "ours", dtype_name(dtype), T, T, D, flops / forward / 1e9);
  print_row("attention backward", "ours", dtype_name(dtype), T, T, D, 2.5 * flops / backward / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::stoi(argv[1]) : 5;
  HostAllocator host;
  bench_peaks();
  std::vector<CpuGemm> gemms{CpuGemm::reference};
  if (onednn_built()) gemms.push_back(CpuGemm::onednn);
  for (CpuGemm choice : gemms) {
    CpuBackend backend(host, choice);
    const char* gemm = choice == CpuGemm::onednn ? "onednn" : "reference";
    bench_matmul(backend, gemm, "gemm 2048^3", 2048, 2048, 2048, DType::f32, repeats);
    bench_matmul(backend, gemm, "gemm 2048^3", 2048, 2048, 2048, DType::bf16, repeats);
    bench_int8(backend, gemm, "int8_linear 2048^3", 2048, 2048, 2048, repeats);
    bench_int8(backend, gemm, "int8_linear q/k/v/o", 1024, 768, 768, repeats);
    bench_int8(backend, gemm, "int8_linear gate/up", 1024, 2048, 768, repeats);
    bench_int8(backend, gemm, "int8_linear down", 1024, 768, 2048, repeats);
    bench_matmul(backend, gemm, "lm_head forward", 1024, 32000, 768, DType::f32, repeats);
    bench_matmul(backend, gemm, "lora A", 1024, 8, 768, DType::f32, repeats);
  }
  CpuBackend backend(host);
  bench_attention(backend, DType::f32, repeats);
  bench_attention(backend, DType::bf16, repeats);
  return 0;
}
