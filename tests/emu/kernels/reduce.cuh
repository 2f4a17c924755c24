// Shared-memory block kernels, each with a planted-bug variant the emulator
// must catch (template flag false).
#pragma once
#include "kernels/launch.h"

// out[block] = sum of the block's Block elements, by a tree in shared memory.
// Correct = false drops the barrier inside the tree: a missing __syncthreads.
template <int Block, bool Correct>
__global__ void __launch_bounds__(Block) block_sum_kernel(const float* x, float* out, int n) {
  __shared__ float partial[Block];
  int t = threadIdx.x, i = blockIdx.x * Block + t;
  partial[t] = i < n ? x[i] : 0.0f;
  __syncthreads();
  for (int stride = Block / 2; stride > 0; stride /= 2) {
    if (t < stride) partial[t] += partial[t + stride];
    if constexpr (Correct) __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = partial[0];
}

// out[i] = x[i + 1] - x[i] (x[n] taken as 0) through a shared tile with a
// one-element halo. LoadHalo = false forgets the halo: an unwritten read.
template <int Block, bool LoadHalo>
__global__ void __launch_bounds__(Block) adjacent_diff_kernel(const float* x, float* out, int n) {
  __shared__ float tile[Block + 1];
  int i = blockIdx.x * Block + threadIdx.x;
  tile[threadIdx.x] = i < n ? x[i] : 0.0f;
  if (LoadHalo && threadIdx.x == Block - 1) tile[Block] = i + 1 < n ? x[i + 1] : 0.0f;
  __syncthreads();
  if (i < n) out[i] = tile[threadIdx.x + 1] - tile[threadIdx.x];
}

// Two barriers per block, the shape of the emulator benchmark: tile, pairwise
// sums of neighbours, written out in reverse order within the block.
// Dynamic shared memory holds both stages (2 * Block floats).
template <int Block>
__global__ void __launch_bounds__(Block) two_barrier_kernel(const float* x, float* out, int n) {
  FT_DYNAMIC_SHARED(float, smem);
  float* tile = smem;
  float* pairs = smem + Block;
  int i = blockIdx.x * Block + threadIdx.x;
  tile[threadIdx.x] = i < n ? x[i] : 0.0f;
  __syncthreads();
  pairs[threadIdx.x] = tile[threadIdx.x] + tile[(threadIdx.x + 1) % Block];
  __syncthreads();
  if (i < n) out[i] = pairs[Block - 1 - threadIdx.x];
}
