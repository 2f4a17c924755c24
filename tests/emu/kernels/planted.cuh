// Kernels with planted bugs the emulator must report. They compile cleanly
// under nvcc too: these are bugs no compiler sees.
#pragma once
#include "kernels/launch.h"

// Off-by-one bound: writes x[n].
__global__ void oob_write_kernel(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= n) x[i] = 1.0f;
}

// The first warp and the rest wait at different __syncthreads.
__global__ void divergent_barrier_kernel(float* x) {
  if (threadIdx.x < 32) {
    x[threadIdx.x] = 1.0f;
    __syncthreads();
  } else {
    __syncthreads();
  }
}

// Lanes 0-15 shuffle with the full warp while lanes 16-31 wait at a barrier.
__global__ void deadlock_kernel(float* x) {
  float v = x[threadIdx.x];
  if (threadIdx.x < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
  else __syncthreads();
  x[threadIdx.x] = v;
}

// Every lane shuffles with a mask naming only lanes 0-15.
__global__ void mask_excludes_caller_kernel(float* x) {
  x[threadIdx.x] = __shfl_sync(0x0000ffffu, x[threadIdx.x], 0);
}

// Lanes 16-31 exit, the rest shuffle with the full mask.
__global__ void exited_lane_kernel(float* x) {
  if (threadIdx.x >= 16) return;
  x[threadIdx.x] = __shfl_xor_sync(0xffffffffu, x[threadIdx.x], 1);
}

// Lanes 16-31 load a wmma fragment with another ldm than lanes 0-15.
__global__ void wmma_divergent_ldm_kernel(float* x) {
  nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> acc;
  nvcuda::wmma::load_matrix_sync(acc, x, threadIdx.x < 16 ? 16 : 20, nvcuda::wmma::mem_row_major);
  nvcuda::wmma::store_matrix_sync(x, acc, 16, nvcuda::wmma::mem_row_major);
}

// A wmma fragment loaded from 16 bytes past a 256-bit boundary.
__global__ void wmma_misaligned_kernel(float* x) {
  nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> acc;
  nvcuda::wmma::load_matrix_sync(acc, x + 4, 16, nvcuda::wmma::mem_row_major);
  nvcuda::wmma::store_matrix_sync(x, acc, 16, nvcuda::wmma::mem_row_major);
}
