// Causal grouped-query attention, blocked as FlashAttention: a tile of
// kQueryRows queries meets the keys kKeyCols at a time, so no more than one
// [kQueryRows, kKeyCols] score tile exists per thread. Forward keeps a running
// max and sum per row (online softmax) and saves lse, the log-sum-exp of each
// row; backward recomputes each probability tile from lse:
//   P = exp(S - lse), dV += P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dO * O)),
//   dQ = scale * dS K, dK = scale * dS^T Q.
// Every (batch, head) task first gathers its heads into contiguous f32 [T, D]
// buffers, so every inner loop runs along head_dim: dot products for scores,
// axpys for outputs and gradients.
// Key j is visible to query i iff j <= i and, with a sliding window W > 0,
// i - j < W (transformers' Mistral mask): key tiles wholly outside are skipped.
// Scratch is thread_local and only grows, so steps after the first allocate
// nothing here.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_util.h"

namespace ft {
namespace {

using checks::AttentionShape;

constexpr int64_t kQueryRows = 32;  // query tile: its scores (8 KiB) and output rows stay in L1
constexpr int64_t kKeyCols = 64;    // key tile: one score row is 8 AVX vectors

// Element offset of x[b, t, h, 0] in a [B, T, H, D] tensor.
int64_t head_offset(const AttentionShape& d, int64_t heads, int64_t b, int64_t t, int64_t h) {
  return ((b * d.seq + t) * heads + h) * d.head_dim;
}

// dst[rows, D] = x[b, :rows, h, :] as f32.
void gather_rows(float* dst, const Tensor& x, const AttentionShape& d, int64_t b, int64_t h, int64_t rows) {
  int64_t heads = x.dim(2);
  for (int64_t t = 0; t < rows; ++t)
    cpu::load_row(dst + t * d.head_dim, x, head_offset(d, heads, b, t, h), d.head_dim);
}

// dst[T, D] = x[b, :, h, :] as f32.
void gather_head(float* dst, const Tensor& x, const AttentionShape& d, int64_t b, int64_t h) {
  gather_rows(dst, x, d, b, h, d.seq);
}

void scatter_head(Tensor& x, const float* src, const AttentionShape& d, int64_t b, int64_t h) {
  int64_t heads = x.dim(2);
  for (int64_t t = 0; t < d.seq; ++t)
    cpu::store_row(x, head_offset(d, heads, b, t, h), src + t * d.head_dim, d.head_dim);
}

// y += alpha * x
void axpy(float* y, float alpha, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// The keys query i sees: [first, i].
int64_t first_visible_key(int64_t i, int64_t window) { return window > 0 ? std::max<int64_t>(0, i - window + 1) : 0; }

// out[c] = scale * q . K[j0 + c, :] for c in [c0, c1) (K [T, D]): one
// vectorised dot product along head_dim per key.
void score_row(float* out, const float* q, const float* k, int64_t D, int64_t j0, int64_t c0, int64_t c1,
               float scale) {
  for (int64_t c = c0; c < c1; ++c) {
    const float* key = k + (j0 + c) * D;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t e = 0; e < D; ++e) sum += q[e] * key[e];
    out[c] = scale * sum;
  }
}

// Per-thread scratch that only grows.
float* scratch(std::vector<float>& buffer, int64_t count) {
  if (int64_t(buffer.size()) < count) buffer.resize(size_t(count));
  return buffer.data();
}

// One query row's online softmax: its running max and sum of exp(score - max).
struct RowSoftmax {
  float max = -INFINITY, sum = 0.0f;
};

// Query i (q_i, its output row out unnormalised) meets the keys of the tile
// starting at j0 that it sees; srow is [kKeyCols] scratch. k and v are [*, D].
void attend_key_tile(float* out, RowSoftmax& row, float* srow, const float* q_i, const float* k, const float* v,
                     int64_t i, int64_t j0, int64_t D, float scale, int64_t window) {
  const int64_t c0 = std::max<int64_t>(first_visible_key(i, window) - j0, 0);
  const int64_t c1 = std::min(i - j0 + 1, kKeyCols);
  if (c0 >= c1) return;
  score_row(srow, q_i, k, D, j0, c0, c1, scale);
  const float tile_max = *std::max_element(srow + c0, srow + c1);
  const float new_max = std::max(row.max, tile_max);
  const float rescale = std::exp(row.max - new_max);  // 0 on the first visible tile
  if (rescale != 1.0f)
    for (int64_t e = 0; e < D; ++e) out[e] *= rescale;
  float sum = row.sum * rescale;
  for (int64_t c = c0; c < c1; ++c) {
    const float p = std::exp(srow[c] - new_max);
    sum += p;
    axpy(out, p, v + (j0 + c) * D, D);
  }
  row.max = new_max, row.sum = sum;
}

// Divides the output row by its softmax sum; returns the row's lse.
float finish_row(float* out, const RowSoftmax& row, int64_t D) {
  const float inv = 1.0f / row.sum;
  for (int64_t e = 0; e < D; ++e) out[e] *= inv;
  return row.max + std::log(row.sum);
}

// The first key tile of query i's query tile: every row of a tile walks the
// same key tiles, so a row alone (attention_cached) starts where its tile does.
int64_t first_key_tile(int64_t i, int64_t window) { return first_visible_key(i - i % kQueryRows, window); }

// One (batch, query head): out rows and lse from gathered q, k and v [T, D];
// o is [T, D] scratch.
void forward_head(float* o, float* lse, const float* q, const float* k, const float* v, int64_t T, int64_t D,
                  float scale, int64_t window) {
  float s[kQueryRows * kKeyCols];
  RowSoftmax rows_softmax[kQueryRows];
  for (int64_t i0 = 0; i0 < T; i0 += kQueryRows) {
    const int64_t rows = std::min(kQueryRows, T - i0);
    std::fill(o + i0 * D, o + (i0 + rows) * D, 0.0f);
    std::fill(rows_softmax, rows_softmax + rows, RowSoftmax{});
    for (int64_t j0 = first_key_tile(i0, window); j0 < i0 + rows; j0 += kKeyCols)
      for (int64_t r = 0; r < rows; ++r)
        attend_key_tile(o + (i0 + r) * D, rows_softmax[r], s + r * kKeyCols, q + (i0 + r) * D, k, v, i0 + r, j0, D,
                        scale, window);
    for (int64_t r = 0; r < rows; ++r) lse[i0 + r] = finish_row(o + (i0 + r) * D, rows_softmax[r], D);
  }
}

// The gathered operands of one (batch, query head) in the backward.
struct HeadGrads {
  const float *q, *dout, *k, *v, *lse, *do_dot_o;
  float *dq, *dk, *dv;
};

// One (batch, query head)'s contributions to dq (its own) and to dk, dv (its
// kv head's, shared with the other query heads of the group: one task owns them).
void backward_head(const HeadGrads& g, int64_t T, int64_t D, float scale, int64_t window) {
  float p[kKeyCols], dp[kKeyCols];
  for (int64_t i0 = 0; i0 < T; i0 += kQueryRows) {
    const int64_t rows = std::min(kQueryRows, T - i0);
    for (int64_t j0 = first_visible_key(i0, window); j0 < i0 + rows; j0 += kKeyCols)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = i0 + r;
        const int64_t c0 = std::max<int64_t>(first_visible_key(i, window) - j0, 0);
        const int64_t c1 = std::min(i - j0 + 1, kKeyCols);
        if (c0 >= c1) continue;
        const float* q_i = g.q + i * D;
        const float* do_i = g.dout + i * D;
        score_row(p, q_i, g.k, D, j0, c0, c1, scale);
        score_row(dp, do_i, g.v, D, j0, c0, c1, 1.0f);
        for (int64_t c = c0; c < c1; ++c) p[c] = std::exp(p[c] - g.lse[i]);
        float* dq_i = g.dq + i * D;
        for (int64_t c = c0; c < c1; ++c) {
          const int64_t j = j0 + c;
          const float ds = scale * p[c] * (dp[c] - g.do_dot_o[i]);
          axpy(g.dv + j * D, p[c], do_i, D);
          axpy(dq_i, ds, g.k + j * D, D);
          axpy(g.dk + j * D, ds, q_i, D);
        }
      }
  }
}

// Attention's scratch per thread: K and V of one kv head, the query head's
// operands and results.
struct AttentionScratch {
  std::vector<float> k, v, q, o, dout, dq, dk, dv, do_dot_o;
};
thread_local AttentionScratch tls;

}  // namespace

void CpuBackend::attention_forward_impl(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                                        float scale, int64_t window) {
  AttentionShape d = checks::attention_shape(q, k);
  const int64_t T = d.seq, D = d.head_dim, group = d.q_heads / d.kv_heads;
  float* lse_out = lse.ptr<float>();
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.q_heads; ++h) {
      AttentionScratch& s = tls;
      float *qh = scratch(s.q, T * D), *kh = scratch(s.k, T * D), *vh = scratch(s.v, T * D);
      float* oh = scratch(s.o, T * D);
      gather_head(qh, q, d, b, h);
      gather_head(kh, k, d, b, h / group);
      gather_head(vh, v, d, b, h / group);
      forward_head(oh, lse_out + (b * d.q_heads + h) * T, qh, kh, vh, T, D, scale, window);
      scatter_head(out, oh, d, b, h);
    }
}

// One task per (batch, kv head): it owns dk and dv for that kv head and loops
// over the query heads that share it, so no two threads add into the same row.
void CpuBackend::attention_backward_impl(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                                         const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                                         float scale, int64_t window) {
  AttentionShape d = checks::attention_shape(q, k);
  const int64_t T = d.seq, D = d.head_dim, group = d.q_heads / d.kv_heads;
  const float* lse_in = lse.ptr<const float>();
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t hk = 0; hk < d.kv_heads; ++hk) {
      AttentionScratch& s = tls;
      HeadGrads g{};
      float *kh = scratch(s.k, T * D), *vh = scratch(s.v, T * D);
      float *dkh = scratch(s.dk, T * D), *dvh = scratch(s.dv, T * D);
      float *qh = scratch(s.q, T * D), *doh = scratch(s.dout, T * D), *oh = scratch(s.o, T * D);
      float *dqh = scratch(s.dq, T * D), *do_dot_o = scratch(s.do_dot_o, T);
      gather_head(kh, k, d, b, hk);
      gather_head(vh, v, d, b, hk);
      std::fill(dkh, dkh + T * D, 0.0f);
      std::fill(dvh, dvh + T * D, 0.0f);
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        gather_head(qh, q, d, b, h);
        gather_head(doh, dout, d, b, h);
        gather_head(oh, out, d, b, h);
        for (int64_t t = 0; t < T; ++t) {
          float sum = 0.0f;
          for (int64_t e = 0; e < D; ++e) sum += doh[t * D + e] * oh[t * D + e];
          do_dot_o[t] = sum;
        }
        std::fill(dqh, dqh + T * D, 0.0f);
        g = {qh, doh, kh, vh, lse_in + (b * d.q_heads + h) * T, do_dot_o, dqh, dkh, dvh};
        backward_head(g, T, D, scale, window);
        scatter_head(dq, dqh, d, b, h);
      }
      scatter_head(dk, dkh, d, b, hk);
      scatter_head(dv, dvh, d, b, hk);
    }
}

// One task per (batch, query head): its kv head's cached keys and values up
// to the row's last query position are gathered once, then each query row
// runs attend_key_tile over the tiles attention_forward gives it.
void CpuBackend::attention_cached_impl(Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                       const Tensor& positions, float scale, int64_t window) {
  const int64_t B = q.dim(0), Tq = q.dim(1), Hq = q.dim(2), D = q.dim(3), S = k_cache.dim(1);
  const int64_t group = Hq / k_cache.dim(2);
  const int32_t* position = positions.ptr<const int32_t>();
  for (int64_t n = 0; n < B * Tq; ++n)
    FT_CHECK(position[n] >= 0 && position[n] < S, "attention_cached: position ", position[n], " of query ", n,
             " is outside the cache's ", S, " slots");
  const AttentionShape queries{B, Tq, Hq, k_cache.dim(2), D}, cache{B, S, Hq, k_cache.dim(2), D};
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      AttentionScratch& s = tls;
      const int32_t* row_positions = position + b * Tq;
      const int64_t keys = *std::max_element(row_positions, row_positions + Tq) + 1;
      float *kh = scratch(s.k, keys * D), *vh = scratch(s.v, keys * D), *qh = scratch(s.q, Tq * D);
      float* oh = scratch(s.o, Tq * D);
      gather_rows(kh, k_cache, cache, b, h / group, keys);
      gather_rows(vh, v_cache, cache, b, h / group, keys);
      gather_head(qh, q, queries, b, h);
      float srow[kKeyCols];
      for (int64_t t = 0; t < Tq; ++t) {
        const int64_t i = row_positions[t];
        float* o = oh + t * D;
        std::fill(o, o + D, 0.0f);
        RowSoftmax row;
        for (int64_t j0 = first_key_tile(i, window); j0 <= i; j0 += kKeyCols)
          attend_key_tile(o, row, srow, qh + t * D, kh, vh, i, j0, D, scale, window);
        finish_row(o, row, D);
      }
      scatter_head(out, oh, queries, b, h);
    }
}

}  // namespace ft
