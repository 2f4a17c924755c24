// The CUDA emulator's own tests: each kernel in tests/emu/kernels/ against a
// CPU result under every schedule, then planted bugs the emulator must report.
#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include "tests/emu/kernels/runners.h"
#include "tests/emu/schedules.h"

using namespace emu_test;

namespace {

std::vector<float> random_floats(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

std::vector<int> random_ints(size_t n, int below, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<int> x(n);
  for (int& v : x) v = int(rng() % unsigned(below));
  return x;
}

std::vector<double> cpu_block_sums(const std::vector<float>& x) {
  std::vector<double> out(blocks_for(x.size(), kBlock), 0.0);
  for (size_t i = 0; i < x.size(); ++i) out[i / kBlock] += x[i];
  return out;
}

void check_close(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("index ", i);
    CHECK(std::abs(got[i] - want[i]) <= tol);
  }
}

// The message of the cuda_emu::Error run() throws, or "" if none.
template <class F>
std::string error_of(F run) {
  try {
    run();
  } catch (const cuda_emu::Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("emu: block reduction in shared memory with __syncthreads") {
  std::vector<float> x = random_floats(kBlock * 37 + 100, 1);
  check_close(same_under_schedules([&] { return block_sums(x, true); }), cpu_block_sums(x), 1e-4);
}

TEST_CASE("emu: warp reduction with __shfl_xor_sync and __shfl_down_sync") {
  std::vector<float> x = random_floats(kBlock * 21 + 5, 2);
  check_close(same_under_schedules([&] { return warp_block_sums(x); }), cpu_block_sums(x), 1e-4);
}

TEST_CASE("emu: shuffles with width, __half2 shuffle, votes, __activemask") {
  std::vector<int> x(32);
  for (int lane = 0; lane < 32; ++lane) x[lane] = (lane * 37) % 64;
  std::vector<int> got = same_under_schedules([&] { return warp_ops(x); });
  unsigned odd = 0;
  for (int lane = 0; lane < 32; ++lane) odd |= unsigned(x[lane] % 2) << lane;
  for (int lane = 0; lane < 32; ++lane) {
    INFO("lane ", lane);
    const int* o = &got[lane * 8];
    CHECK(o[0] == x[lane / 16 * 16 + 3]);
    int scan = 0;
    for (int j = lane / 8 * 8; j <= lane; ++j) scan += x[j];
    CHECK(o[1] == scan);
    CHECK(o[2] == x[(lane + 1) % 32]);
    CHECK(o[3] == -x[(lane + 1) % 32]);
    CHECK(unsigned(o[4]) == odd);
    CHECK(o[5] == 1);  // lane 19 holds 63
    CHECK(o[6] == 1);
    CHECK(unsigned(o[7]) == 0xffffffffu);
  }
}

TEST_CASE("emu: block prefix scan with shuffles and shared memory") {
  std::vector<int> x = random_ints(kBlock * 9 + 77, 1000, 3);
  std::vector<int> got = same_under_schedules([&] { return block_scans(x); });
  std::vector<int> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = x[i] + (i % kBlock ? want[i - 1] : 0);
  CHECK(got == want);
}

template <class T, class LayoutA, class LayoutB>
void check_wmma(int M, int N, int K) {
  constexpr bool a_rows = std::is_same_v<LayoutA, nvcuda::wmma::row_major>;
  constexpr bool b_rows = std::is_same_v<LayoutB, nvcuda::wmma::row_major>;
  std::vector<float> af = random_floats(size_t(M) * K, 4), bf = random_floats(size_t(K) * N, 5);
  std::vector<float> c0 = random_floats(size_t(M) * N, 6);
  std::vector<T> a(af.size()), b(bf.size());
  for (size_t i = 0; i < a.size(); ++i) a[i] = T(af[i]);
  for (size_t i = 0; i < b.size(); ++i) b[i] = T(bf[i]);
  std::vector<float> got =
      same_under_schedules([&] { return wmma_matmul<T, LayoutA, LayoutB>(a, b, c0, M, N, K); });
  std::vector<double> want(size_t(M) * N);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double acc = c0[size_t(m) * N + n];
      for (int k = 0; k < K; ++k)
        acc += double(float(a_rows ? a[size_t(m) * K + k] : a[size_t(k) * M + m])) *
               double(float(b_rows ? b[size_t(k) * N + n] : b[size_t(n) * K + k]));
      want[size_t(m) * N + n] = acc;
    }
  check_close(got, want, 1e-4);
}

TEST_CASE("emu: wmma 16x16x16 tile product, half and bf16, all operand layouts") {
  using nvcuda::wmma::col_major, nvcuda::wmma::row_major;
  check_wmma<__half, row_major, row_major>(32, 48, 64);
  check_wmma<__half, col_major, row_major>(32, 16, 32);
  check_wmma<__nv_bfloat16, row_major, col_major>(16, 32, 48);
  check_wmma<__nv_bfloat16, col_major, col_major>(48, 16, 16);
}

TEST_CASE("emu: atomics from many blocks") {
  std::vector<int> x = random_ints(10000, 1000, 7);
  const int nbins = 17;
  auto results = under_schedules([&] { return std::vector<AtomicsResult>{atomics(x, nbins)}; });
  std::vector<int> bins(nbins, 0);
  double sum = 0;
  int max_value = 0;
  for (int v : x) {
    ++bins[v % nbins];
    sum += v;
    max_value = std::max(max_value, v);
  }
  for (const std::vector<AtomicsResult>& r : results) {
    const AtomicsResult& got = r[0];
    CHECK(got.bins == bins);
    CHECK(got.count == x.size());
    CHECK(got.sum == float(sum));  // integers below 2^24: exact in any order
    CHECK(got.max_int == max_value);
    CHECK(got.max_float == float(max_value) * 0.5f);
    CHECK(got.half_count == 200.0f);
    CHECK(got.bf16_count == 200.0f);
  }
}

TEST_CASE("emu: two barriers per block with dynamic shared memory (the benchmark kernel)") {
  std::vector<float> x = random_floats(kBlock * 5, 8);
  std::vector<float> got = same_under_schedules([&] { return two_barrier(x); });
  for (size_t i = 0; i < x.size(); ++i) {
    size_t base = i / kBlock * kBlock, t = kBlock - 1 - i % kBlock;
    CHECK(got[i] == x[base + t] + x[base + (t + 1) % kBlock]);
  }
}

TEST_CASE("emu: dynamic shared memory over 48 KiB needs cudaFuncSetAttribute") {
  DeviceBuffer<float> x(std::vector<float>(kBlock, 1.0f)), out(kBlock);
  auto big = [&] { ft::launch<two_barrier_kernel<kBlock>>(1, kBlock, 64 << 10, nullptr, x.ptr, out.ptr, kBlock); };
  CHECK(contains(error_of(big), "cudaFuncSetAttribute"));
  const void* kernel = reinterpret_cast<const void*>(&two_barrier_kernel<kBlock>);
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10));
  CHECK(error_of(big) == "");
}

TEST_CASE("emu: kernel names come from the template argument") {
#ifdef __clang__
  CHECK(std::string(cuda_emu::kernel_name<block_sum_kernel<256, true>>()) == "block_sum_kernel");
#else
  CHECK(std::string(cuda_emu::kernel_name<block_sum_kernel<256, true>>()) == "block_sum_kernel<256, true>");
#endif
  CHECK(std::string(cuda_emu::kernel_name<oob_write_kernel>()) == "oob_write_kernel");
}

TEST_CASE("emu: schedules parse from FT_EMU_SCHEDULE syntax") {
  CHECK(cuda_emu::to_string(cuda_emu::parse_schedule("random:42")) == "random:42");
  CHECK(cuda_emu::parse_schedule("reverse").order == cuda_emu::Order::reverse);
  CHECK_THROWS_AS(cuda_emu::parse_schedule("backwards"), cuda_emu::Error);
}

// ---- planted bugs ---------------------------------------------------------------------------

TEST_CASE("emu: planted missing __syncthreads gives schedule-dependent results") {
  std::vector<float> x = random_floats(kBlock * 4, 9);
  auto results = under_schedules([&] { return block_sums(x, false); });
  bool all_same = true;
  for (auto& r : results) all_same = all_same && bit_identical(r, results[0]);
  CHECK_FALSE(all_same);
}

TEST_CASE("emu: planted out-of-bounds write is reported by the guard zone check") {
  std::string error = error_of([] { oob_write(1000); });
  INFO(error);
  CHECK(contains(error, "kernel oob_write_kernel"));
  CHECK(contains(error, "4000-byte device allocation"));
  CHECK(contains(error, "byte offset 4000 (0 bytes past the end)"));
  CHECK(block_sums(random_floats(kBlock, 10), true).size() == 1);  // the emulator still works
}

TEST_CASE("emu: planted read of unwritten shared memory surfaces as NaN") {
  std::vector<float> x = random_floats(kBlock * 3, 11);
  std::vector<float> good = same_under_schedules([&] { return adjacent_diffs(x, true); });
  std::vector<float> bad = adjacent_diffs(x, false);
  for (size_t i = 0; i < x.size(); ++i) {
    float want = (i + 1 < x.size() ? x[i + 1] : 0.0f) - x[i];
    CHECK(good[i] == want);
    if (i % kBlock == kBlock - 1) CHECK(std::isnan(bad[i]));  // read the halo nobody wrote
    else CHECK(bad[i] == want);
  }
}

TEST_CASE("emu: planted divergent __syncthreads is reported with both call sites") {
  std::string error = error_of([] { run_planted<divergent_barrier_kernel>(64); });
  INFO(error);
  CHECK(contains(error, "kernel divergent_barrier_kernel"));
  CHECK(contains(error, "divergent __syncthreads"));
  CHECK(contains(error, "32 thread(s) wait at __syncthreads at "));
  CHECK(contains(error, "tests/emu/kernels/planted.cuh:16, first thread (0,0,0)"));
  CHECK(contains(error, "tests/emu/kernels/planted.cuh:18, first thread (32,0,0)"));
}

TEST_CASE("emu: planted warp bugs: deadlock, mask without the caller, exited lane") {
  std::string deadlock = error_of([] { run_planted<deadlock_kernel>(32); });
  INFO(deadlock);
  CHECK(contains(deadlock, "deadlock in block (0,0,0)"));
  CHECK(contains(deadlock, "16 thread(s) wait at __shfl_xor_sync at"));
  CHECK(contains(deadlock, "16 thread(s) wait at __syncthreads at"));
  std::string excluded = error_of([] { run_planted<mask_excludes_caller_kernel>(32); });
  CHECK(contains(excluded, "mask 0x0000ffff excludes the calling lane"));
  std::string exited = error_of([] { run_planted<exited_lane_kernel>(32); });
  CHECK(contains(exited, "names lane 16, which has exited"));
}

TEST_CASE("emu: planted wmma bugs: lanes disagreeing on ldm, misaligned pointer") {
  std::string ldm = error_of([] { run_planted<wmma_divergent_ldm_kernel>(32); });
  INFO(ldm);
  CHECK(contains(ldm, "lane 16 passes another pointer or ldm than lane 0 (ldm 20 vs 16)"));
  std::string misaligned = error_of([] { run_planted<wmma_misaligned_kernel>(32); });
  INFO(misaligned);
  CHECK(contains(misaligned, "pointer is not 256-bit aligned (address % 32 = 16)"));
}

TEST_CASE("emu: host API checks device ranges") {
  DeviceBuffer<float> x(10);
  std::vector<float> host(11);
  CHECK(contains(error_of([&] { cudaMemcpy(x.ptr, host.data(), 11 * sizeof(float), cudaMemcpyHostToDevice); }),
                 "overrun a 40-byte device allocation"));
  CHECK(std::isnan(x.host()[0]));  // fresh allocations are poisoned
}

// Streams: a copy on a created stream takes the destination's old bytes at
// once (poisoned) and lands only when an event recorded after it orders it
// before legacy-stream work, or a synchronize; so a kernel that reads a
// buffer without waiting for its copy reads NaN, not the copy.
TEST_CASE("emu: a copy on a non-blocking stream lands when an event orders it, not before") {
  DeviceBuffer<float> x(std::vector<float>{1, 2, 3, 4});
  const std::vector<float> host = {5, 6, 7, 8};
  cudaStream_t copy = nullptr;
  cudaEvent_t before = nullptr, copied = nullptr;
  check(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking));
  check(cudaEventCreateWithFlags(&before, cudaEventDisableTiming));
  check(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
  check(cudaEventRecord(before, copy));
  check(cudaMemcpyAsync(x.ptr, host.data(), 4 * sizeof(float), cudaMemcpyHostToDevice, copy));
  check(cudaEventRecord(copied, copy));
  CHECK(std::isnan(x.ptr[0]));  // issued: the old values are gone, the new ones not there yet
  DeviceBuffer<float> other(std::vector<float>{0});  // legacy-stream work does not wait for a non-blocking stream
  check(cudaStreamWaitEvent(nullptr, before, 0));    // nor does an event recorded before the copy
  CHECK(std::isnan(x.ptr[3]));
  check(cudaStreamWaitEvent(nullptr, copied, 0));
  CHECK(x.ptr[0] == 5.0f);
  CHECK(x.ptr[3] == 8.0f);
  const std::vector<float> again = {9, 10, 11, 12};
  check(cudaMemcpyAsync(x.ptr, again.data(), 4 * sizeof(float), cudaMemcpyHostToDevice, copy));
  CHECK(std::isnan(x.ptr[1]));
  check(cudaStreamSynchronize(copy));
  CHECK(x.ptr[1] == 10.0f);
  check(cudaEventDestroy(before));
  check(cudaEventDestroy(copied));
  check(cudaStreamDestroy(copy));
}
