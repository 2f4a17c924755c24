// What the two attention kernel families share (attention.cu: f32 FMA
// kernels for any operand dtypes; attention_tc.cu: bf16 tensor-core kernels):
// the launch sizes, the causal sliding-window mask, and the key and query
// tile ranges it leaves. attention.cu picks the family per call
// (attention_uses_tensor_cores in scratch.h, which the memory planner reads too).
#pragma once
#include <cstdint>

#include "kernels/launch.h"
#include "kernels/tensor.h"

namespace ft::cuda {

// Sizes a kernel needs; offsets into [B, T, H, D] tensors are int64.
struct AttentionDims {
  int seq, q_heads, kv_heads, head_dim, group;  // group = q_heads / kv_heads
  int window;  // sliding window in tokens, 0 for none (at most seq, so it fits an int)
  // Elements between consecutive head rows of each operand view (HeadsView's
  // pitch: head_dim where contiguous, 3 * head_dim in GPT-NeoX's fused qkv
  // rows); the gradients' are set by backward only. out and dout are contiguous.
  int64_t q_pitch, k_pitch, v_pitch, dq_pitch, dk_pitch, dv_pitch;
};

// Where head h of batch row b lies in an operand of `heads` heads whose head
// rows are pitch elements apart: x[b, t, h, d] at base + t * stride + d, from
// the view's first column.
struct HeadRows {
  int64_t base, stride;
};
__host__ __device__ inline HeadRows head_rows(int64_t pitch, int heads, int seq, int b, int h) {
  return {(int64_t(b) * seq * heads + h) * pitch, int64_t(heads) * pitch};
}

// Whether query position `query` sees key position `key`: causal, and within
// the sliding window if there is one (transformers' kv_idx > q_idx - window).
__host__ __device__ inline bool key_visible(int query, int key, int window) {
  return key <= query && (window == 0 || query - key < window);
}

// The first key tile (of tile_keys keys) that a query tile starting at q0 sees.
__host__ __device__ inline int first_key_tile(int q0, int tile_keys, int window) {
  return window == 0 || q0 < window ? 0 : (q0 - window + 1) / tile_keys;
}

// One past the last query tile (of tile_queries rows) that sees a key tile
// [k0, k0 + tile_keys), capped at the sequence's query tiles.
__host__ __device__ inline int end_query_tile(int k0, int tile_keys, int tile_queries, int window, int seq) {
  int q_tiles = (seq + tile_queries - 1) / tile_queries;
  if (window == 0) return q_tiles;
  int last_query = k0 + tile_keys - 1 + window - 1;
  int end = last_query / tile_queries + 1;
  return end < q_tiles ? end : q_tiles;
}

// attention_tc.cu. lse f32 [B, Hq, T]; out any float dtype.
void attention_forward_tc(Tensor& out, Tensor& lse, const HeadsView& q, const HeadsView& k, const HeadsView& v,
                          float scale, const AttentionDims& dims, int64_t batch, cudaStream_t stream);
// di = rowsum(dO * O) f32 [B, Hq, T]; dq_accum f32 [B, T, Hq, D] workspace
// (zeroed here, then summed into by atomics, then scaled into dq).
void attention_backward_tc(const HeadsView& dq, const HeadsView& dk, const HeadsView& dv, const Tensor& dout,
                           const HeadsView& q, const HeadsView& k, const HeadsView& v, const Tensor& lse,
                           const float* di, float* dq_accum, float scale, const AttentionDims& dims, int64_t batch,
                           cudaStream_t stream);

}  // namespace ft::cuda
