// Atomics from many blocks into a few shared counters.
#pragma once
#include "kernels/launch.h"

__device__ __forceinline__ void atomic_max_float(float* address, float v) {
  int* p = reinterpret_cast<int*>(address);
  int old = *p;
  while (__int_as_float(old) < v) {
    int assumed = old;
    old = atomicCAS(p, assumed, __float_as_int(v));
    if (old == assumed) break;
  }
}

// Per value x[i] >= 0: bins[x % nbins] += 1, count += 1, sum += x, max_int,
// max_float; the first 200 threads also add 1 to a half and a bf16 counter
// (exact in both formats up to 256).
__global__ void atomics_kernel(const int* x, int n, int* bins, int nbins, unsigned* count, float* sum, int* max_int,
                               float* max_float, __half* half_count, __nv_bfloat16* bf16_count) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int v = x[i];
  atomicAdd(&bins[v % nbins], 1);
  atomicAdd(count, 1u);
  atomicAdd(sum, float(v));
  atomicMax(max_int, v);
  atomic_max_float(max_float, float(v) * 0.5f);
  if (i < 200) {
    atomicAdd(half_count, __float2half(1.0f));
    atomicAdd(bf16_count, __float2bfloat16(1.0f));
  }
}
