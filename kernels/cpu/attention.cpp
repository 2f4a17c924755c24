// Causal grouped-query attention, blocked as FlashAttention: a tile of
// kQueryRows queries meets the keys kKeyCols at a time, so no more than one
// [kQueryRows, kKeyCols] score tile exists per thread. Forward keeps a running
// max and sum per row (online softmax) and saves lse, the log-sum-exp of each
// row; backward recomputes each probability tile from lse:
//   P = exp(S - lse), dV += P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dO * O)),
//   dQ = scale * dS K, dK = scale * dS^T Q.
// Every (batch, head) task first gathers its heads into contiguous buffers
// (and K and V transposed), so each of a tile's products (S = Q K^T, O += P V,
// dP = dO V^T, dQ += dS K, dK += dS^T Q, dV += P^T dO) is a small GEMM run by
// one register-blocked loop: in f32 (tile_gemm) when any operand is f32, or,
// when all are bf16 (precision: bf16), on bf16 pairs with f32 sums
// (bf16_tile.h; AVX512-BF16 where the CPU has it), the softmax in f32.
// Decoding (attention_cached) runs each query row through the same loops, so
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
#include <initializer_list>
#include <vector>

#include "kernels/cpu/bf16_tile.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/vec_exp.h"

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
template <typename T>
T* scratch(std::vector<T>& buffer, int64_t count) {
  if (int64_t(buffer.size()) < count) buffer.resize(size_t(count));
  return buffer.data();
}

// Eight floats in one AVX register (GCC's vector extension; the kernels are
// built for x86-64-v3), loaded and stored unaligned.
typedef float Vec8 __attribute__((vector_size(32)));
Vec8 load8(const float* p) {
  Vec8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// The maximum of x[0, n): eight lanes, then across them (a maximum is the
// same in any order).
float row_max(const float* x, int64_t n) {
  float m = -INFINITY;
  int64_t i = 0;
  if (n >= 8) {
    Vec8 lanes = load8(x);
    for (i = 8; i + 8 <= n; i += 8) {
      const Vec8 v = load8(x + i);
      lanes = lanes > v ? lanes : v;
    }
    for (int l = 0; l < 8; ++l) m = std::max(m, lanes[l]);
  }
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

// The sum of x[0, n): eight running sums, then theirs and the tail's in
// order; a fixed order, so a row sums alike wherever it is computed.
float row_sum(const float* x, int64_t n) {
  Vec8 lanes = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) lanes += load8(x + i);
  float sum = 0.0f;
  for (int l = 0; l < 8; ++l) sum += lanes[l];
  for (; i < n; ++i) sum += x[i];
  return sum;
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
  // scale > 0 and rounding is monotone, so scale * max(p) is max(scale * p).
  const float tile_max = scale * row_max(p + c0, c1 - c0);
  const float new_max = std::max(row.max, tile_max);
  const float rescale = std::exp(row.max - new_max);  // 0 on the first visible tile
  if (rescale != 1.0f)
    for (int64_t e = 0; e < D; ++e) o[e] *= rescale;
  std::fill(p, p + c0, 0.0f);
  std::fill(p + c1, p + keys, 0.0f);
  for (int64_t c = c0; c < c1; ++c) p[c] = scale * p[c] - new_max;
  cpu::exp_inplace(p + c0, c1 - c0);
  row.sum = row.sum * rescale + row_sum(p + c0, c1 - c0);
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
// Tiles start at even keys (an earlier invisible key gets probability 0), so
// the bf16 path's key pairs line up with the tiles.
int64_t first_key_tile(int64_t i, int64_t window) {
  return first_visible_key(i - i % kQueryRows, window) & ~int64_t(1);
}

// Sixteen floats in one AVX-512 register (the x86-64-v4 version's),
// loaded through a reference: a by-value return would be an ABI that
// differs by ISA.
typedef float Vec16 __attribute__((vector_size(64)));
template <typename Vec>
[[gnu::always_inline]] inline void load_vec(Vec& v, const float* p) {
  std::memcpy(&v, p, sizeof(v));
}

// c[rows, cols] += a[rows, K] @ b[K, Cols], rows <= Rows, cols <= Cols: the
// Rows x Cols sums stay in registers of Vec while k runs (x86-64-v3: 4 x 16
// in eight AVX registers; x86-64-v4: 8 x 32 in sixteen AVX-512 ones). a_rows[r]
// is row r of a (rows past `rows` repeat one of them: computed and dropped)
// and all Cols columns of b are readable, so every element of every block,
// kept or not, is the same fused multiply-adds over k in order, then one
// addition to c: a row's results depend neither on which rows or columns
// share its block nor on the block's shape, so both versions give the same
// bits.
template <typename Vec, int Rows, int Cols>
[[gnu::always_inline]] inline void block_gemm(float* c, int64_t ldc, const float* const a_rows[Rows], const float* b,
                                              int64_t ldb, int64_t K, int64_t rows, int64_t cols) {
  constexpr int kLanes = sizeof(Vec) / sizeof(float), kVecs = Cols / kLanes;
  Vec acc[Rows][kVecs] = {};
  for (int64_t k = 0; k < K; ++k) {
    Vec bk[kVecs];
    for (int h = 0; h < kVecs; ++h) load_vec(bk[h], b + k * ldb + kLanes * h);
    for (int r = 0; r < Rows; ++r) {
      const float x = a_rows[r][k];
      for (int h = 0; h < kVecs; ++h) acc[r][h] += x * bk[h];
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    if (cols == Cols) {  // the same additions, a vector at a time
      for (int h = 0; h < kVecs; ++h) {
        Vec sum;
        load_vec(sum, c + r * ldc + kLanes * h);
        sum += acc[r][h];
        std::memcpy(c + r * ldc + kLanes * h, &sum, sizeof(sum));
      }
      continue;
    }
    float sums[Cols];
    std::memcpy(sums, acc[r], sizeof(sums));
    for (int64_t j = 0; j < cols; ++j) c[r * ldc + j] += sums[j];
  }
}

// c[M, N] += a[M, K] @ b[K, N], all row-major f32 with leading dimensions
// lda, ldb, ldc, in blocks of Rows x Cols (block_gemm). b's last columns,
// when fewer than Cols, are copied into a zero-padded strip first.
template <typename Vec, int Rows, int Cols>
[[gnu::always_inline]] inline void tile_gemm_blocks(float* c, int64_t ldc, const float* a, int64_t lda, const float* b,
                                                    int64_t ldb, int64_t M, int64_t N, int64_t K) {
  thread_local std::vector<float> strip;  // only grows
  for (int64_t n0 = 0; n0 < N; n0 += Cols) {
    const int64_t cols = std::min<int64_t>(Cols, N - n0);
    const float* b_block = b + n0;
    int64_t ld_block = ldb;
    if (cols < Cols) {
      if (int64_t(strip.size()) < K * Cols) strip.resize(size_t(K * Cols));
      for (int64_t k = 0; k < K; ++k)
        for (int64_t j = 0; j < Cols; ++j) strip[k * Cols + j] = j < cols ? b[k * ldb + n0 + j] : 0.0f;
      b_block = strip.data(), ld_block = Cols;
    }
    for (int64_t m0 = 0; m0 < M; m0 += Rows) {
      const int64_t rows = std::min<int64_t>(Rows, M - m0);
      const float* a_rows[Rows];
      for (int64_t r = 0; r < Rows; ++r) a_rows[r] = a + (m0 + (r < rows ? r : 0)) * lda;
      block_gemm<Vec, Rows, Cols>(c + m0 * ldc + n0, ldc, a_rows, b_block, ld_block, K, rows, cols);
    }
  }
}

// tile_gemm's two versions (kernels/cpu/isa.h): the blocks' shape follows
// the registers there are.
[[gnu::target("arch=x86-64-v4")]] void tile_gemm_avx512(float* c, int64_t ldc, const float* a, int64_t lda,
                                                        const float* b, int64_t ldb, int64_t M, int64_t N, int64_t K) {
  tile_gemm_blocks<Vec16, 8, 32>(c, ldc, a, lda, b, ldb, M, N, K);
}
void tile_gemm_built(float* c, int64_t ldc, const float* a, int64_t lda, const float* b, int64_t ldb, int64_t M,
                     int64_t N, int64_t K) {
  tile_gemm_blocks<Vec8, 4, 16>(c, ldc, a, lda, b, ldb, M, N, K);
}

void tile_gemm(float* c, int64_t ldc, const float* a, int64_t lda, const float* b, int64_t ldb, int64_t M,
               int64_t N, int64_t K) {
  if (cpu::avx512_enabled()) return tile_gemm_avx512(c, ldc, a, lda, b, ldb, M, N, K);
  tile_gemm_built(c, ldc, a, lda, b, ldb, M, N, K);
}

// dst[cols, rows] = src[rows, cols]^T (leading dimensions ld_dst, ld_src).
void transpose(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[j * ld_dst + i] = src[i * ld_src + j];
}

// ---- the tile products, in f32 or on bf16 pairs ----------------------------
// Each operand set gives the tiles' products to the loops below, for one
// sequence (or, in attention_cached, one row of keys):
//   scores(s, i0, rows, j0, keys):  s[rows, keys] += Q[i0:] K[j0:]^T (s kKeyCols apart)
//   add_pv(o, p, rows, j0, keys):   o[rows, D] += P V[j0:]
//   dp(s, i0, rows, j0, keys):      s += dO[i0:] V[j0:]^T
//   add_gradients(dq, dk, dv, p, ds, i0, rows, j0, keys): dQ += dS K, dK += dS^T Q, dV += P^T dO
// (dq at query i0, dk and dv at key j0).

// f32 operands: q, dout, k, v [T, D]; kt, vt [D, .] (rows ldk apart).
struct F32Operands {
  const float *q, *kt, *v, *dout, *vt, *k;
  int64_t ldk, D;

  void scores(float* s, int64_t i0, int64_t rows, int64_t j0, int64_t keys) const {
    tile_gemm(s, kKeyCols, q + i0 * D, D, kt + j0, ldk, rows, keys, D);
  }
  void add_pv(float* o, const float* p, int64_t rows, int64_t j0, int64_t keys) const {
    tile_gemm(o, D, p, kKeyCols, v + j0 * D, D, rows, D, keys);
  }
  void dp(float* s, int64_t i0, int64_t rows, int64_t j0, int64_t keys) const {
    tile_gemm(s, kKeyCols, dout + i0 * D, D, vt + j0, ldk, rows, keys, D);
  }
  void add_gradients(float* dq, float* dk, float* dv, const float* p, const float* ds, int64_t i0, int64_t rows,
                     int64_t j0, int64_t keys) const {
    float transposed[kKeyCols * kQueryRows];
    tile_gemm(dq, D, ds, kKeyCols, k + j0 * D, D, rows, D, keys);
    transpose(transposed, kQueryRows, ds, kKeyCols, rows, keys);
    tile_gemm(dk, D, transposed, kQueryRows, q + i0 * D, D, keys, D, rows);
    transpose(transposed, kQueryRows, p, kKeyCols, rows, keys);
    tile_gemm(dv, D, transposed, kQueryRows, dout + i0 * D, D, keys, D, rows);
  }
};

// bf16 pairs of a head row of D elements: D rounded up to even, halved.
int64_t head_pairs(int64_t D) { return (D + 1) / 2; }

// dst[r * ld_dst + p] = (x[r, 2p], x[r, 2p + 1]) rounded to bf16, for the
// rows of a tile x (kKeyCols apart).
void round_rows(uint32_t* dst, int64_t ld_dst, const float* x, int64_t rows, int64_t pairs) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t p = 0; p < pairs; ++p)
      dst[r * ld_dst + p] = cpu::bf16_pair(x[r * kKeyCols + 2 * p], x[r * kKeyCols + 2 * p + 1]);
}

// dst[c * ld_dst + p] = (x[2p, c], x[2p + 1, c]) rounded to bf16: a tile x
// (kKeyCols apart) transposed with its rows paired; an odd last row pairs
// with 0. The pairs are rounded along x's rows (contiguous, so the rounding
// vectorises) into an L1 buffer, then moved into place.
void round_columns(uint32_t* dst, int64_t ld_dst, const float* x, int64_t rows, int64_t cols) {
  uint32_t paired[kQueryRows / 2][kKeyCols];
  const int64_t row_pairs = (rows + 1) / 2;
  for (int64_t p = 0; p < row_pairs; ++p) {
    const float* even = x + 2 * p * kKeyCols;
    if (2 * p + 1 < rows)
      for (int64_t c = 0; c < cols; ++c) paired[p][c] = cpu::bf16_pair(even[c], even[kKeyCols + c]);
    else
      for (int64_t c = 0; c < cols; ++c) paired[p][c] = cpu::bf16_pair(even[c], 0.0f);
  }
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t p = 0; p < row_pairs; ++p) dst[c * ld_dst + p] = paired[p][c];
}

// bf16 operands (precision: bf16), products on bf16 pairs with f32 sums
// (bf16_tile.h: AMX or vdpbf16ps where the CPU has them), as FlashAttention
// runs them on a GPU: scores and dP sum exact products of the bf16 inputs in
// f32, the online softmax, lse and dS stay f32, and P and dS are rounded to
// bf16 only as operands of the products after them. Rows paired ([T, pairs]): q, dout;
// columns paired ([T / 2, D]): v_cols, k_cols, q_cols, dout_cols; kt, vt
// [pairs, .] (rows ldk apart).
struct Bf16Operands {
  const uint32_t *q, *kt, *v_cols, *dout, *vt, *k_cols, *q_cols, *dout_cols;
  int64_t ldk, D;

  void scores(float* s, int64_t i0, int64_t rows, int64_t j0, int64_t keys) const {
    const int64_t pairs = head_pairs(D);
    cpu::bf16_tile_gemm(s, kKeyCols, q + i0 * pairs, pairs, kt + j0, ldk, rows, keys, pairs);
  }
  void add_pv(float* o, const float* p, int64_t rows, int64_t j0, int64_t keys) const {
    uint32_t p_pairs[kQueryRows * kKeyCols / 2];
    round_rows(p_pairs, kKeyCols / 2, p, rows, (keys + 1) / 2);
    cpu::bf16_tile_gemm(o, D, p_pairs, kKeyCols / 2, v_cols + j0 / 2 * D, D, rows, D, (keys + 1) / 2);
  }
  void dp(float* s, int64_t i0, int64_t rows, int64_t j0, int64_t keys) const {
    const int64_t pairs = head_pairs(D);
    cpu::bf16_tile_gemm(s, kKeyCols, dout + i0 * pairs, pairs, vt + j0, ldk, rows, keys, pairs);
  }
  void add_gradients(float* dq, float* dk, float* dv, const float* p, const float* ds, int64_t i0, int64_t rows,
                     int64_t j0, int64_t keys) const {
    uint32_t pairs[kKeyCols * kQueryRows / 2];
    round_rows(pairs, kKeyCols / 2, ds, rows, (keys + 1) / 2);
    cpu::bf16_tile_gemm(dq, D, pairs, kKeyCols / 2, k_cols + j0 / 2 * D, D, rows, D, (keys + 1) / 2);
    round_columns(pairs, kQueryRows / 2, ds, rows, keys);
    cpu::bf16_tile_gemm(dk, D, pairs, kQueryRows / 2, q_cols + i0 / 2 * D, D, keys, D, (rows + 1) / 2);
    round_columns(pairs, kQueryRows / 2, p, rows, keys);
    cpu::bf16_tile_gemm(dv, D, pairs, kQueryRows / 2, dout_cols + i0 / 2 * D, D, keys, D, (rows + 1) / 2);
  }
};

// One sequence of T tokens of a (batch, query head): its out rows o [T, D]
// and lse from the operands x of the sequence.
template <typename Operands>
void forward_tiles(float* o, float* lse, const Operands& x, int64_t T, int64_t D, float scale, int64_t window) {
  float s[kQueryRows * kKeyCols];
  RowSoftmax rows_softmax[kQueryRows];
  for (int64_t i0 = 0; i0 < T; i0 += kQueryRows) {
    const int64_t rows = std::min(kQueryRows, T - i0);
    std::fill(o + i0 * D, o + (i0 + rows) * D, 0.0f);
    std::fill(rows_softmax, rows_softmax + rows, RowSoftmax{});
    for (int64_t j0 = first_key_tile(i0, window); j0 < i0 + rows; j0 += kKeyCols) {
      const int64_t keys = std::min(kKeyCols, i0 + rows - j0);
      std::fill(s, s + rows * kKeyCols, 0.0f);
      x.scores(s, i0, rows, j0, keys);
      for (int64_t r = 0; r < rows; ++r)
        softmax_tile_row(s + r * kKeyCols, o + (i0 + r) * D, rows_softmax[r], i0 + r, j0, keys, D, scale, window);
      x.add_pv(o + i0 * D, s, rows, j0, keys);
    }
    for (int64_t r = 0; r < rows; ++r) lse[i0 + r] = finish_row(o + (i0 + r) * D, rows_softmax[r], D);
  }
}

// A backward tile's scores p = Q K^T and dp = dO V^T [rows, keys] (rows
// kKeyCols apart) of the queries at i0 and keys at j0 become the
// probabilities P = exp(scale * p - lse) and dS = scale * P * (dP -
// rowsum(dO * O)), both 0 where a query does not see a key.
void tile_gradients(float* p, float* ds, const float* lse, const float* do_dot_o, int64_t i0, int64_t rows,
                    int64_t j0, int64_t keys, float scale, int64_t window) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;
    const VisibleKeys seen = visible_keys(i, j0, keys, window);
    float* p_row = p + r * kKeyCols;
    float* ds_row = ds + r * kKeyCols;
    const int64_t c0 = std::min(seen.c0, keys), c1 = std::max(seen.c1, c0);  // [c0, c1): the visible keys
    std::fill(p_row, p_row + c0, 0.0f);
    std::fill(p_row + c1, p_row + keys, 0.0f);
    for (int64_t c = c0; c < c1; ++c) p_row[c] = scale * p_row[c] - lse[i];
    cpu::exp_inplace(p_row + c0, c1 - c0);
    for (int64_t c = 0; c < keys; ++c) ds_row[c] = scale * p_row[c] * (ds_row[c] - do_dot_o[i]);
  }
}

// One sequence of T tokens of a (batch, query head): its contributions to dq
// (its own) and to dk, dv (its kv head's, shared with the other query heads
// of the group: one task owns them), all [T, D] f32.
template <typename Operands>
void backward_tiles(float* dq, float* dk, float* dv, const Operands& x, const float* lse, const float* do_dot_o,
                    int64_t T, int64_t D, float scale, int64_t window) {
  float p[kQueryRows * kKeyCols], ds[kQueryRows * kKeyCols];
  for (int64_t i0 = 0; i0 < T; i0 += kQueryRows) {
    const int64_t rows = std::min(kQueryRows, T - i0);
    for (int64_t j0 = first_key_tile(i0, window); j0 < i0 + rows; j0 += kKeyCols) {
      const int64_t keys = std::min(kKeyCols, i0 + rows - j0);
      std::fill(p, p + rows * kKeyCols, 0.0f);
      std::fill(ds, ds + rows * kKeyCols, 0.0f);
      x.scores(p, i0, rows, j0, keys);
      x.dp(ds, i0, rows, j0, keys);
      tile_gradients(p, ds, lse, do_dot_o, i0, rows, j0, keys, scale, window);
      x.add_gradients(dq + i0 * D, dk + j0 * D, dv + j0 * D, p, ds, i0, rows, j0, keys);
    }
  }
}

// do_dot_o[t] = rowsum(dO * O) of the T rows of D columns.
void row_dots(float* do_dot_o, const float* dout, const float* out, int64_t T, int64_t D) {
  for (int64_t t = 0; t < T; ++t) {
    float sum = 0.0f;
    for (int64_t e = 0; e < D; ++e) sum += dout[t * D + e] * out[t * D + e];
    do_dot_o[t] = sum;
  }
}

// ---- per (batch, head) tasks ----------------------------------------------

// Attention's scratch per thread: one kv head's K and V, the query head's
// operands and results, in f32 or bf16 pairs.
struct AttentionScratch {
  std::vector<float> k, v, kt, vt, q, o, dout, dq, dk, dv, do_dot_o;
  std::vector<uint32_t> k16, v16, kt16, vt16, q16, dout16, k_cols, v_cols, q_cols, dout_cols;
};
thread_local AttentionScratch tls;

// dst[rows, pairs] = x[b, :rows, h, :] (bf16) with rows paired; an odd D's
// last pair has a zero high half.
void gather_pairs(uint32_t* dst, const HeadsView& x, const AttentionShape& d, int64_t b, int64_t h, int64_t rows) {
  const int64_t pairs = head_pairs(d.head_dim);
  const uint16_t* src = x.rows.ptr<const uint16_t>();
  for (int64_t t = 0; t < rows; ++t) {
    dst[t * pairs + pairs - 1] = 0;
    std::memcpy(dst + t * pairs, src + head_offset(x, d.seq, b, t, h), size_t(d.head_dim) * sizeof(uint16_t));
  }
}

// x's rows paired down the columns ([ceil(T / 2), D]) in `buffer`.
const uint32_t* paired_columns(std::vector<uint32_t>& buffer, const uint32_t* x, int64_t T, int64_t D) {
  uint32_t* out = scratch(buffer, (T + 1) / 2 * D);
  cpu::pair_columns(out, D, x, head_pairs(D), T, D);
  return out;
}

// The leading dimension of a transposed head (K^T, V^T: [D, T] in f32 or
// [pairs, T] of bf16 pairs, 4-byte elements either way): T rounded up to 16
// elements (a 64-byte line), made an odd number of lines. A tile product
// walks 64 (or 32) of its rows at one column; rows a multiple of 4 KiB
// apart (T = 1,024) all fall in one L1 set and thrash its 8 ways, which
// halved the f32 tiles' speed at T = 1,024 (AVX2, EPYC); an odd number of
// lines apart they spread over every set.
int64_t transposed_ld(int64_t T) {
  const int64_t lines = (T + 15) / 16;
  return 16 * (lines % 2 ? lines : lines + 1);
}

// x (bf16 pairs [T, pairs]) transposed into `buffer` ([pairs, T], rows
// transposed_ld(T) apart).
const uint32_t* transposed_pairs(std::vector<uint32_t>& buffer, const uint32_t* x, int64_t T, int64_t D) {
  uint32_t* out = scratch(buffer, transposed_ld(T) * head_pairs(D));
  cpu::transpose_pairs(out, transposed_ld(T), x, head_pairs(D), T, head_pairs(D));
  return out;
}

// x (f32 [T, D]) transposed into `buffer` ([D, T], rows transposed_ld(T) apart).
float* transposed_rows(std::vector<float>& buffer, const float* x, int64_t T, int64_t D) {
  float* out = scratch(buffer, transposed_ld(T) * D);
  transpose(out, transposed_ld(T), x, D, T, D);
  return out;
}

using Sequences = std::vector<std::pair<int64_t, int64_t>>;

// The sequences of each row as [first, end) token ranges within the row:
// cu_seqlens' (checked here: the host reads it), or the whole row.
std::vector<Sequences> row_sequences(const char* op, const Tensor* cu_seqlens, int64_t B, int64_t T) {
  std::vector<Sequences> rows(static_cast<size_t>(B));
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

// Whether every operand is bf16: the bf16 path (mixed dtypes run in f32).
bool all_bf16(std::initializer_list<DType> dtypes) {
  return std::all_of(dtypes.begin(), dtypes.end(), [](DType t) { return t == DType::bf16; });
}

// What one attention call's tasks share.
struct AttentionCall {
  const HeadsView &q, &k, &v;
  AttentionShape d;
  float scale;
  int64_t window;
};

// Forward of (batch b, query head h): o [T, D] and lse_row [T].
void forward_f32(float* o, float* lse_row, const AttentionCall& c, const Sequences& sequences, int64_t b, int64_t h) {
  AttentionScratch& s = tls;
  const int64_t T = c.d.seq, D = c.d.head_dim, hk = h / (c.d.q_heads / c.d.kv_heads);
  float *q = scratch(s.q, T * D), *k = scratch(s.k, T * D), *v = scratch(s.v, T * D);
  gather_head(q, c.q, c.d, b, h);
  gather_head(k, c.k, c.d, b, hk);
  gather_head(v, c.v, c.d, b, hk);
  const float* kt = transposed_rows(s.kt, k, T, D);
  for (const auto& [t0, t1] : sequences) {
    const F32Operands x{q + t0 * D, kt + t0, v + t0 * D, nullptr, nullptr, nullptr, transposed_ld(T), D};
    forward_tiles(o + t0 * D, lse_row + t0, x, t1 - t0, D, c.scale, c.window);
  }
}

void forward_bf16(float* o, float* lse_row, const AttentionCall& c, const Sequences& sequences, int64_t b,
                  int64_t h) {
  AttentionScratch& s = tls;
  const cpu::Bf16TileScope tiles;  // on AMX: one tile configuration for this head's products
  const int64_t T = c.d.seq, D = c.d.head_dim, pairs = head_pairs(D), hk = h / (c.d.q_heads / c.d.kv_heads);
  uint32_t *q = scratch(s.q16, T * pairs), *k = scratch(s.k16, T * pairs), *v = scratch(s.v16, T * pairs);
  gather_pairs(q, c.q, c.d, b, h, T);
  gather_pairs(k, c.k, c.d, b, hk, T);
  gather_pairs(v, c.v, c.d, b, hk, T);
  const uint32_t* kt = transposed_pairs(s.kt16, k, T, D);
  for (const auto& [t0, t1] : sequences) {
    const uint32_t* v_cols = paired_columns(s.v_cols, v + t0 * pairs, t1 - t0, D);
    const Bf16Operands x{q + t0 * pairs, kt + t0, v_cols, nullptr, nullptr, nullptr, nullptr, nullptr,
                         transposed_ld(T), D};
    forward_tiles(o + t0 * D, lse_row + t0, x, t1 - t0, D, c.scale, c.window);
  }
}

// What a backward task adds to the forward's call.
struct BackwardCall {
  const AttentionCall& forward;
  const HeadsView &dq, &dk, &dv;
  const Tensor &dout, &out;
  const float* lse;
};

// The rows of dO and O of (batch b, query head h) as f32 in s.dout and s.o,
// and their row dots in s.do_dot_o.
void gather_row_dots(const BackwardCall& c, int64_t b, int64_t h) {
  AttentionScratch& s = tls;
  const AttentionShape& d = c.forward.d;
  float *dout = scratch(s.dout, d.seq * d.head_dim), *out = scratch(s.o, d.seq * d.head_dim);
  gather_head(dout, c.dout, d, b, h);
  gather_head(out, c.out, d, b, h);
  row_dots(scratch(s.do_dot_o, d.seq), dout, out, d.seq, d.head_dim);
}

// Backward of (batch b, kv head hk) in f32: dq of its query heads, dk and dv.
void backward_f32(const BackwardCall& c, const Sequences& sequences, int64_t b, int64_t hk) {
  AttentionScratch& s = tls;
  const AttentionShape& d = c.forward.d;
  const int64_t T = d.seq, D = d.head_dim, group = d.q_heads / d.kv_heads;
  float *k = scratch(s.k, T * D), *v = scratch(s.v, T * D);
  float *dk = scratch(s.dk, T * D), *dv = scratch(s.dv, T * D), *q = scratch(s.q, T * D), *dq = scratch(s.dq, T * D);
  gather_head(k, c.forward.k, d, b, hk);
  gather_head(v, c.forward.v, d, b, hk);
  const float *kt = transposed_rows(s.kt, k, T, D), *vt = transposed_rows(s.vt, v, T, D);
  std::fill(dk, dk + T * D, 0.0f);
  std::fill(dv, dv + T * D, 0.0f);
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    gather_head(q, c.forward.q, d, b, h);
    gather_row_dots(c, b, h);
    std::fill(dq, dq + T * D, 0.0f);
    const float* lse = c.lse + (b * d.q_heads + h) * T;
    for (const auto& [t0, t1] : sequences) {
      const F32Operands x{q + t0 * D, kt + t0, nullptr, s.dout.data() + t0 * D, vt + t0, k + t0 * D,
                          transposed_ld(T), D};
      backward_tiles(dq + t0 * D, dk + t0 * D, dv + t0 * D, x, lse + t0, s.do_dot_o.data() + t0, t1 - t0, D,
                     c.forward.scale, c.forward.window);
    }
    scatter_head(c.dq, dq, d, b, h);
  }
  scatter_head(c.dk, dk, d, b, hk);
  scatter_head(c.dv, dv, d, b, hk);
}

// backward_f32 on bf16 pairs.
void backward_bf16(const BackwardCall& c, const Sequences& sequences, int64_t b, int64_t hk) {
  AttentionScratch& s = tls;
  const cpu::Bf16TileScope tiles;  // on AMX: one tile configuration for this head's products
  const AttentionShape& d = c.forward.d;
  const int64_t T = d.seq, D = d.head_dim, pairs = head_pairs(D), group = d.q_heads / d.kv_heads;
  uint32_t *k = scratch(s.k16, T * pairs), *v = scratch(s.v16, T * pairs);
  uint32_t *q = scratch(s.q16, T * pairs), *dout = scratch(s.dout16, T * pairs);
  float *dk = scratch(s.dk, T * D), *dv = scratch(s.dv, T * D), *dq = scratch(s.dq, T * D);
  gather_pairs(k, c.forward.k, d, b, hk, T);
  gather_pairs(v, c.forward.v, d, b, hk, T);
  const uint32_t *kt = transposed_pairs(s.kt16, k, T, D), *vt = transposed_pairs(s.vt16, v, T, D);
  std::fill(dk, dk + T * D, 0.0f);
  std::fill(dv, dv + T * D, 0.0f);
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    gather_pairs(q, c.forward.q, d, b, h, T);
    gather_pairs(dout, c.dout, d, b, h, T);
    gather_row_dots(c, b, h);
    std::fill(dq, dq + T * D, 0.0f);
    const float* lse = c.lse + (b * d.q_heads + h) * T;
    for (const auto& [t0, t1] : sequences) {
      const int64_t L = t1 - t0;
      const Bf16Operands x{q + t0 * pairs, kt + t0, nullptr, dout + t0 * pairs, vt + t0,
                           paired_columns(s.k_cols, k + t0 * pairs, L, D), paired_columns(s.q_cols, q + t0 * pairs, L, D),
                           paired_columns(s.dout_cols, dout + t0 * pairs, L, D), transposed_ld(T), D};
      backward_tiles(dq + t0 * D, dk + t0 * D, dv + t0 * D, x, lse + t0, s.do_dot_o.data() + t0, L, D,
                     c.forward.scale, c.forward.window);
    }
    scatter_head(c.dq, dq, d, b, h);
  }
  scatter_head(c.dk, dk, d, b, hk);
  scatter_head(c.dv, dv, d, b, hk);
}

// attention_cached's rows of one (batch, query head): query row t of q sees
// the keys of position row_positions[t] through the operands x (keys from 0),
// one row at a time through forward_tiles' own products and softmax.
template <typename Operands>
void cached_rows(float* o, const Operands& x, const int32_t* row_positions, int64_t Tq, int64_t D, float scale,
                 int64_t window) {
  float p[kKeyCols];
  for (int64_t t = 0; t < Tq; ++t) {
    const int64_t i = row_positions[t];
    float* row = o + t * D;
    std::fill(row, row + D, 0.0f);
    RowSoftmax softmax;
    for (int64_t j0 = first_key_tile(i, window); j0 <= i; j0 += kKeyCols) {
      const int64_t tile_keys = std::min(kKeyCols, i + 1 - j0);
      std::fill(p, p + kKeyCols, 0.0f);
      x.scores(p, t, 1, j0, tile_keys);
      softmax_tile_row(p, row, softmax, i, j0, tile_keys, D, scale, window);
      x.add_pv(row, p, 1, j0, tile_keys);
    }
    finish_row(row, softmax, D);
  }
}

// The ISA the tiles run on, for the op profile: the bf16 tiles' (AMX,
// vdpbf16ps, or the portable loop's build ISA); f32 tiles in their AVX-512
// version where enabled.
const char* tiles_isa(bool bf16) { return bf16 ? cpu::bf16_tiles_isa() : cpu::avx512_versions_isa(); }

}  // namespace

void CpuBackend::attention_forward_impl(Tensor& out, Tensor& lse, const HeadsView& q, const HeadsView& k,
                                        const HeadsView& v, float scale, int64_t window,
                                        const Tensor* cu_seqlens) {
  const AttentionCall call{q, k, v, checks::attention_shape(q, k), scale, window};
  const AttentionShape& d = call.d;
  const bool bf16 = all_bf16({q.dtype(), k.dtype(), v.dtype()});
  const auto sequences = row_sequences("attention_forward", cu_seqlens, d.batch, d.seq);
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.q_heads; ++h) {
      float* o = scratch(tls.o, d.seq * d.head_dim);
      float* lse_row = lse.ptr<float>() + (b * d.q_heads + h) * d.seq;
      if (bf16)
        forward_bf16(o, lse_row, call, sequences[size_t(b)], b, h);
      else
        forward_f32(o, lse_row, call, sequences[size_t(b)], b, h);
      scatter_head(out, o, d, b, h);
    }
  note_path(bf16 ? "bf16 tiles " : "f32 tiles ", tiles_isa(bf16));
}

// One task per (batch, kv head): it owns dk and dv for that kv head and loops
// over the query heads that share it, so no two threads add into the same row.
void CpuBackend::attention_backward_impl(const HeadsView& dq, const HeadsView& dk, const HeadsView& dv,
                                         const Tensor& dout, const HeadsView& q, const HeadsView& k,
                                         const HeadsView& v, const Tensor& out, const Tensor& lse, float scale,
                                         int64_t window, const Tensor* cu_seqlens) {
  const AttentionCall forward{q, k, v, checks::attention_shape(q, k), scale, window};
  const BackwardCall call{forward, dq, dk, dv, dout, out, lse.ptr<const float>()};
  const AttentionShape& d = forward.d;
  const bool bf16 = all_bf16({q.dtype(), k.dtype(), v.dtype(), dout.dtype});
  const auto sequences = row_sequences("attention_backward", cu_seqlens, d.batch, d.seq);
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t hk = 0; hk < d.kv_heads; ++hk) {
      if (bf16)
        backward_bf16(call, sequences[size_t(b)], b, hk);
      else
        backward_f32(call, sequences[size_t(b)], b, hk);
    }
  note_path(bf16 ? "bf16 tiles " : "f32 tiles ", tiles_isa(bf16));
}

// One task per (batch, query head): its kv head's cached keys and values up
// to the row's last query position are gathered once, then each query row
// meets the key tiles attention_forward gives it, through the same products
// and softmax (cached_rows): its row of attention_forward, bit for bit.
void CpuBackend::attention_cached_impl(Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                       const Tensor& positions, float scale, int64_t window) {
  const int64_t B = q.dim(0), Tq = q.dim(1), Hq = q.dim(2), D = q.dim(3), S = k_cache.dim(1);
  const int64_t group = Hq / k_cache.dim(2), pairs = head_pairs(D);
  const int32_t* position = positions.ptr<const int32_t>();
  for (int64_t n = 0; n < B * Tq; ++n)
    FT_CHECK(position[n] >= 0 && position[n] < S, "attention_cached: position ", position[n], " of query ", n,
             " is outside the cache's ", S, " slots");
  const AttentionShape queries{B, Tq, Hq, k_cache.dim(2), D}, cache{B, S, Hq, k_cache.dim(2), D};
  const bool bf16 = all_bf16({q.dtype, k_cache.dtype, v_cache.dtype});
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      AttentionScratch& s = tls;
      const int32_t* row_positions = position + b * Tq;
      const int64_t keys = *std::max_element(row_positions, row_positions + Tq) + 1;
      float* o = scratch(s.o, Tq * D);
      if (bf16) {
        const cpu::Bf16TileScope tiles;
        uint32_t *qh = scratch(s.q16, Tq * pairs), *kh = scratch(s.k16, keys * pairs), *vh = scratch(s.v16, keys * pairs);
        gather_pairs(qh, q, queries, b, h, Tq);
        gather_pairs(kh, k_cache, cache, b, h / group, keys);
        gather_pairs(vh, v_cache, cache, b, h / group, keys);
        const Bf16Operands x{qh, transposed_pairs(s.kt16, kh, keys, D), paired_columns(s.v_cols, vh, keys, D),
                             nullptr, nullptr, nullptr, nullptr, nullptr, transposed_ld(keys), D};
        cached_rows(o, x, row_positions, Tq, D, scale, window);
      } else {
        float *qh = scratch(s.q, Tq * D), *kh = scratch(s.k, keys * D), *vh = scratch(s.v, keys * D);
        gather_rows(qh, q, queries, b, h, Tq);
        gather_rows(kh, k_cache, cache, b, h / group, keys);
        gather_rows(vh, v_cache, cache, b, h / group, keys);
        const float* kt = transposed_rows(s.kt, kh, keys, D);
        cached_rows(o, F32Operands{qh, kt, vh, nullptr, nullptr, nullptr, transposed_ld(keys), D}, row_positions, Tq, D,
                    scale, window);
      }
      scatter_head(out, o, queries, b, h);
    }
  note_path(bf16 ? "bf16 tiles " : "f32 tiles ", tiles_isa(bf16));
}

}  // namespace ft
