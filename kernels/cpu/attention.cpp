// Causal grouped-query attention, blocked as FlashAttention: a tile of
// kQueryRows queries meets the keys kKeyCols at a time, so no more than one
// [kQueryRows, kKeyCols] score tile exists per thread. Forward keeps a running
// max and sum per row (online softmax) and saves lse, the log-sum-exp of each
// row; backward recomputes each probability tile from lse:
//   P = exp(S - lse), dV += P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dO * O)),
//   dQ = scale * dS K, dK = scale * dS^T Q.
// Every (batch, head) task first gathers its heads into contiguous f32 [T, D]
// buffers (and K and V transposed, [D, T]), so each of a tile's products
// (S = Q K^T, O += P V, dP = dO V^T, dQ += dS K, dK += dS^T Q, dV += P^T dO)
// is a small row-major GEMM run by one register-blocked loop (tile_gemm).
// Decoding (attention_cached) runs each query row through the same loop, so
// its rows equal the forward's bit for bit.
// Key j is visible to query i iff j <= i and, with a sliding window W > 0,
// i - j < W (transformers' Mistral mask): key tiles wholly outside are skipped.
// Packed rows (cu_seqlens) run each sequence of a row as a row of its own:
// the same tiles from the sequence's first token, so a packed sequence's
// results equal those of the sequence alone in a row, bit for bit.
// Scratch is thread_local and only grows, so steps after the first allocate
// nothing here.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_util.h"

namespace ft {
namespace {

using checks::AttentionShape;

constexpr int64_t kQueryRows = 32;  // query tile: its scores (8 KiB) and output rows stay in L1
constexpr int64_t kKeyCols = 64;    // key tile: one score row is 8 AVX vectors

// Element offset of x[b, t, h, 0] in its rows.
int64_t head_offset(const HeadsView& x, int64_t seq, int64_t b, int64_t t, int64_t h) {
  return x.offset((b * seq + t) * x.dim(2) + h);
}

// dst[rows, D] = x[b, :rows, h, :] as f32.
void gather_rows(float* dst, const HeadsView& x, const AttentionShape& d, int64_t b, int64_t h, int64_t rows) {
  for (int64_t t = 0; t < rows; ++t)
    cpu::load_row(dst + t * d.head_dim, x.rows, head_offset(x, d.seq, b, t, h), d.head_dim);
}

// dst[T, D] = x[b, :, h, :] as f32.
void gather_head(float* dst, const HeadsView& x, const AttentionShape& d, int64_t b, int64_t h) {
  gather_rows(dst, x, d, b, h, d.seq);
}

void scatter_head(const HeadsView& x, const float* src, const AttentionShape& d, int64_t b, int64_t h) {
  Tensor rows = x.rows;
  for (int64_t t = 0; t < d.seq; ++t)
    cpu::store_row(rows, head_offset(x, d.seq, b, t, h), src + t * d.head_dim, d.head_dim);
}

// The keys query i sees: [first, i].
int64_t first_visible_key(int64_t i, int64_t window) { return window > 0 ? std::max<int64_t>(0, i - window + 1) : 0; }

// The keys query i sees within the key tile of `keys` columns at j0, as
// columns [c0, c1) of the tile; empty when c0 >= c1.
struct VisibleKeys {
  int64_t c0, c1;
};
VisibleKeys visible_keys(int64_t i, int64_t j0, int64_t keys, int64_t window) {
  return {std::max<int64_t>(first_visible_key(i, window) - j0, 0), std::min(i - j0 + 1, keys)};
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

// Row r of a score tile of `keys` columns at j0, for query i: p holds its
// raw Q K^T products and becomes its probabilities under the row's running
// softmax (0 where i sees no key); the output row o is rescaled to the new
// max first. A row that sees no key of the tile is left as it was.
void softmax_tile_row(float* p, float* o, RowSoftmax& row, int64_t i, int64_t j0, int64_t keys, int64_t D,
                      float scale, int64_t window) {
  const auto [c0, c1] = visible_keys(i, j0, keys, window);
  if (c0 >= c1) {
    std::fill(p, p + keys, 0.0f);
    return;
  }
  float tile_max = -INFINITY;
  for (int64_t c = c0; c < c1; ++c) tile_max = std::max(tile_max, scale * p[c]);
  const float new_max = std::max(row.max, tile_max);
  const float rescale = std::exp(row.max - new_max);  // 0 on the first visible tile
  if (rescale != 1.0f)
    for (int64_t e = 0; e < D; ++e) o[e] *= rescale;
  float sum = 0.0f;
  for (int64_t c = 0; c < keys; ++c) {
    p[c] = c >= c0 && c < c1 ? std::exp(scale * p[c] - new_max) : 0.0f;
    sum += p[c];
  }
  row.sum = row.sum * rescale + sum;
  row.max = new_max;
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

// Eight floats in one AVX register (GCC's vector extension; the kernels are
// built for x86-64-v3), loaded and stored unaligned.
typedef float Vec8 __attribute__((vector_size(32)));
Vec8 load8(const float* p) {
  Vec8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

constexpr int64_t kBlockRows = 4, kBlockCols = 16;

// c[rows, cols] += a[rows, K] @ b[K, 16], rows <= 4, cols <= 16: the 4 x 16
// sums stay in eight AVX registers while k runs. a_rows[r] is row r of a
// (rows past `rows` repeat one of them: computed and dropped) and all 16
// columns of b are readable, so every element of every block, kept or not,
// is summed over k in order by the same instructions: a row's results do not
// depend on which rows or columns share its block.
void block_gemm(float* c, int64_t ldc, const float* const a_rows[kBlockRows], const float* b, int64_t ldb,
                int64_t K, int64_t rows, int64_t cols) {
  Vec8 acc[kBlockRows][2] = {};
  for (int64_t k = 0; k < K; ++k) {
    const Vec8 b0 = load8(b + k * ldb), b1 = load8(b + k * ldb + 8);
    for (int64_t r = 0; r < kBlockRows; ++r) {
      const float x = a_rows[r][k];
      acc[r][0] += x * b0;
      acc[r][1] += x * b1;
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    if (cols == kBlockCols) {  // the same additions, eight at a time
      for (int half = 0; half < 2; ++half) {
        const Vec8 sum = load8(c + r * ldc + 8 * half) + acc[r][half];
        std::memcpy(c + r * ldc + 8 * half, &sum, sizeof(sum));
      }
      continue;
    }
    float sums[kBlockCols];
    std::memcpy(sums, acc[r], sizeof(sums));
    for (int64_t j = 0; j < cols; ++j) c[r * ldc + j] += sums[j];
  }
}

// c[M, N] += a[M, K] @ b[K, N], all row-major f32 with leading dimensions
// lda, ldb, ldc, in blocks of 4 x 16 (block_gemm). b's last columns, when
// fewer than 16, are copied into a zero-padded strip first.
void tile_gemm(float* c, int64_t ldc, const float* a, int64_t lda, const float* b, int64_t ldb, int64_t M,
               int64_t N, int64_t K) {
  thread_local std::vector<float> strip;  // only grows
  for (int64_t n0 = 0; n0 < N; n0 += kBlockCols) {
    const int64_t cols = std::min(kBlockCols, N - n0);
    const float* b_block = b + n0;
    int64_t ld_block = ldb;
    if (cols < kBlockCols) {
      if (int64_t(strip.size()) < K * kBlockCols) strip.resize(size_t(K * kBlockCols));
      for (int64_t k = 0; k < K; ++k)
        for (int64_t j = 0; j < kBlockCols; ++j) strip[k * kBlockCols + j] = j < cols ? b[k * ldb + n0 + j] : 0.0f;
      b_block = strip.data(), ld_block = kBlockCols;
    }
    for (int64_t m0 = 0; m0 < M; m0 += kBlockRows) {
      const int64_t rows = std::min(kBlockRows, M - m0);
      const float* a_rows[kBlockRows];
      for (int64_t r = 0; r < kBlockRows; ++r) a_rows[r] = a + (m0 + (r < rows ? r : 0)) * lda;
      block_gemm(c + m0 * ldc + n0, ldc, a_rows, b_block, ld_block, K, rows, cols);
    }
  }
}

// dst[cols, rows] = src[rows, cols]^T (leading dimensions ld_dst, ld_src).
void transpose(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[j * ld_dst + i] = src[i * ld_src + j];
}

// One sequence of T tokens of a (batch, query head): out rows and lse from
// gathered q, v [T, D] and kt = K^T [D, T] (rows ldk apart: the sequence is
// columns of the row's gathered K^T); o is [T, D] scratch.
void forward_head(float* o, float* lse, const float* q, const float* kt, int64_t ldk, const float* v, int64_t T,
                  int64_t D, float scale, int64_t window) {
  float s[kQueryRows * kKeyCols];
  RowSoftmax rows_softmax[kQueryRows];
  for (int64_t i0 = 0; i0 < T; i0 += kQueryRows) {
    const int64_t rows = std::min(kQueryRows, T - i0);
    std::fill(o + i0 * D, o + (i0 + rows) * D, 0.0f);
    std::fill(rows_softmax, rows_softmax + rows, RowSoftmax{});
    for (int64_t j0 = first_key_tile(i0, window); j0 < i0 + rows; j0 += kKeyCols) {
      const int64_t keys = std::min(kKeyCols, i0 + rows - j0);
      std::fill(s, s + rows * kKeyCols, 0.0f);
      tile_gemm(s, kKeyCols, q + i0 * D, D, kt + j0, ldk, rows, keys, D);
      for (int64_t r = 0; r < rows; ++r)
        softmax_tile_row(s + r * kKeyCols, o + (i0 + r) * D, rows_softmax[r], i0 + r, j0, keys, D, scale, window);
      tile_gemm(o + i0 * D, D, s, kKeyCols, v + j0 * D, D, rows, D, keys);
    }
    for (int64_t r = 0; r < rows; ++r) lse[i0 + r] = finish_row(o + (i0 + r) * D, rows_softmax[r], D);
  }
}

// The gathered operands of one sequence of a (batch, query head) in the
// backward: k, v [T, D] and their transposes kt, vt [D, T] with rows ldk apart.
struct HeadGrads {
  const float *q, *dout, *k, *kt, *vt, *lse, *do_dot_o;
  float *dq, *dk, *dv;
  int64_t ldk;
};

// g's operands moved to the sequence at token t0 of the row.
HeadGrads sequence_grads(HeadGrads g, int64_t t0, int64_t D) {
  g.q += t0 * D, g.dout += t0 * D, g.k += t0 * D, g.kt += t0, g.vt += t0, g.lse += t0, g.do_dot_o += t0;
  g.dq += t0 * D, g.dk += t0 * D, g.dv += t0 * D;
  return g;
}

// One (batch, query head)'s contributions to dq (its own) and to dk, dv (its
// kv head's, shared with the other query heads of the group: one task owns them).
void backward_head(const HeadGrads& g, int64_t T, int64_t D, float scale, int64_t window) {
  float p[kQueryRows * kKeyCols], ds[kQueryRows * kKeyCols], transposed[kKeyCols * kQueryRows];
  for (int64_t i0 = 0; i0 < T; i0 += kQueryRows) {
    const int64_t rows = std::min(kQueryRows, T - i0);
    for (int64_t j0 = first_visible_key(i0, window); j0 < i0 + rows; j0 += kKeyCols) {
      const int64_t keys = std::min(kKeyCols, i0 + rows - j0);
      std::fill(p, p + rows * kKeyCols, 0.0f);
      std::fill(ds, ds + rows * kKeyCols, 0.0f);
      tile_gemm(p, kKeyCols, g.q + i0 * D, D, g.kt + j0, g.ldk, rows, keys, D);
      tile_gemm(ds, kKeyCols, g.dout + i0 * D, D, g.vt + j0, g.ldk, rows, keys, D);  // dP
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = i0 + r;
        const VisibleKeys seen = visible_keys(i, j0, keys, window);
        for (int64_t c = 0; c < keys; ++c) {
          const bool visible = c >= seen.c0 && c < seen.c1;
          const float pc = visible ? std::exp(scale * p[r * kKeyCols + c] - g.lse[i]) : 0.0f;
          p[r * kKeyCols + c] = pc;
          ds[r * kKeyCols + c] = scale * pc * (ds[r * kKeyCols + c] - g.do_dot_o[i]);
        }
      }
      tile_gemm(g.dq + i0 * D, D, ds, kKeyCols, g.k + j0 * D, D, rows, D, keys);
      transpose(transposed, kQueryRows, ds, kKeyCols, rows, keys);
      tile_gemm(g.dk + j0 * D, D, transposed, kQueryRows, g.q + i0 * D, D, keys, D, rows);
      transpose(transposed, kQueryRows, p, kKeyCols, rows, keys);
      tile_gemm(g.dv + j0 * D, D, transposed, kQueryRows, g.dout + i0 * D, D, keys, D, rows);
    }
  }
}

// Attention's scratch per thread: K and V of one kv head (and transposed),
// the query head's operands and results.
struct AttentionScratch {
  std::vector<float> k, v, kt, vt, q, o, dout, dq, dk, dv, do_dot_o;
};
thread_local AttentionScratch tls;

// The sequences of each row as [first, end) token ranges within the row:
// cu_seqlens' (checked here: the host reads it), or the whole row.
std::vector<std::vector<std::pair<int64_t, int64_t>>> row_sequences(const char* op, const Tensor* cu_seqlens,
                                                                    int64_t B, int64_t T) {
  std::vector<std::vector<std::pair<int64_t, int64_t>>> rows(static_cast<size_t>(B));
  if (!cu_seqlens) {
    for (auto& row : rows) row = {{0, T}};
    return rows;
  }
  const int32_t* cu = cu_seqlens->ptr<const int32_t>();
  const int64_t count = cu_seqlens->numel();
  checks::check_cu_seqlens_values(op, cu, count, B, T);
  for (int64_t s = 0; s + 1 < count; ++s) {
    const int64_t b = cu[s] / T;
    rows[size_t(b)].push_back({cu[s] - b * T, cu[s + 1] - b * T});
  }
  return rows;
}

}  // namespace

void CpuBackend::attention_forward_impl(Tensor& out, Tensor& lse, const HeadsView& q, const HeadsView& k,
                                        const HeadsView& v, float scale, int64_t window,
                                        const Tensor* cu_seqlens) {
  AttentionShape d = checks::attention_shape(q, k);
  const int64_t T = d.seq, D = d.head_dim, group = d.q_heads / d.kv_heads;
  float* lse_out = lse.ptr<float>();
  const auto sequences = row_sequences("attention_forward", cu_seqlens, d.batch, T);
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.q_heads; ++h) {
      AttentionScratch& s = tls;
      float *qh = scratch(s.q, T * D), *kh = scratch(s.k, T * D), *vh = scratch(s.v, T * D);
      float *kth = scratch(s.kt, T * D), *oh = scratch(s.o, T * D);
      gather_head(qh, q, d, b, h);
      gather_head(kh, k, d, b, h / group);
      gather_head(vh, v, d, b, h / group);
      transpose(kth, T, kh, D, T, D);
      float* lse_row = lse_out + (b * d.q_heads + h) * T;
      for (const auto& [t0, t1] : sequences[size_t(b)])
        forward_head(oh + t0 * D, lse_row + t0, qh + t0 * D, kth + t0, T, vh + t0 * D, t1 - t0, D, scale, window);
      scatter_head(out, oh, d, b, h);
    }
}

// One task per (batch, kv head): it owns dk and dv for that kv head and loops
// over the query heads that share it, so no two threads add into the same row.
void CpuBackend::attention_backward_impl(const HeadsView& dq, const HeadsView& dk, const HeadsView& dv,
                                         const Tensor& dout, const HeadsView& q, const HeadsView& k,
                                         const HeadsView& v, const Tensor& out, const Tensor& lse, float scale,
                                         int64_t window, const Tensor* cu_seqlens) {
  AttentionShape d = checks::attention_shape(q, k);
  const int64_t T = d.seq, D = d.head_dim, group = d.q_heads / d.kv_heads;
  const float* lse_in = lse.ptr<const float>();
  const auto sequences = row_sequences("attention_backward", cu_seqlens, d.batch, T);
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t hk = 0; hk < d.kv_heads; ++hk) {
      AttentionScratch& s = tls;
      HeadGrads g{};
      float *kh = scratch(s.k, T * D), *vh = scratch(s.v, T * D);
      float *kth = scratch(s.kt, T * D), *vth = scratch(s.vt, T * D);
      float *dkh = scratch(s.dk, T * D), *dvh = scratch(s.dv, T * D);
      float *qh = scratch(s.q, T * D), *doh = scratch(s.dout, T * D), *oh = scratch(s.o, T * D);
      float *dqh = scratch(s.dq, T * D), *do_dot_o = scratch(s.do_dot_o, T);
      gather_head(kh, k, d, b, hk);
      gather_head(vh, v, d, b, hk);
      transpose(kth, T, kh, D, T, D);
      transpose(vth, T, vh, D, T, D);
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
        g = {qh, doh, kh, kth, vth, lse_in + (b * d.q_heads + h) * T, do_dot_o, dqh, dkh, dvh, T};
        for (const auto& [t0, t1] : sequences[size_t(b)])
          backward_head(sequence_grads(g, t0, D), t1 - t0, D, scale, window);
        scatter_head(dq, dqh, d, b, h);
      }
      scatter_head(dk, dkh, d, b, hk);
      scatter_head(dv, dvh, d, b, hk);
    }
}

// One task per (batch, query head): its kv head's cached keys and values up
// to the row's last query position are gathered once (keys transposed), then
// each query row meets the key tiles attention_forward gives it, through the
// same tile_gemm and softmax_tile_row: its row of attention_forward, bit for bit.
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
      float *kth = scratch(s.kt, keys * D), *oh = scratch(s.o, Tq * D);
      gather_rows(kh, k_cache, cache, b, h / group, keys);
      gather_rows(vh, v_cache, cache, b, h / group, keys);
      transpose(kth, keys, kh, D, keys, D);
      gather_head(qh, q, queries, b, h);
      float p[kKeyCols];
      for (int64_t t = 0; t < Tq; ++t) {
        const int64_t i = row_positions[t];
        float* o = oh + t * D;
        std::fill(o, o + D, 0.0f);
        RowSoftmax row;
        for (int64_t j0 = first_key_tile(i, window); j0 <= i; j0 += kKeyCols) {
          const int64_t tile_keys = std::min(kKeyCols, i + 1 - j0);
          std::fill(p, p + tile_keys, 0.0f);
          tile_gemm(p, kKeyCols, qh + t * D, D, kth + j0, keys, 1, tile_keys, D);
          softmax_tile_row(p, o, row, i, j0, tile_keys, D, scale, window);
          tile_gemm(o, D, p, kKeyCols, vh + j0 * D, D, 1, D, tile_keys);
        }
        finish_row(o, row, D);
      }
      scatter_head(out, oh, queries, b, h);
    }
}

}  // namespace ft
