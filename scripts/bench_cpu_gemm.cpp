// bench_cpu_gemm REPEATS: GFLOP/s of CpuBackend's GEMMs, reference kernels and
// oneDNN (where built), on 2048^3 and on the GEMMs of one training step of
// scripts/bench_cpu's Llama shape (1024 tokens, hidden 768, MLP 2048, vocab
// 32000). One JSON object per line; the median time of REPEATS runs after one
// warm-up. Compiled and run by scripts/bench_cpu.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
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

// out[M, N] = a[M, K] @ b[N, K]^T (a linear layer's forward) in dtype.
void bench_matmul(CpuBackend& backend, const char* gemm, const std::string& name, int64_t M, int64_t N, int64_t K,
                  DType dtype, int repeats) {
  std::mt19937 rng(1);
  Tensor a = random_tensor(backend, {M, K}, dtype, 1.0f, rng), b = random_tensor(backend, {N, K}, dtype, 0.05f, rng);
  Tensor out = backend.empty({M, N}, DType::f32, MemCategory::activations);
  double seconds = median_seconds([&] { backend.matmul(out, a, b, false, true, 1.0f, 0.0f); }, repeats);
  std::printf("{\"op\": \"%s\", \"gemm\": \"%s\", \"dtype\": \"%s\", \"M\": %ld, \"N\": %ld, \"K\": %ld, \"gflops\": %.1f}\n",
              name.c_str(), gemm, dtype_name(dtype), long(M), long(N), long(K), 2.0 * M * N * K / seconds / 1e9);
}

// int8_linear_forward (x [N, K], weight [O, K], threshold 6, no outliers in
// gaussian x of sigma 1 at these sizes is not guaranteed: a few are part of
// the op) and int8_linear_backward (dx [N, K] from dout [N, O]).
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
  const double flops = 2.0 * N * O * K;
  std::printf("{\"op\": \"%s forward\", \"gemm\": \"%s\", \"dtype\": \"int8\", \"M\": %ld, \"N\": %ld, \"K\": %ld, \"gflops\": %.1f}\n",
              name.c_str(), gemm, long(N), long(O), long(K), flops / forward / 1e9);
  std::printf("{\"op\": \"%s backward\", \"gemm\": \"%s\", \"dtype\": \"int8\", \"M\": %ld, \"N\": %ld, \"K\": %ld, \"gflops\": %.1f}\n",
              name.c_str(), gemm, long(N), long(K), long(O), flops / backward / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::stoi(argv[1]) : 5;
  HostAllocator host;
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
  return 0;
}
