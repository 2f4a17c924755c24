// What the two attention kernel families share (attention.cu: f32 FMA
// kernels for any operand dtypes; attention_tc.cu: bf16 tensor-core kernels):
// the launch sizes, the causal sliding-window mask within packed sequences,
// and the key and query tile ranges it leaves. attention.cu picks the family per call
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
  // Packed rows (Backend::attention_forward): the device's i32 varlen offsets
  // over the B * seq tokens and their count (S + 1), or null and 0 where each
  // row is one sequence.
  const int32_t* cu_seqlens;
  int64_t cu_seqlens_count;
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

// Tokens [start, end) of batch row b, as positions within the row.
struct TokenRange {
  int start, end;
};

// The sequence that holds token t (< seq) of batch row b: the whole row
// without cu_seqlens, else the offsets' last start at or before the token, by
// binary search. A search rather than a per-token table of starts: no scratch
// to allocate (and to charge in the memory planner) and no extra launch; the
// kernels search once per query row they stage, or once per tile, never per
// score, and the few hundred bytes of offsets stay in cache.
__device__ inline TokenRange sequence_of(const AttentionDims& dims, int b, int t) {
  if (!dims.cu_seqlens) return {0, dims.seq};
  const int64_t row_start = int64_t(b) * dims.seq, token = row_start + t;
  // cu_seqlens[lo] <= token < cu_seqlens[hi] throughout: it runs from 0 to B * seq.
  int64_t lo = 0, hi = dims.cu_seqlens_count - 1;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (dims.cu_seqlens[mid] <= token) lo = mid;
    else hi = mid;
  }
  return {int(dims.cu_seqlens[lo] - row_start), int(dims.cu_seqlens[hi] - row_start)};
}

// Whether query position `query` sees key position `key`, first_key being
// the start of the query's sequence (0 without packing): causal, within the
// query's sequence (a key from first_key to the query lies in it, as
// sequences are contiguous), and within the sliding window if there is one
// (transformers' kv_idx > q_idx - window).
__host__ __device__ inline bool key_visible(int query, int key, int first_key, int window) {
  return key >= first_key && key <= query && (window == 0 || query - key < window);
}

// The first key tile (of tile_keys keys) that a query tile starting at q0
// sees, first_key being the start of q0's sequence: the tile's later rows
// start their sequences there or after it, and their windows after q0's.
__host__ __device__ inline int first_key_tile(int q0, int first_key, int tile_keys, int window) {
  const int window_start = window == 0 || q0 < window ? 0 : q0 - window + 1;
  return (window_start > first_key ? window_start : first_key) / tile_keys;
}

// One past the last query tile (of tile_queries rows) that sees a key tile
// starting at k0 whose last key's sequence ends at last_key_end (seq without
// packing): queries from there on belong to later sequences than every key of
// the tile, and queries past the last key's window see none of them.
__host__ __device__ inline int end_query_tile(int k0, int tile_keys, int tile_queries, int window,
                                              int last_key_end) {
  int end_query = last_key_end;
  if (window != 0) {
    const int window_end = k0 + tile_keys - 1 + window;
    end_query = window_end < end_query ? window_end : end_query;
  }
  return (end_query + tile_queries - 1) / tile_queries;
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
