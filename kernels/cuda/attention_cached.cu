// Generation's attention against the key/value cache: one warp per (query,
// query head). The lanes split head_dim (lane e holds features e, e + 32,
// ...), each visible key's score is a warp sum, and an online softmax runs
// key by key in f32, so every output is written by one warp in a fixed order
// (deterministic, no atomics). A decode step has one query per row, so the
// work is reading the cache once: a warp per query keeps every read of a key
// row coalesced.
#include <cmath>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"

namespace ft {
namespace {

constexpr int kThreads = 128;  // 4 warps: 4 queries per block
constexpr int kMaxPerLane = 8;  // head_dim up to 256

struct CachedDims {
  int64_t queries, q_seq, q_heads, kv_heads, cache_seq, head_dim, window;
};

__global__ void __launch_bounds__(kThreads)
    attention_cached_kernel(cuda::View out, cuda::ConstView q, cuda::ConstView k, cuda::ConstView v,
                            const int32_t* positions, float scale, CachedDims d) {
  const int64_t task = int64_t(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  if (task >= d.queries * d.q_heads) return;  // whole warps leave together
  const int lane = threadIdx.x % 32, D = int(d.head_dim);
  const int64_t h = task % d.q_heads, n = task / d.q_heads, b = n / d.q_seq;
  const int64_t kv_head = h / (d.q_heads / d.kv_heads);
  // A position past the cache would read another row's keys: clamp to the last slot.
  const int64_t p = positions[n] < d.cache_seq ? int64_t(positions[n]) : d.cache_seq - 1;
  const int64_t first = d.window > 0 && p - d.window + 1 > 0 ? p - d.window + 1 : 0;
  float qr[kMaxPerLane], acc[kMaxPerLane];
  FT_UNROLL
  for (int m = 0; m < kMaxPerLane; ++m) {
    const int e = lane + 32 * m;
    qr[m] = e < D ? cuda::load(q, (n * d.q_heads + h) * D + e) : 0.0f;
    acc[m] = 0.0f;
  }
  float row_max = -INFINITY, row_sum = 0.0f;
  for (int64_t j = first; j <= p; ++j) {
    const int64_t key = ((b * d.cache_seq + j) * d.kv_heads + kv_head) * D;
    float partial = 0.0f;
    FT_UNROLL
    for (int m = 0; m < kMaxPerLane; ++m) {
      const int e = lane + 32 * m;
      if (e < D) partial = fmaf(qr[m], cuda::load(k, key + e), partial);
    }
    const float score = scale * cuda::warp_sum(partial);
    const float new_max = fmaxf(row_max, score);
    const float rescale = expf(row_max - new_max), weight = expf(score - new_max);
    row_sum = row_sum * rescale + weight;
    FT_UNROLL
    for (int m = 0; m < kMaxPerLane; ++m) {
      const int e = lane + 32 * m;
      if (e < D) acc[m] = fmaf(weight, cuda::load(v, key + e), acc[m] * rescale);
    }
    row_max = new_max;
  }
  FT_UNROLL
  for (int m = 0; m < kMaxPerLane; ++m) {
    const int e = lane + 32 * m;
    if (e < D) cuda::store(out, (n * d.q_heads + h) * D + e, acc[m] / row_sum);
  }
}

}  // namespace

void CudaBackend::attention_cached_impl(Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                        const Tensor& positions, float scale, int64_t sliding_window) {
  const CachedDims d{q.dim(0) * q.dim(1), q.dim(1), q.dim(2), k_cache.dim(2), k_cache.dim(1), q.dim(3),
                     sliding_window};
  FT_CHECK(d.head_dim <= 32 * kMaxPerLane, "attention_cached: head_dim ", d.head_dim, " exceeds the supported ",
           32 * kMaxPerLane);
  const int64_t warps = d.queries * d.q_heads;
  if (warps == 0 || d.cache_seq == 0) return;
  constexpr int64_t kWarpsPerBlock = kThreads / 32;
  launch<attention_cached_kernel>(unsigned((warps + kWarpsPerBlock - 1) / kWarpsPerBlock), kThreads, 0, stream_,
                                  cuda::view(out), cuda::const_view(q), cuda::const_view(k_cache),
                                  cuda::const_view(v_cache), positions.ptr<const int32_t>(), scale, d);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
