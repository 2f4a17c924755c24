// The emulator test kernels built by nvcc for every CUDA architecture, proving
// the .cuh sources are real CUDA. CI only compiles and links this; on a GPU it
// runs each case once and compares with a CPU result (exit status 1 on a mismatch).
// The planted bugs are undefined behaviour on a GPU, so they only run on request.
#include <cmath>
#include <cstdio>

#include "tests/emu/kernels/runners.h"

using namespace emu_test;

namespace {

int failures = 0;

void expect(bool ok, const char* what) {
  std::printf("%s: %s\n", ok ? "ok  " : "FAIL", what);
  failures += !ok;
}

template <class T, class LayoutA, class LayoutB>
bool wmma_ok() {
  const int M = 32, N = 16, K = 32;
  std::vector<T> a(M * K), b(K * N);
  for (int i = 0; i < M * K; ++i) a[i] = T(float(i % 7) - 3.0f);
  for (int i = 0; i < K * N; ++i) b[i] = T(float(i % 5) - 2.0f);
  std::vector<float> c0(M * N, 1.0f), got = wmma_matmul<T, LayoutA, LayoutB>(a, b, c0, M, N, K);
  constexpr bool a_rows = std::is_same_v<LayoutA, nvcuda::wmma::row_major>;
  constexpr bool b_rows = std::is_same_v<LayoutB, nvcuda::wmma::row_major>;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      float want = 1.0f;  // small integers: exact in any summation order
      for (int k = 0; k < K; ++k)
        want += float(a_rows ? a[m * K + k] : a[k * M + m]) * float(b_rows ? b[k * N + n] : b[n * K + k]);
      if (got[m * N + n] != want) return false;
    }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  // `--planted` runs the planted-bug kernels instead, e.g. under compute-sanitizer.
  if (argc > 1 && std::string(argv[1]) == "--planted") {
    oob_write(1);
    run_planted<divergent_barrier_kernel>(64);
    run_planted<deadlock_kernel>(32);
    run_planted<mask_excludes_caller_kernel>(32);
    run_planted<exited_lane_kernel>(32);
    return 0;
  }
  std::vector<float> x(kBlock * 3 + 10);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 13);
  std::vector<float> sums = block_sums(x, true), warp_sums = warp_block_sums(x);
  bool sums_ok = true;
  for (size_t b = 0; b < sums.size(); ++b) {
    float want = 0;
    for (size_t i = b * kBlock; i < std::min(x.size(), (b + 1) * kBlock); ++i) want += x[i];
    sums_ok = sums_ok && sums[b] == want && warp_sums[b] == want;
  }
  expect(sums_ok, "block_sum_kernel and warp_block_sum_kernel");

  std::vector<float> diffs = adjacent_diffs(x, true), pairs = two_barrier(x);
  bool diffs_ok = true;
  for (size_t i = 0; i < x.size(); ++i) diffs_ok = diffs_ok && diffs[i] == (i + 1 < x.size() ? x[i + 1] : 0.0f) - x[i];
  expect(diffs_ok && pairs.size() == x.size(), "adjacent_diff_kernel and two_barrier_kernel");

  std::vector<int> ints(kBlock * 2 + 3);
  for (size_t i = 0; i < ints.size(); ++i) ints[i] = int(i % 11);
  std::vector<int> scan = block_scans(ints);
  bool scan_ok = true;
  for (size_t i = 0, acc = 0; i < ints.size(); ++i) {
    acc = (i % kBlock ? acc : 0) + ints[i];
    scan_ok = scan_ok && scan[i] == int(acc);
  }
  expect(scan_ok, "block_scan_kernel");

  std::vector<int> lanes(32);
  for (int lane = 0; lane < 32; ++lane) lanes[lane] = (lane * 37) % 64;
  std::vector<int> ops = warp_ops(lanes);
  expect(ops[0] == lanes[3] && ops[2] == lanes[1] && unsigned(ops[7]) == 0xffffffffu, "warp_ops_kernel");

  AtomicsResult atomic = atomics(ints, 5);
  expect(atomic.count == ints.size() && atomic.half_count == 200.0f && atomic.bf16_count == 200.0f, "atomics_kernel");

  using nvcuda::wmma::col_major, nvcuda::wmma::row_major;
  expect(wmma_ok<__half, row_major, col_major>() && wmma_ok<__nv_bfloat16, col_major, row_major>(),
         "wmma_matmul_kernel");

  return failures ? 1 : 0;
}
