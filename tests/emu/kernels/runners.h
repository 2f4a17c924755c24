// Host side of the test kernels: allocate, copy in, launch, copy out. Plain
// CUDA runtime calls, so the same code drives the emulator (g++) and a real
// GPU (nvcc, tests/emu/emu_kernels_nvcc.cu).
#pragma once
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/emu/kernels/atomics.cuh"
#include "tests/emu/kernels/planted.cuh"
#include "tests/emu/kernels/reduce.cuh"
#include "tests/emu/kernels/warp.cuh"
#include "tests/emu/kernels/wmma.cuh"

namespace emu_test {

constexpr int kBlock = 256;

inline void check(cudaError_t e) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA error: ") + cudaGetErrorString(e));
}

// Owns one device buffer of n elements of T.
template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) { check(cudaMalloc(reinterpret_cast<void**>(&ptr), n * sizeof(T))); }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    check(cudaMemcpy(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(ptr); }
  std::vector<T> host() const {
    std::vector<T> out(n);
    check(cudaDeviceSynchronize());
    check(cudaMemcpy(out.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  }
};

inline int blocks_for(size_t n, int block) { return int((n + block - 1) / block); }

inline std::vector<float> block_sums(const std::vector<float>& x, bool correct) {
  DeviceBuffer<float> dx(x), out(blocks_for(x.size(), kBlock));
  if (correct) ft::launch<block_sum_kernel<kBlock, true>>(out.n, kBlock, 0, nullptr, dx.ptr, out.ptr, x.size());
  else ft::launch<block_sum_kernel<kBlock, false>>(out.n, kBlock, 0, nullptr, dx.ptr, out.ptr, x.size());
  return out.host();
}

inline std::vector<float> adjacent_diffs(const std::vector<float>& x, bool load_halo) {
  DeviceBuffer<float> dx(x), out(x.size());
  int grid = blocks_for(x.size(), kBlock);
  if (load_halo) ft::launch<adjacent_diff_kernel<kBlock, true>>(grid, kBlock, 0, nullptr, dx.ptr, out.ptr, x.size());
  else ft::launch<adjacent_diff_kernel<kBlock, false>>(grid, kBlock, 0, nullptr, dx.ptr, out.ptr, x.size());
  return out.host();
}

inline std::vector<float> two_barrier(const std::vector<float>& x) {
  DeviceBuffer<float> dx(x), out(x.size());
  ft::launch<two_barrier_kernel<kBlock>>(blocks_for(x.size(), kBlock), kBlock, 2 * kBlock * sizeof(float), nullptr,
                                         dx.ptr, out.ptr, x.size());
  return out.host();
}

inline std::vector<float> warp_block_sums(const std::vector<float>& x) {
  DeviceBuffer<float> dx(x), out(blocks_for(x.size(), kBlock));
  ft::launch<warp_block_sum_kernel<kBlock>>(out.n, kBlock, 0, nullptr, dx.ptr, out.ptr, x.size());
  return out.host();
}

inline std::vector<int> warp_ops(const std::vector<int>& x32) {
  DeviceBuffer<int> dx(x32), out(32 * 8);
  ft::launch<warp_ops_kernel>(1, 32, 0, nullptr, dx.ptr, out.ptr);
  return out.host();
}

inline std::vector<int> block_scans(const std::vector<int>& x) {
  DeviceBuffer<int> dx(x), out(x.size());
  ft::launch<block_scan_kernel<kBlock>>(blocks_for(x.size(), kBlock), kBlock, 0, nullptr, dx.ptr, out.ptr, x.size());
  return out.host();
}

// a, b in the layouts the template names; c0 and the result row-major [M, N].
template <class T, class LayoutA, class LayoutB>
std::vector<float> wmma_matmul(const std::vector<T>& a, const std::vector<T>& b, const std::vector<float>& c0, int M,
                               int N, int K) {
  DeviceBuffer<T> da(a), db(b);
  DeviceBuffer<float> dc0(c0), dc(size_t(M) * N);
  ft::launch<wmma_matmul_kernel<T, LayoutA, LayoutB>>(dim3(N / 16, M / 16), 32, 0, nullptr, da.ptr, db.ptr, dc0.ptr,
                                                      dc.ptr, M, N, K);
  return dc.host();
}

struct AtomicsResult {
  std::vector<int> bins;
  unsigned count;
  float sum, max_float, half_count, bf16_count;
  int max_int;
};

inline AtomicsResult atomics(const std::vector<int>& x, int nbins) {
  DeviceBuffer<int> dx(x), bins(nbins), max_int(1);
  DeviceBuffer<unsigned> count(1);
  DeviceBuffer<float> sum(1), max_float(1);
  DeviceBuffer<__half> half_count(1);
  DeviceBuffer<__nv_bfloat16> bf16_count(1);
  check(cudaMemset(bins.ptr, 0, nbins * sizeof(int)));
  check(cudaMemset(max_int.ptr, 0, sizeof(int)));
  check(cudaMemset(count.ptr, 0, sizeof(unsigned)));
  check(cudaMemset(sum.ptr, 0, sizeof(float)));
  check(cudaMemset(max_float.ptr, 0, sizeof(float)));
  check(cudaMemset(half_count.ptr, 0, sizeof(__half)));
  check(cudaMemset(bf16_count.ptr, 0, sizeof(__nv_bfloat16)));
  ft::launch<atomics_kernel>(blocks_for(x.size(), 128), 128, 0, nullptr, dx.ptr, int(x.size()), bins.ptr, nbins,
                             count.ptr, sum.ptr, max_int.ptr, max_float.ptr, half_count.ptr, bf16_count.ptr);
  return {bins.host(),
          count.host()[0],
          sum.host()[0],
          max_float.host()[0],
          __half2float(half_count.host()[0]),
          __bfloat162float(bf16_count.host()[0]),
          max_int.host()[0]};
}

// Planted bugs: each launch should be reported by the emulator.
inline void oob_write(int n) {
  DeviceBuffer<float> x(n);
  ft::launch<oob_write_kernel>(blocks_for(n + 1, 64), 64, 0, nullptr, x.ptr, n);
  check(cudaDeviceSynchronize());
}

template <auto Kernel>
void run_planted(int threads) {
  DeviceBuffer<float> x(std::vector<float>(threads, 1.0f));
  ft::launch<Kernel>(1, threads, 0, nullptr, x.ptr);
  check(cudaDeviceSynchronize());
}

}  // namespace emu_test
