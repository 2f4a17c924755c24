// The one header CUDA kernels and their host code include. Under nvcc it is the
// real runtime and `launch` is <<<>>>; under a host compiler it is the CPU
// emulator (kernels/emu/cuda_emu.h), so the same .cuh sources build both ways.
//
//   template <int Block>
//   __global__ void __launch_bounds__(Block) scale(float* x, float s, int n) {...}
//   ft::launch<scale<256>>(grid, 256, /*smem*/ 0, stream, x, 2.0f, n);
//
// The kernel is a template argument so the emulator can name it in reports.
// Dynamic shared memory: `FT_DYNAMIC_SHARED(float, buf);` declares float* buf.
#pragma once
#include <cstddef>
#include <utility>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>
// One raw byte array for every kernel: nvcc rejects differently typed extern
// __shared__ arrays of the same name.
#define FT_DYNAMIC_SHARED(T, name)                                    \
  extern __shared__ __align__(16) unsigned char ft_dynamic_smem_[]; \
  T* name = reinterpret_cast<T*>(ft_dynamic_smem_)
#else
#include "kernels/emu/cuda_emu.h"
#endif

// Loops over a thread's register arrays must be unrolled, or nvcc places the
// arrays in local memory; g++ (the emulator build) has no such pragma.
#if defined(__CUDACC__)
#define FT_UNROLL _Pragma("unroll")
#else
#define FT_UNROLL
#endif

namespace ft {

template <auto Kernel, class... Args>
void launch(dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream, Args&&... args) {
#if defined(__CUDACC__)
  Kernel<<<grid, block, smem_bytes, stream>>>(std::forward<Args>(args)...);
#else
  (void)stream;  // emulated launches run synchronously in issue order
  cuda_emu::launch_with<Kernel>(Kernel, grid, block, smem_bytes, std::forward<Args>(args)...);
#endif
}

}  // namespace ft
