// Shared helpers of the CUDA-op tests (tests/emu/test_cuda_*.cpp, one
// executable): CpuBackend and CudaBackend instances, random host tensors,
// host<->device copies and tolerance checks. The CudaBackend uses the build's
// default GEMM: the tiled kernel under the emulator, cuBLASLt in the real-GPU
// build of the same tests (tests/gpu/).
//
// Tolerances (|got - want| <= atol + rtol * |want|): f32 outputs 1e-5 relative
// (the kernels accumulate in another order than the CPU; expf/sinf/cosf are
// within 2 ulp); bf16 outputs 2^-7 relative, two bf16 ulps, because an f32
// difference in the last bit can round to the neighbouring bf16 value.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/error.h"
#include "tests/emu/cuda_device_skip.h"
#include "tests/emu/schedules.h"

using namespace ft;

namespace cuda_test {

inline HostAllocator host_allocator;
inline DeviceAllocator device_allocator;
inline CpuBackend cpu(host_allocator);
// Before `gpu`, which allocates cuBLASLt's workspace on a real device.
inline const bool cuda_device_present = exit_skipped_without_cuda_device();
// The INT8 forward unfused, as the CPU's arithmetic bit for bit: the fused
// one (a library int8 GEMM on an sm_90 GPU) rounds twice and has its own
// tests (test_cuda_int8.cpp).
inline CudaBackend gpu(device_allocator, cuda::default_gemm_kind(), /*library_attention=*/true,
                       /*library_int8_gemm=*/false);

struct Tolerance {
  double atol, rtol;
};
inline constexpr Tolerance kF32{1e-6, 1e-5};
inline constexpr Tolerance kBf16{1e-6, 1.0 / 128};
inline Tolerance tolerance_for(DType dtype) { return dtype == DType::bf16 ? kBf16 : kF32; }
// A bf16 norm output rounds twice, as transformers does: the normalised value
// to bf16, then its product with the weight. When the row statistic (rstd)
// differs from the CPU's in its last f32 bit (a sum of squares reduced in
// another order: the compiler's vectorisation, a sanitizer build), the first
// rounding can flip by one ulp and the second adds one more: two bf16 ulps.
inline Tolerance normed_out_tolerance(DType dtype) {
  return dtype == DType::bf16 ? Tolerance{1e-6, 1.0 / 64} : kF32;
}

inline Tensor host_random(const Shape& shape, DType dtype, unsigned seed, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = cpu.empty(shape, dtype, MemCategory::activations);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) store_from_f32(t.data, dtype, i, dist(rng));
  return t;
}

inline Tensor host_ints(const std::vector<int32_t>& values) {
  Tensor t = cpu.empty({int64_t(values.size())}, DType::i32, MemCategory::activations);
  std::copy(values.begin(), values.end(), t.ptr<int32_t>());  // memcpy from an empty vector's null data is UB
  return t;
}

inline Tensor host_copy(const Tensor& t) {
  Tensor out = cpu.empty(t.shape, t.dtype, MemCategory::activations);
  if (t.device == Device::cuda) gpu.copy(out, t);
  else cpu.copy(out, t);
  return out;
}

inline Tensor to_device(const Tensor& host) {
  Tensor t = gpu.empty(host.shape, host.dtype, MemCategory::activations);
  gpu.copy(t, host);
  return t;
}

// A fresh device tensor: NaN-poisoned by the emulator until a kernel writes it.
inline Tensor device_empty(const Shape& shape, DType dtype) { return gpu.empty(shape, dtype, MemCategory::activations); }

inline std::vector<float> values(const Tensor& t) {
  Tensor host = t.device == Device::cpu ? t : host_copy(t);
  std::vector<float> out(size_t(host.numel()));
  for (int64_t i = 0; i < host.numel(); ++i) out[size_t(i)] = load_as_f32(host.data, host.dtype, i);
  return out;
}

// Concatenated values of several tensors: one vector to compare across schedules.
inline std::vector<float> values(std::initializer_list<const Tensor*> tensors) {
  std::vector<float> out;
  for (const Tensor* t : tensors) {
    std::vector<float> v = values(*t);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

inline void check_close(const std::vector<float>& got, const std::vector<float>& want, Tolerance tol) {
  REQUIRE(got.size() == want.size());
  size_t bad = 0, nan = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    nan += std::isnan(got[i]);
    if (!(std::abs(double(got[i]) - double(want[i])) <= tol.atol + tol.rtol * std::abs(double(want[i])))) {
      if (bad++ < 5) MESSAGE("index ", i, ": got ", got[i], ", want ", want[i]);
    }
  }
  CHECK(nan == 0);
  CHECK(bad == 0);
}

}  // namespace cuda_test
