// Warp-level kernels: shuffles, votes and a shuffle-based block scan.
#pragma once
#include "kernels/launch.h"

__device__ __forceinline__ float warp_sum_xor(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// out[block] = block sum: butterfly within warps, warp sums through shared
// memory, then the first warp folds them with __shfl_down_sync.
template <int Block>
__global__ void __launch_bounds__(Block) warp_block_sum_kernel(const float* x, float* out, int n) {
  static_assert(Block % 32 == 0 && Block <= 1024);
  __shared__ float warp_sums[Block / 32];
  int i = blockIdx.x * Block + threadIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float v = warp_sum_xor(i < n ? x[i] : 0.0f);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < Block / 32 ? warp_sums[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
    if (lane == 0) out[blockIdx.x] = v;
  }
}

// One warp, eight results per lane: broadcast within 16-lane halves, an
// inclusive scan within 8-lane groups, a __half2 rotation, and the votes.
__global__ void warp_ops_kernel(const int* x, int* out) {
  int lane = threadIdx.x, v = x[lane];
  int* o = out + lane * 8;
  o[0] = __shfl_sync(0xffffffffu, v, 3, 16);
  int scan = v;
  for (int d = 1; d < 8; d *= 2) {
    int up = __shfl_up_sync(0xffffffffu, scan, d, 8);
    if (lane % 8 >= d) scan += up;
  }
  o[1] = scan;
  __half2 h = __floats2half2_rn(float(v), float(-v));
  h = __shfl_sync(0xffffffffu, h, (lane + 1) % 32);
  o[2] = int(__low2float(h));
  o[3] = int(__high2float(h));
  o[4] = int(__ballot_sync(0xffffffffu, v % 2));
  o[5] = __any_sync(0xffffffffu, v > 60);
  o[6] = __all_sync(0xffffffffu, v >= 0);
  __syncwarp();
  o[7] = int(__activemask());
}

// Inclusive prefix sum of each block's Block ints: warp scans by
// __shfl_up_sync, warp totals scanned by the first warp, then added back.
template <int Block>
__global__ void __launch_bounds__(Block) block_scan_kernel(const int* x, int* out, int n) {
  __shared__ int warp_totals[Block / 32];
  int i = blockIdx.x * Block + threadIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int v = i < n ? x[i] : 0;
  for (int d = 1; d < 32; d *= 2) {
    int up = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += up;
  }
  if (lane == 31) warp_totals[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int total = lane < Block / 32 ? warp_totals[lane] : 0;
    for (int d = 1; d < 32; d *= 2) {
      int up = __shfl_up_sync(0xffffffffu, total, d);
      if (lane >= d) total += up;
    }
    if (lane < Block / 32) warp_totals[lane] = total;
  }
  __syncthreads();
  if (warp > 0) v += warp_totals[warp - 1];
  if (i < n) out[i] = v;
}
