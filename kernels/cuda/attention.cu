// Causal grouped-query attention, FlashAttention style: tiles of queries and
// keys staged in shared memory, f32 accumulation, and no [T, T] matrix in
// memory. These are the f32 FMA kernels, for f32 and mixed operands; bf16
// q, k and v go to the tensor-core kernels of attention_tc.cu. A sliding
// window (attention.h) masks scores and skips the key tiles wholly outside it;
// so do packed sequences (cu_seqlens): a query sees only keys of its own
// sequence, and tiles wholly outside a tile's sequences are skipped.
// Same math as the CPU reference (kernels/cpu/attention.cpp):
//   forward:  S = scale * Q K^T (causal), O = softmax(S) V, lse = logsumexp(S)
//   backward: P = exp(S - lse), Di = rowsum(dO * O), dP = dO V^T,
//             dS = P * (dP - Di), dV = P^T dO, dK = scale * dS^T Q, dQ = scale * dS K.
// With a sliding window W > 0, key j is visible to query i iff i - W < j <= i:
// scores outside are masked, and key tiles wholly below every query's window
// (query tiles wholly past every key's window, in dK/dV) are skipped. With
// packed sequences key j is visible to query i only within i's sequence too:
// each block finds where its rows' sequences start (attention.h's
// sequence_of) once, keeps them beside the row statistics in shared memory,
// starts its key loop at its first row's sequence start (dK/dV: ends its query
// loop at its last key's sequence end) and masks per score within the tiles
// that span several sequences.
//
// Kernels (all deterministic: every output element is written by exactly one
// thread, which sums its terms in a fixed order; no atomics):
//   - forward: one block per (query tile, query head, batch). It keeps its Q
//     tile in shared memory and walks the key tiles up to the diagonal,
//     staging K, then V, in one shared buffer, with an online softmax (running
//     row max m and sum l, in f32): O <- O * exp(m_old - m_new) + P V.
//   - backward, three launches: Di = rowsum(dO * O) (one warp per row); dK/dV,
//     one block per (key tile, kv head, batch) that loops over every query head
//     sharing the kv head and every query tile at or after the diagonal; dQ,
//     one block per (query tile, query head, batch) that loops over the key
//     tiles up to the diagonal. Both recompute P from lse rather than storing
//     it: that keeps memory at O(T) and makes dK/dV and dQ independent, so
//     neither needs atomics.
//
// Products are plain f32 FMA loops over register micro-tiles (no tensor
// cores): every thread owns a fixed set of (row, column) outputs. Operands are
// converted to f32 when staged, so q, k, v, out and dout may each be f32 or
// bf16 (as on the CPU). Shared-memory rows are padded to D + 1 floats so the
// threads of a warp reading different rows at the same d hit different banks.
//
// Tile sizes depend on head_dim: D is bucketed to 64, 128 or 256 (Llama 128,
// GPT-NeoX-20B 96, Pythia 256), and each bucket's tiles keep dynamic shared
// memory under the default 48 KiB limit at the bucket's largest D, so no
// cudaFuncSetAttribute opt-in is needed and two or more blocks fit per SM:
//   forward  (Br x Bc, threads): 64x32/128, 32x32/128, 16x16/128 -> 33.1, 36.6, 33.3 KiB
//   backward (Br x Bc, threads): 32x32/128, 16x16/128,   8x8/64  -> 41.1, 34.6, 32.8 KiB
// (the backward kernels stage four [tile, D] operands: Q, dO, K, V).
#include <cmath>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"

namespace ft {
namespace {

constexpr int kMaxHeadDim = 256;

using Dims = cuda::AttentionDims;
using cuda::HeadRows;
using cuda::head_rows;
using cuda::first_key_tile;
using cuda::key_visible;

// Forward tiles per head_dim bucket: Br query rows, Bc key rows, a TM x TN
// micro-tile of S per thread. Threads split into row groups of G = Bc / TN
// consecutive threads: row group g owns query rows g*TM .. g*TM+TM-1; thread
// c of the group owns key columns c, c + G, ... of S and output columns
// c, c + G, ... of O (so O lives in TM x kMaxD/G registers).
template <int kMaxD>
struct FwdTile;
template <>
struct FwdTile<64> {
  static constexpr int kThreads = 128, kBr = 64, kBc = 32, kTM = 4, kTN = 4;
};
template <>
struct FwdTile<128> {
  static constexpr int kThreads = 128, kBr = 32, kBc = 32, kTM = 4, kTN = 2;
};
template <>
struct FwdTile<256> {
  static constexpr int kThreads = 128, kBr = 16, kBc = 16, kTM = 2, kTN = 1;
};

// Backward tiles, same micro-tile scheme for S and dP. The dK/dV kernel's
// accumulators are [Bc, D]: row group g owns key rows g*TK .. g*TK+TK-1 with
// TK = Bc / (threads / G), and columns c, c + G, ... as above.
template <int kMaxD>
struct BwdTile;
template <>
struct BwdTile<64> {
  static constexpr int kThreads = 128, kBr = 32, kBc = 32, kTM = 4, kTN = 2;
};
template <>
struct BwdTile<128> {
  static constexpr int kThreads = 128, kBr = 16, kBc = 16, kTM = 2, kTN = 1;
};
template <>
struct BwdTile<256> {
  static constexpr int kThreads = 64, kBr = 8, kBc = 8, kTM = 1, kTN = 1;
};

// Shared-memory floats of each kernel for a runtime head_dim (rows padded to
// D + 1); the last kBr hold each query row's sequence start (int, as wide as a float).
template <int kMaxD>
constexpr int64_t forward_smem_floats(int64_t D) {
  using C = FwdTile<kMaxD>;
  return C::kBr * (D + 1) + C::kBc * (D + 1) + C::kBr * (C::kBc + 1) + 2 * C::kBr;
}
template <int kMaxD>
constexpr int64_t backward_smem_floats(int64_t D) {
  using C = BwdTile<kMaxD>;
  return 2 * C::kBr * (D + 1) + 2 * C::kBc * (D + 1) + 2 * C::kBr * (C::kBc + 1) + 3 * C::kBr;
}
static_assert(sizeof(int) == sizeof(float));
static_assert(forward_smem_floats<64>(64) * 4 <= 48 * 1024 && forward_smem_floats<128>(128) * 4 <= 48 * 1024 &&
              forward_smem_floats<256>(256) * 4 <= 48 * 1024);
static_assert(backward_smem_floats<64>(64) * 4 <= 48 * 1024 && backward_smem_floats<128>(128) * 4 <= 48 * 1024 &&
              backward_smem_floats<256>(256) * 4 <= 48 * 1024);

// dst[r, d] (row stride ld) = x[b, row0 + r, h, d] as f32 for r < rows, d < D;
// rows at or past the sequence end are zero, so products over them stay finite.
// base is the offset of x[b, 0, h, 0], stride the offset between tokens (head_rows).
template <int kThreads>
__device__ inline void load_tile(float* dst, int ld, cuda::ConstView x, int64_t base, int64_t stride, int row0,
                                 int rows, int seq, int D) {
  for (int i = threadIdx.x; i < rows * D; i += kThreads) {
    int r = i / D, d = i - r * D, row = row0 + r;
    dst[r * ld + d] = row < seq ? cuda::load(x, base + int64_t(row) * stride + d) : 0.0f;
  }
}

template <int kMaxD>
__global__ void __launch_bounds__(FwdTile<kMaxD>::kThreads)
    attention_forward_kernel(cuda::View out, float* lse, cuda::ConstView q, cuda::ConstView k, cuda::ConstView v,
                             float scale, Dims dims) {
  using C = FwdTile<kMaxD>;
  constexpr int kThreads = C::kThreads, kBr = C::kBr, kBc = C::kBc, kTM = C::kTM, kTN = C::kTN;
  constexpr int kG = kBc / kTN, kDC = kMaxD / kG, kLdS = kBc + 1;
  static_assert(kBc % kTN == 0 && kThreads % kG == 0 && kThreads / kG * kTM == kBr && kMaxD % kG == 0);
  const int T = dims.seq, D = dims.head_dim, ld = D + 1, tid = threadIdx.x;
  // Later query tiles see more keys: launch them first so the tail of the grid is short.
  const int q0 = int(gridDim.x - 1 - blockIdx.x) * kBr;
  const int h = blockIdx.y, b = blockIdx.z;
  const HeadRows q_rows = head_rows(dims.q_pitch, dims.q_heads, T, b, h);
  const HeadRows out_rows = head_rows(D, dims.q_heads, T, b, h);
  const HeadRows k_rows = head_rows(dims.k_pitch, dims.kv_heads, T, b, h / dims.group);
  const HeadRows v_rows = head_rows(dims.v_pitch, dims.kv_heads, T, b, h / dims.group);

  FT_DYNAMIC_SHARED(float, smem);
  float* q_s = smem;                   // [Br, ld]
  float* kv_s = q_s + kBr * ld;        // [Bc, ld]: K, then V, of the current key tile
  float* s_s = kv_s + kBc * ld;        // [Br, Bc + 1]: scores, then probabilities
  float* row_scale = s_s + kBr * kLdS;  // [Br]: exp(m_old - m_new), at the end 1 / l
  int* first_key_s = reinterpret_cast<int*>(row_scale + kBr);  // [Br]: where each row's sequence starts

  load_tile<kThreads>(q_s, ld, q, q_rows.base, q_rows.stride, q0, kBr, T, D);
  for (int r = tid; r < kBr; r += kThreads) first_key_s[r] = q0 + r < T ? cuda::sequence_of(dims, b, q0 + r).start : 0;
  const int rg = tid / kG, tc = tid % kG;
  float o[kTM][kDC] = {};
  // Running max and sum of row `tid` (threads tid < Br keep the row statistics).
  float m = -INFINITY, l = 0.0f;
  const int q_end = q0 + kBr < T ? q0 + kBr : T;
  const int key_tiles = (q_end - 1) / kBc + 1;  // up to the diagonal
  const int first_tile = first_key_tile(q0, cuda::sequence_of(dims, b, q0).start, kBc, dims.window);
  for (int kt = first_tile; kt < key_tiles; ++kt) {
    const int k0 = kt * kBc;
    load_tile<kThreads>(kv_s, ld, k, k_rows.base, k_rows.stride, k0, kBc, T, D);
    __syncthreads();
    float s[kTM][kTN] = {};
    for (int d = 0; d < D; ++d) {
      float qr[kTM], kr[kTN];
      FT_UNROLL
      for (int i = 0; i < kTM; ++i) qr[i] = q_s[(rg * kTM + i) * ld + d];
      FT_UNROLL
      for (int j = 0; j < kTN; ++j) kr[j] = kv_s[(tc + j * kG) * ld + d];
      FT_UNROLL
      for (int i = 0; i < kTM; ++i)
        FT_UNROLL
        for (int j = 0; j < kTN; ++j) s[i][j] = fmaf(qr[i], kr[j], s[i][j]);
    }
    FT_UNROLL
    for (int i = 0; i < kTM; ++i)
      FT_UNROLL
      for (int j = 0; j < kTN; ++j) {
        int r = rg * kTM + i, c = tc + j * kG;
        s_s[r * kLdS + c] = key_visible(q0 + r, k0 + c, first_key_s[r], dims.window) ? scale * s[i][j] : -INFINITY;
      }
    __syncthreads();
    // K is consumed: stage V while the row owners update the softmax statistics.
    // A row may see no key yet (a sliding window or its sequence starts past
    // this tile for it): then m_new is -inf, and exponents taken against 0
    // instead give p = 0 and alpha = 0 rather than NaN.
    if (tid < kBr) {
      float* row = s_s + tid * kLdS;
      float m_new = m;
      for (int c = 0; c < kBc; ++c) m_new = fmaxf(m_new, row[c]);
      const float m_ref = m_new == -INFINITY ? 0.0f : m_new;
      float sum = 0.0f;
      for (int c = 0; c < kBc; ++c) {
        float p = expf(row[c] - m_ref);
        row[c] = p;
        sum += p;
      }
      float alpha = expf(m - m_ref);
      l = l * alpha + sum;
      m = m_new;
      row_scale[tid] = alpha;
    }
    load_tile<kThreads>(kv_s, ld, v, v_rows.base, v_rows.stride, k0, kBc, T, D);
    __syncthreads();
    FT_UNROLL
    for (int i = 0; i < kTM; ++i) {
      float alpha = row_scale[rg * kTM + i];
      FT_UNROLL
      for (int j = 0; j < kDC; ++j) o[i][j] *= alpha;
    }
    for (int c = 0; c < kBc; ++c) {
      float p[kTM];
      FT_UNROLL
      for (int i = 0; i < kTM; ++i) p[i] = s_s[(rg * kTM + i) * kLdS + c];
      FT_UNROLL
      for (int j = 0; j < kDC; ++j) {
        int d = tc + j * kG;
        if (d >= D) continue;
        float vd = kv_s[c * ld + d];
        FT_UNROLL
        for (int i = 0; i < kTM; ++i) o[i][j] = fmaf(p[i], vd, o[i][j]);
      }
    }
    __syncthreads();  // before the next tile overwrites kv_s, s_s and row_scale
  }
  if (tid < kBr) {
    if (q0 + tid < T) lse[(int64_t(b) * dims.q_heads + h) * T + q0 + tid] = m + logf(l);
    row_scale[tid] = 1.0f / l;
  }
  __syncthreads();
  FT_UNROLL
  for (int i = 0; i < kTM; ++i) {
    int r = rg * kTM + i;
    if (q0 + r >= T) continue;
    float inv_l = row_scale[r];
    FT_UNROLL
    for (int j = 0; j < kDC; ++j) {
      int d = tc + j * kG;
      if (d >= D) continue;
      cuda::store(out, out_rows.base + int64_t(q0 + r) * out_rows.stride + d, o[i][j] * inv_l);
    }
  }
}

// di[b, h, t] = sum_d dout[b, t, h, d] * out[b, t, h, d]: one warp per (b, t, h) row.
constexpr int kDiThreads = 128;
__global__ void __launch_bounds__(kDiThreads)
    attention_di_kernel(float* di, cuda::ConstView dout, cuda::ConstView out, int64_t rows, Dims dims) {
  const int64_t row = int64_t(blockIdx.x) * (kDiThreads / 32) + threadIdx.x / 32;
  if (row >= rows) return;  // whole warps leave together
  const int lane = threadIdx.x % 32, D = dims.head_dim;
  float sum = 0.0f;
  for (int d = lane; d < D; d += 32) sum += cuda::load(dout, row * D + d) * cuda::load(out, row * D + d);
  sum = cuda::warp_sum(sum);
  if (lane == 0) {
    int64_t h = row % dims.q_heads, bt = row / dims.q_heads, t = bt % dims.seq, b = bt / dims.seq;
    di[(b * dims.q_heads + h) * dims.seq + t] = sum;
  }
}

// The S and dP micro-tiles of the backward kernels, for query tile q0 and key
// tile k0 staged in q_s/do_s and k_s/v_s; writes P (if p_s) and dS to shared
// memory. P = 0 where the key is hidden from the query or the query is past the end.
template <class C>
__device__ inline void backward_scores(float* p_s, float* ds_s, const float* q_s, const float* do_s,
                                       const float* k_s, const float* v_s, const float* lse_s, const float* di_s,
                                       const int* first_key_s, int q0, int k0, int T, int D, int window,
                                       float scale) {
  constexpr int kTM = C::kTM, kTN = C::kTN, kG = C::kBc / kTN, kLdS = C::kBc + 1;
  const int ld = D + 1, rg = threadIdx.x / kG, tc = threadIdx.x % kG;
  float s[kTM][kTN] = {}, dp[kTM][kTN] = {};
  for (int d = 0; d < D; ++d) {
    float qr[kTM], dor[kTM], kr[kTN], vr[kTN];
    FT_UNROLL
    for (int i = 0; i < kTM; ++i) {
      qr[i] = q_s[(rg * kTM + i) * ld + d];
      dor[i] = do_s[(rg * kTM + i) * ld + d];
    }
    FT_UNROLL
    for (int j = 0; j < kTN; ++j) {
      kr[j] = k_s[(tc + j * kG) * ld + d];
      vr[j] = v_s[(tc + j * kG) * ld + d];
    }
    FT_UNROLL
    for (int i = 0; i < kTM; ++i)
      FT_UNROLL
      for (int j = 0; j < kTN; ++j) {
        s[i][j] = fmaf(qr[i], kr[j], s[i][j]);
        dp[i][j] = fmaf(dor[i], vr[j], dp[i][j]);
      }
  }
  FT_UNROLL
  for (int i = 0; i < kTM; ++i)
    FT_UNROLL
    for (int j = 0; j < kTN; ++j) {
      int r = rg * kTM + i, c = tc + j * kG, query = q0 + r;
      float p = query >= T || !key_visible(query, k0 + c, first_key_s[r], window)
                    ? 0.0f
                    : expf(scale * s[i][j] - lse_s[r]);
      if (p_s) p_s[r * kLdS + c] = p;
      ds_s[r * kLdS + c] = p * (dp[i][j] - di_s[r]);
    }
}

// lse, Di and the sequence start of query rows q0 .. q0 + Br - 1 of head h
// in batch row b (0 past the end).
template <int kThreads, int kBr>
__device__ inline void load_row_stats(float* lse_s, float* di_s, int* first_key_s, const float* lse,
                                      const float* di, const Dims& dims, int b, int h, int q0) {
  const int T = dims.seq;
  const int64_t base = (int64_t(b) * dims.q_heads + h) * T;
  for (int r = threadIdx.x; r < kBr; r += kThreads) {
    bool valid = q0 + r < T;
    lse_s[r] = valid ? lse[base + q0 + r] : 0.0f;
    di_s[r] = valid ? di[base + q0 + r] : 0.0f;
    first_key_s[r] = valid ? cuda::sequence_of(dims, b, q0 + r).start : 0;
  }
}

template <int kMaxD>
__global__ void __launch_bounds__(BwdTile<kMaxD>::kThreads)
    attention_dkv_kernel(cuda::View dk, cuda::View dv, cuda::ConstView q, cuda::ConstView k, cuda::ConstView v,
                         cuda::ConstView dout, const float* lse, const float* di, float scale, Dims dims) {
  using C = BwdTile<kMaxD>;
  constexpr int kThreads = C::kThreads, kBr = C::kBr, kBc = C::kBc, kTN = C::kTN;
  constexpr int kG = kBc / kTN, kDC = kMaxD / kG, kTK = kBc / (kThreads / kG), kLdS = kBc + 1;
  static_assert(kThreads / kG * C::kTM == kBr && kThreads / kG * kTK == kBc && kMaxD % kG == 0);
  const int T = dims.seq, D = dims.head_dim, ld = D + 1, tid = threadIdx.x;
  const int k0 = blockIdx.x * kBc, hk = blockIdx.y, b = blockIdx.z;
  const HeadRows k_rows = head_rows(dims.k_pitch, dims.kv_heads, T, b, hk);
  const HeadRows v_rows = head_rows(dims.v_pitch, dims.kv_heads, T, b, hk);

  FT_DYNAMIC_SHARED(float, smem);
  float* k_s = smem;               // [Bc, ld]
  float* v_s = k_s + kBc * ld;     // [Bc, ld]
  float* q_s = v_s + kBc * ld;     // [Br, ld]
  float* do_s = q_s + kBr * ld;    // [Br, ld]
  float* p_s = do_s + kBr * ld;    // [Br, Bc + 1]
  float* ds_s = p_s + kBr * kLdS;  // [Br, Bc + 1]
  float* lse_s = ds_s + kBr * kLdS;  // [Br]
  float* di_s = lse_s + kBr;         // [Br]
  int* first_key_s = reinterpret_cast<int*>(di_s + kBr);  // [Br]

  load_tile<kThreads>(k_s, ld, k, k_rows.base, k_rows.stride, k0, kBc, T, D);
  load_tile<kThreads>(v_s, ld, v, v_rows.base, v_rows.stride, k0, kBc, T, D);
  const int kg = tid / kG, tc = tid % kG;  // key rows kg*TK + i, columns tc + j*G
  float dk_acc[kTK][kDC] = {}, dv_acc[kTK][kDC] = {};
  const int last_key = (k0 + kBc < T ? k0 + kBc : T) - 1;
  const int q_tiles = cuda::end_query_tile(k0, kBc, kBr, dims.window, cuda::sequence_of(dims, b, last_key).end);
  for (int h = hk * dims.group; h < (hk + 1) * dims.group; ++h) {
    const HeadRows q_rows = head_rows(dims.q_pitch, dims.q_heads, T, b, h);
    const HeadRows do_rows = head_rows(D, dims.q_heads, T, b, h);
    // Query tiles from the diagonal to the window's or the last key's sequence's end.
    for (int qt = k0 / kBr; qt < q_tiles; ++qt) {
      const int q0 = qt * kBr;
      load_tile<kThreads>(q_s, ld, q, q_rows.base, q_rows.stride, q0, kBr, T, D);
      load_tile<kThreads>(do_s, ld, dout, do_rows.base, do_rows.stride, q0, kBr, T, D);
      load_row_stats<kThreads, kBr>(lse_s, di_s, first_key_s, lse, di, dims, b, h, q0);
      __syncthreads();
      backward_scores<C>(p_s, ds_s, q_s, do_s, k_s, v_s, lse_s, di_s, first_key_s, q0, k0, T, D, dims.window,
                         scale);
      __syncthreads();
      // dV += P^T dO, dK += dS^T Q (scale applied once at the end).
      for (int r = 0; r < kBr; ++r) {
        float p[kTK], ds[kTK];
        FT_UNROLL
        for (int i = 0; i < kTK; ++i) {
          p[i] = p_s[r * kLdS + kg * kTK + i];
          ds[i] = ds_s[r * kLdS + kg * kTK + i];
        }
        FT_UNROLL
        for (int j = 0; j < kDC; ++j) {
          int d = tc + j * kG;
          if (d >= D) continue;
          float qd = q_s[r * ld + d], dod = do_s[r * ld + d];
          FT_UNROLL
          for (int i = 0; i < kTK; ++i) {
            dv_acc[i][j] = fmaf(p[i], dod, dv_acc[i][j]);
            dk_acc[i][j] = fmaf(ds[i], qd, dk_acc[i][j]);
          }
        }
      }
      __syncthreads();  // before the next tile overwrites q_s, do_s, p_s, ds_s
    }
  }
  const HeadRows dk_rows = head_rows(dims.dk_pitch, dims.kv_heads, T, b, hk);
  const HeadRows dv_rows = head_rows(dims.dv_pitch, dims.kv_heads, T, b, hk);
  FT_UNROLL
  for (int i = 0; i < kTK; ++i) {
    int key = k0 + kg * kTK + i;
    if (key >= T) continue;
    FT_UNROLL
    for (int j = 0; j < kDC; ++j) {
      int d = tc + j * kG;
      if (d >= D) continue;
      cuda::store(dk, dk_rows.base + int64_t(key) * dk_rows.stride + d, scale * dk_acc[i][j]);
      cuda::store(dv, dv_rows.base + int64_t(key) * dv_rows.stride + d, dv_acc[i][j]);
    }
  }
}

template <int kMaxD>
__global__ void __launch_bounds__(BwdTile<kMaxD>::kThreads)
    attention_dq_kernel(cuda::View dq, cuda::ConstView q, cuda::ConstView k, cuda::ConstView v,
                        cuda::ConstView dout, const float* lse, const float* di, float scale, Dims dims) {
  using C = BwdTile<kMaxD>;
  constexpr int kThreads = C::kThreads, kBr = C::kBr, kBc = C::kBc, kTM = C::kTM;
  constexpr int kG = kBc / C::kTN, kDC = kMaxD / kG, kLdS = kBc + 1;
  const int T = dims.seq, D = dims.head_dim, ld = D + 1, tid = threadIdx.x;
  const int q0 = int(gridDim.x - 1 - blockIdx.x) * kBr;  // heavy tiles first, as in the forward
  const int h = blockIdx.y, b = blockIdx.z;
  const HeadRows q_rows = head_rows(dims.q_pitch, dims.q_heads, T, b, h);
  const HeadRows do_rows = head_rows(D, dims.q_heads, T, b, h);
  const HeadRows k_rows = head_rows(dims.k_pitch, dims.kv_heads, T, b, h / dims.group);
  const HeadRows v_rows = head_rows(dims.v_pitch, dims.kv_heads, T, b, h / dims.group);

  FT_DYNAMIC_SHARED(float, smem);  // same layout as the dK/dV kernel; p_s unused
  float* k_s = smem;
  float* v_s = k_s + kBc * ld;
  float* q_s = v_s + kBc * ld;
  float* do_s = q_s + kBr * ld;
  float* ds_s = do_s + kBr * ld + kBr * kLdS;
  float* lse_s = ds_s + kBr * kLdS;
  float* di_s = lse_s + kBr;
  int* first_key_s = reinterpret_cast<int*>(di_s + kBr);

  load_tile<kThreads>(q_s, ld, q, q_rows.base, q_rows.stride, q0, kBr, T, D);
  load_tile<kThreads>(do_s, ld, dout, do_rows.base, do_rows.stride, q0, kBr, T, D);
  load_row_stats<kThreads, kBr>(lse_s, di_s, first_key_s, lse, di, dims, b, h, q0);
  const int rg = tid / kG, tc = tid % kG;  // query rows rg*TM + i, columns tc + j*G
  float dq_acc[kTM][kDC] = {};
  const int q_end = q0 + kBr < T ? q0 + kBr : T;
  const int key_tiles = (q_end - 1) / kBc + 1;
  const int first_tile = first_key_tile(q0, cuda::sequence_of(dims, b, q0).start, kBc, dims.window);
  for (int kt = first_tile; kt < key_tiles; ++kt) {
    const int k0 = kt * kBc;
    load_tile<kThreads>(k_s, ld, k, k_rows.base, k_rows.stride, k0, kBc, T, D);
    load_tile<kThreads>(v_s, ld, v, v_rows.base, v_rows.stride, k0, kBc, T, D);
    __syncthreads();
    backward_scores<C>(nullptr, ds_s, q_s, do_s, k_s, v_s, lse_s, di_s, first_key_s, q0, k0, T, D, dims.window,
                       scale);
    __syncthreads();
    // dQ += dS K (scale applied once at the end).
    for (int c = 0; c < kBc; ++c) {
      float ds[kTM];
      FT_UNROLL
      for (int i = 0; i < kTM; ++i) ds[i] = ds_s[(rg * kTM + i) * kLdS + c];
      FT_UNROLL
      for (int j = 0; j < kDC; ++j) {
        int d = tc + j * kG;
        if (d >= D) continue;
        float kd = k_s[c * ld + d];
        FT_UNROLL
        for (int i = 0; i < kTM; ++i) dq_acc[i][j] = fmaf(ds[i], kd, dq_acc[i][j]);
      }
    }
    __syncthreads();  // before the next tile overwrites k_s, v_s, ds_s
  }
  const HeadRows dq_rows = head_rows(dims.dq_pitch, dims.q_heads, T, b, h);
  FT_UNROLL
  for (int i = 0; i < kTM; ++i) {
    int row = q0 + rg * kTM + i;
    if (row >= T) continue;
    FT_UNROLL
    for (int j = 0; j < kDC; ++j) {
      int d = tc + j * kG;
      if (d >= D) continue;
      cuda::store(dq, dq_rows.base + int64_t(row) * dq_rows.stride + d, scale * dq_acc[i][j]);
    }
  }
}

// The kernels' limits on the contract's shapes (checked by Backend), with
// the inputs' pitches (the gradients', 0 here, are the backward's to set) and
// the packed sequences' offsets, if any.
Dims launch_dims(const char* op, const HeadsView& q, const HeadsView& k, const HeadsView& v, int64_t sliding_window,
                 const Tensor* cu_seqlens, int64_t& batch) {
  const checks::AttentionShape s = checks::attention_shape(q, k);
  const int64_t B = s.batch, T = s.seq, Hq = s.q_heads, Hkv = s.kv_heads, D = s.head_dim;
  FT_CHECK(D <= kMaxHeadDim, op, ": head_dim ", D, " exceeds the supported ", kMaxHeadDim);
  FT_CHECK(B <= 65535 && Hq <= 65535 && T < (int64_t(1) << 30), op, ": ", shape_string(q.shape()),
           " exceeds the kernels' grid");
  batch = B;
  // A window of T or more hides nothing beyond the causal mask.
  int window = sliding_window > 0 && sliding_window < T ? int(sliding_window) : 0;
  const int32_t* offsets = cu_seqlens ? cu_seqlens->ptr<const int32_t>() : nullptr;
  const int64_t offsets_count = cu_seqlens ? cu_seqlens->numel() : 0;
  return Dims{int(T), int(Hq), int(Hkv), int(D), int(Hq / Hkv), window, q.pitch(), k.pitch(), v.pitch(), 0, 0, 0,
              offsets, offsets_count};
}

template <int kMaxD>
void launch_forward(Tensor& out, Tensor& lse, const HeadsView& q, const HeadsView& k, const HeadsView& v,
                    float scale, const Dims& dims, int64_t batch, cudaStream_t stream) {
  using C = FwdTile<kMaxD>;
  dim3 grid(unsigned((dims.seq + C::kBr - 1) / C::kBr), unsigned(dims.q_heads), unsigned(batch));
  size_t smem = size_t(forward_smem_floats<kMaxD>(dims.head_dim)) * sizeof(float);
  launch<attention_forward_kernel<kMaxD>>(grid, C::kThreads, smem, stream, cuda::view(out), lse.ptr<float>(),
                                          cuda::const_view(q), cuda::const_view(k), cuda::const_view(v), scale,
                                          dims);
  FT_CUDA_CHECK_LAUNCH();
}

template <int kMaxD>
void launch_backward(const HeadsView& dq, const HeadsView& dk, const HeadsView& dv, const Tensor& dout,
                     const HeadsView& q, const HeadsView& k, const HeadsView& v, const Tensor& lse, const float* di,
                     float scale, const Dims& dims, int64_t batch, cudaStream_t stream) {
  using C = BwdTile<kMaxD>;
  size_t smem = size_t(backward_smem_floats<kMaxD>(dims.head_dim)) * sizeof(float);
  dim3 kv_grid(unsigned((dims.seq + C::kBc - 1) / C::kBc), unsigned(dims.kv_heads), unsigned(batch));
  launch<attention_dkv_kernel<kMaxD>>(kv_grid, C::kThreads, smem, stream, cuda::view(dk), cuda::view(dv),
                                      cuda::const_view(q), cuda::const_view(k), cuda::const_view(v),
                                      cuda::const_view(dout), lse.ptr<const float>(), di, scale, dims);
  FT_CUDA_CHECK_LAUNCH();
  dim3 q_grid(unsigned((dims.seq + C::kBr - 1) / C::kBr), unsigned(dims.q_heads), unsigned(batch));
  launch<attention_dq_kernel<kMaxD>>(q_grid, C::kThreads, smem, stream, cuda::view(dq), cuda::const_view(q),
                                     cuda::const_view(k), cuda::const_view(v), cuda::const_view(dout),
                                     lse.ptr<const float>(), di, scale, dims);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void CudaBackend::attention_forward_impl(Tensor& out, Tensor& lse, const HeadsView& q, const HeadsView& k,
                                         const HeadsView& v, float scale, int64_t sliding_window,
                                         const Tensor* cu_seqlens) {
  // cuDNN SDPA serves plain causal attention over whole rows; a sliding window
  // or packed sequences (the engine is given no offsets) run on our kernels.
  if (sliding_window == 0 && !cu_seqlens && attention_ && attention_->forward(out, lse, q, k, v, scale, stream_))
    return;
  int64_t batch = 0;
  Dims dims = launch_dims("attention_forward", q, k, v, sliding_window, cu_seqlens, batch);
  if (batch == 0 || dims.seq == 0 || dims.q_heads == 0) return;
  if (cuda::attention_uses_tensor_cores(q, k, v))
    cuda::attention_forward_tc(out, lse, q, k, v, scale, dims, batch, stream_);
  else if (dims.head_dim <= 64) launch_forward<64>(out, lse, q, k, v, scale, dims, batch, stream_);
  else if (dims.head_dim <= 128) launch_forward<128>(out, lse, q, k, v, scale, dims, batch, stream_);
  else launch_forward<256>(out, lse, q, k, v, scale, dims, batch, stream_);
}

void CudaBackend::attention_backward_impl(const HeadsView& dq, const HeadsView& dk, const HeadsView& dv,
                                          const Tensor& dout, const HeadsView& q, const HeadsView& k,
                                          const HeadsView& v, const Tensor& out, const Tensor& lse, float scale,
                                          int64_t sliding_window, const Tensor* cu_seqlens) {
  if (sliding_window == 0 && !cu_seqlens && attention_ &&
      attention_->backward(dq, dk, dv, dout, q, k, v, out, lse, scale, stream_))
    return;  // cuDNN SDPA, as in the forward
  int64_t batch = 0;
  Dims dims = launch_dims("attention_backward", q, k, v, sliding_window, cu_seqlens, batch);
  dims.dq_pitch = dq.pitch();
  dims.dk_pitch = dk.pitch();
  dims.dv_pitch = dv.pitch();
  if (batch == 0 || dims.seq == 0 || dims.q_heads == 0) return;
  // Di = rowsum(dO * O) once per query row, read by the gradient kernels.
  int64_t rows = batch * dims.seq * dims.q_heads;
  const cuda::AttentionBackwardScratch sizes = cuda::attention_backward_scratch(q, k, v);
  Tensor di = scratch(sizes.di);
  constexpr int kRowsPerBlock = kDiThreads / 32;
  launch<attention_di_kernel>(unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock), kDiThreads, 0, stream_,
                              di.ptr<float>(), cuda::const_view(dout), cuda::const_view(out), rows, dims);
  FT_CUDA_CHECK_LAUNCH();
  const float* di_ptr = di.ptr<const float>();
  if (sizes.dq_accum) {
    Tensor dq_accum = scratch(*sizes.dq_accum);
    cuda::attention_backward_tc(dq, dk, dv, dout, q, k, v, lse, di_ptr, dq_accum.ptr<float>(), scale, dims, batch,
                                stream_);
  } else if (dims.head_dim <= 64) {
    launch_backward<64>(dq, dk, dv, dout, q, k, v, lse, di_ptr, scale, dims, batch, stream_);
  } else if (dims.head_dim <= 128) {
    launch_backward<128>(dq, dk, dv, dout, q, k, v, lse, di_ptr, scale, dims, batch, stream_);
  } else {
    launch_backward<256>(dq, dk, dv, dout, q, k, v, lse, di_ptr, scale, dims, batch, stream_);
  }
}

}  // namespace ft
