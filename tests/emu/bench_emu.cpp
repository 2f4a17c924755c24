// Emulator speed: `bench_emu [elements]` times a 256-thread kernel with two
// barriers per block (one fiber switch pair per thread per barrier) and a
// barrier-free kernel (the fast path), and checks the first one's result.
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "tests/emu/kernels/runners.h"

using namespace emu_test;

template <class F>
double seconds(F run) {
  auto start = std::chrono::steady_clock::now();
  run();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int main(int argc, char** argv) {
  int n = argc > 1 ? std::atoi(argv[1]) : 1 << 20;
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) x[i] = float(i % 1000);
  DeviceBuffer<float> dx(x), out(n);
  int grid = blocks_for(n, kBlock);
  double two_barriers = seconds([&] {
    ft::launch<two_barrier_kernel<kBlock>>(grid, kBlock, 2 * kBlock * sizeof(float), nullptr, dx.ptr, out.ptr, n);
  });
  // With bound n - 1 the planted off-by-one writes exactly n elements: a
  // correct barrier-free kernel.
  double barrier_free = seconds([&] { ft::launch<oob_write_kernel>(grid, kBlock, 0, nullptr, out.ptr, n - 1); });
  ft::launch<two_barrier_kernel<kBlock>>(grid, kBlock, 2 * kBlock * sizeof(float), nullptr, dx.ptr, out.ptr, n);
  std::vector<float> got = out.host();
  for (int i = 0; i < n; ++i) {
    int base = i / kBlock * kBlock, t = kBlock - 1 - i % kBlock;
    auto tile = [&](int j) { return base + j < n ? x[base + j] : 0.0f; };
    float want = tile(t) + tile((t + 1) % kBlock);
    if (got[i] != want) {
      std::printf("mismatch at %d: %g != %g\n", i, got[i], want);
      return 1;
    }
  }
  std::printf("%d elements, %d threads/block, %d blocks\n", n, kBlock, grid);
  std::printf("two barriers per block: %.3f s\n", two_barriers);
  std::printf("no barriers (fast path): %.3f s\n", barrier_free);
  return 0;
}
