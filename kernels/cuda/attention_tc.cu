// Causal grouped-query attention on tensor cores for bf16 q, k and v:
// FlashAttention-2's structure on nvcuda::wmma 16x16x16 fragments (bf16
// inputs, f32 accumulators). Same math, mask (sliding window, packed
// sequences: attention.h) and tile skipping as attention.cu and the CPU reference:
//   forward:  S = scale * Q K^T (masked), O = softmax(S) V, lse = logsumexp(S)
//   backward: P = exp(S - lse), Di = rowsum(dO * O) (attention.cu, first),
//             dP = dO V^T, dS = P * (dP - Di), dV = P^T dO, dK = scale * dS^T Q,
//             dQ = scale * dS K.
//
// Forward: one block of 4 warps per (64-query tile, query head, batch); each
// warp owns 16 query rows and keeps their Q fragments in registers. K and V
// tiles of Bc keys stream through shared memory; per key tile a warp computes
// its [16, Bc] scores with mma into its own shared buffer, updates the online
// softmax (running max m and sum l per row, f32: two lanes per row), writes P
// as bf16 and adds P V into O. O lives in registers in a fixed layout (lane l:
// row l / 2, columns (l % 2) * 8 .. +8 of every 16-column chunk) because wmma
// accumulators have an opaque layout and the online softmax must rescale O's
// rows: each P V chunk goes through the warp's shared buffer into O.
//
// Backward: one block per (Bc-key tile, kv head, batch) that walks every query
// head of its group and every query tile from the diagonal to the window's
// end, computing S and dP once per (query tile, key tile) pair: dK and dV
// accumulate in wmma fragments spread over the warps, dQ is added with f32
// atomics into an f32 workspace (one add per element per block), which a
// last kernel scales into dq. Atomics make dq's rounding depend on the order
// in which blocks finish on a GPU (not under the emulator, whose blocks run in
// order); dk and dv are deterministic.
//
// Rounding beyond the f32 path: P (forward and backward) and dS are rounded
// to bf16 to enter the tensor cores, as in FlashAttention-2; products and
// sums are f32.
//
// Fragment pointers into dynamic shared memory are 256-bit aligned given the
// window's base alignment (these kernels declare no static __shared__, so the
// dynamic buffer starts at the base); every offset is a multiple of 32 bytes.
//
// Tiles (head_dim padded to a multiple of 16, zero-filled, so 80 and 96 run
// as they are; shared rows padded by 8 bf16 so the 16 rows a fragment load
// reads start on different banks). Dynamic shared memory stays under the
// default 48 KiB at each bucket's largest head_dim, so no opt-in is needed:
//   forward  Br x Bc: 64x64 (D <= 64), 64x32 (<= 128), 64x32 (<= 256): 44.0, 31.0, 47.0 KiB
//   backward Br x Bc: 32x32, 16x32, 16x16: 36.4, 36.7, 41.2 KiB
// The backward stages four operand tiles (Q, dO, K, V), so its tiles are
// smaller. Registers: O takes D / 2 floats per lane and the Q fragments D / 4,
// so at head_dim 256 the forward uses all 255 registers and spills ~100 bytes
// (nvcc -Xptxas -v, sm_80); the other kernels fit without spills.
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"

namespace ft::cuda {
namespace {

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;
using AccFrag = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
template <class Layout>
using AFrag = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, Layout>;
template <class Layout>
using BFrag = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, Layout>;

constexpr int kWarps = 4, kThreads = kWarps * 32;
constexpr int kRowPad = 8;             // bf16 elements appended to each operand tile row
constexpr int kFloatPad = 4;           // floats appended to each f32 score row
constexpr int kFwdBr = kWarps * 16;    // forward: 16 query rows per warp

__host__ __device__ constexpr int padded_head_dim(int D) { return (D + 15) / 16 * 16; }

template <int kMaxD>
struct TcForwardTile;
template <>
struct TcForwardTile<64> {
  static constexpr int kBc = 64;
};
template <>
struct TcForwardTile<128> {
  static constexpr int kBc = 32;
};
template <>
struct TcForwardTile<256> {
  static constexpr int kBc = 32;
};

template <int kMaxD>
struct TcBackwardTile;
template <>
struct TcBackwardTile<64> {
  static constexpr int kBr = 32, kBc = 32;
};
template <>
struct TcBackwardTile<128> {
  static constexpr int kBr = 16, kBc = 32;
};
template <>
struct TcBackwardTile<256> {
  static constexpr int kBr = 16, kBc = 16;
};

// Forward: the Q tile at the start, then K and V tiles and each warp's
// [16, Bc] f32 scores and bf16 probabilities in the same bytes.
template <int kMaxD>
constexpr int64_t tc_forward_smem_bytes(int D) {
  constexpr int64_t kBc = TcForwardTile<kMaxD>::kBc;
  const int64_t ld = padded_head_dim(D) + kRowPad;
  const int64_t q_bytes = kFwdBr * ld * 2;
  const int64_t loop_bytes = 2 * kBc * ld * 2 + kFwdBr * (kBc + kFloatPad) * 4 + kFwdBr * (kBc + kRowPad) * 2;
  return q_bytes > loop_bytes ? q_bytes : loop_bytes;
}
// Backward: K, V, Q, dO tiles; S and dP (f32); P and dS (bf16); lse, Di and
// the query rows' sequence starts (int); one [16, 16] f32 tile per warp for
// fragments on their way out.
template <int kMaxD>
constexpr int64_t tc_backward_smem_bytes(int D) {
  constexpr int64_t kBr = TcBackwardTile<kMaxD>::kBr, kBc = TcBackwardTile<kMaxD>::kBc;
  const int64_t ld = padded_head_dim(D) + kRowPad;
  return 2 * kBc * ld * 2 + 2 * kBr * ld * 2 + 2 * kBr * (kBc + kFloatPad) * 4 + 2 * kBr * (kBc + kRowPad) * 2 +
         kWarps * 256 * 4 + 3 * kBr * 4;
}
static_assert(tc_forward_smem_bytes<64>(64) <= 48 * 1024 && tc_forward_smem_bytes<128>(128) <= 48 * 1024 &&
              tc_forward_smem_bytes<256>(256) <= 48 * 1024);
static_assert(tc_backward_smem_bytes<64>(64) <= 48 * 1024 && tc_backward_smem_bytes<128>(128) <= 48 * 1024 &&
              tc_backward_smem_bytes<256>(256) <= 48 * 1024);

// dst[r, d] (row stride ld) = x[b, row0 + r, h, d] for r < rows, d < Dp;
// rows past the sequence end and columns past D are zero, so they add
// nothing to any product. base is the offset of x[b, 0, h, 0], stride the
// offset between tokens (head_rows). Reads through f32: bf16 sources convert
// exactly, and dout may be f32.
__device__ inline void stage_tile(bf16* dst, int ld, ConstView x, int64_t base, int64_t stride, int row0, int rows,
                                  int seq, int D, int Dp) {
  for (int i = threadIdx.x; i < rows * Dp; i += kThreads) {
    int r = i / Dp, d = i - r * Dp, row = row0 + r;
    dst[r * ld + d] = __float2bfloat16(row < seq && d < D ? load(x, base + int64_t(row) * stride + d) : 0.0f);
  }
}

template <int kMaxD>
__global__ void __launch_bounds__(kThreads)
    attention_forward_tc_kernel(View out, float* lse, ConstView q, ConstView k, ConstView v, float scale,
                                AttentionDims dims) {
  constexpr int kBr = kFwdBr, kBc = TcForwardTile<kMaxD>::kBc, kChunks = kMaxD / 16;
  constexpr int kLdS = kBc + kFloatPad, kLdP = kBc + kRowPad;
  const int T = dims.seq, D = dims.head_dim, Dp = padded_head_dim(D), ld = Dp + kRowPad, chunks = Dp / 16;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Later query tiles see more keys: launch them first so the tail of the grid is short.
  const int q0 = int(gridDim.x - 1 - blockIdx.x) * kBr, h = blockIdx.y, b = blockIdx.z;
  const HeadRows q_rows = head_rows(dims.q_pitch, dims.q_heads, T, b, h);
  const HeadRows out_rows = head_rows(D, dims.q_heads, T, b, h);
  const HeadRows k_rows = head_rows(dims.k_pitch, dims.kv_heads, T, b, h / dims.group);
  const HeadRows v_rows = head_rows(dims.v_pitch, dims.kv_heads, T, b, h / dims.group);

  FT_DYNAMIC_SHARED(bf16, smem);
  bf16* q_s = smem;                 // [Br, ld], before the key loop only
  bf16* k_s = smem;                 // [Bc, ld]
  bf16* v_s = k_s + kBc * ld;       // [Bc, ld]
  float* s_s = reinterpret_cast<float*>(v_s + kBc * ld) + warp * 16 * kLdS;  // this warp's [16, Bc + pad]
  bf16* p_s = reinterpret_cast<bf16*>(reinterpret_cast<float*>(v_s + kBc * ld) + kBr * kLdS) + warp * 16 * kLdP;

  stage_tile(q_s, ld, q, q_rows.base, q_rows.stride, q0, kBr, T, D, Dp);
  __syncthreads();
  AFrag<wmma::row_major> q_frag[kChunks];
  FT_UNROLL
  for (int c = 0; c < kChunks; ++c)
    if (c < chunks) wmma::load_matrix_sync(q_frag[c], q_s + warp * 16 * ld + c * 16, ld);

  // Lanes 2r and 2r + 1 hold row r of the warp: its softmax statistics (each
  // over half the key columns) and O's columns (l % 2) * 8 .. +8 of each chunk.
  // first_key: where the row's sequence starts (searched once, kept in a register).
  const int row = lane / 2, half = lane % 2, query = q0 + warp * 16 + row;
  const int first_key = query < T ? sequence_of(dims, b, query).start : 0;
  float o[kChunks][8] = {};
  float m = -INFINITY, l = 0.0f;
  const int q_end = q0 + kBr < T ? q0 + kBr : T;
  const int key_tiles = (q_end - 1) / kBc + 1;  // up to the diagonal
  const int first_tile = first_key_tile(q0, sequence_of(dims, b, q0).start, kBc, dims.window);
  for (int kt = first_tile; kt < key_tiles; ++kt) {
    const int k0 = kt * kBc;
    __syncthreads();  // the Q fragments, or the previous tile's K and V, are read
    stage_tile(k_s, ld, k, k_rows.base, k_rows.stride, k0, kBc, T, D, Dp);
    stage_tile(v_s, ld, v, v_rows.base, v_rows.stride, k0, kBc, T, D, Dp);
    __syncthreads();
    for (int n = 0; n < kBc / 16; ++n) {
      AccFrag acc;
      wmma::fill_fragment(acc, 0.0f);
      FT_UNROLL
      for (int c = 0; c < kChunks; ++c) {
        if (c < chunks) {
          BFrag<wmma::col_major> k_frag;  // K^T: column j of the fragment is key row j
          wmma::load_matrix_sync(k_frag, k_s + n * 16 * ld + c * 16, ld);
          wmma::mma_sync(acc, q_frag[c], k_frag, acc);
        }
      }
      wmma::store_matrix_sync(s_s + n * 16, acc, kLdS, wmma::mem_row_major);
    }
    __syncwarp();
    // A row may see no key of this tile yet (a sliding window or its
    // sequence starting past it): m_new is then -inf, and exponents taken
    // against 0 give p = 0 and alpha = 0 rather than NaN.
    float tile_max = -INFINITY;
    for (int j = half * kBc / 2; j < (half + 1) * kBc / 2; ++j)
      if (key_visible(query, k0 + j, first_key, dims.window)) tile_max = fmaxf(tile_max, scale * s_s[row * kLdS + j]);
    const float m_new = fmaxf(m, fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1)));
    const float m_ref = m_new == -INFINITY ? 0.0f : m_new;
    float sum = 0.0f;
    for (int j = half * kBc / 2; j < (half + 1) * kBc / 2; ++j) {
      float p = key_visible(query, k0 + j, first_key, dims.window) ? expf(scale * s_s[row * kLdS + j] - m_ref)
                                                                    : 0.0f;
      p_s[row * kLdP + j] = __float2bfloat16(p);
      sum += p;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    const float alpha = expf(m - m_ref);
    l = l * alpha + sum;
    m = m_new;
    FT_UNROLL
    for (int c = 0; c < kChunks; ++c)
      FT_UNROLL
      for (int e = 0; e < 8; ++e) o[c][e] *= alpha;
    __syncwarp();
    // O += P V, one 16-column chunk at a time through the warp's score buffer.
    FT_UNROLL
    for (int c = 0; c < kChunks; ++c) {
      if (c < chunks) {
        AccFrag acc;
        wmma::fill_fragment(acc, 0.0f);
        for (int n = 0; n < kBc / 16; ++n) {
          AFrag<wmma::row_major> p_frag;
          BFrag<wmma::row_major> v_frag;
          wmma::load_matrix_sync(p_frag, p_s + n * 16, kLdP);
          wmma::load_matrix_sync(v_frag, v_s + n * 16 * ld + c * 16, ld);
          wmma::mma_sync(acc, p_frag, v_frag, acc);
        }
        wmma::store_matrix_sync(s_s, acc, kLdS, wmma::mem_row_major);
        __syncwarp();
        FT_UNROLL
        for (int e = 0; e < 8; ++e) o[c][e] += s_s[row * kLdS + half * 8 + e];
        __syncwarp();
      }
    }
  }
  if (query >= T) return;  // no collectives follow
  if (half == 0) lse[(int64_t(b) * dims.q_heads + h) * T + query] = m + logf(l);
  const float inv_l = 1.0f / l;
  FT_UNROLL
  for (int c = 0; c < kChunks; ++c)
    FT_UNROLL
    for (int e = 0; e < 8; ++e) {
      int d = c * 16 + half * 8 + e;
      if (d < D) store(out, out_rows.base + int64_t(query) * out_rows.stride + d, o[c][e] * inv_l);
    }
}

// Writes a warp's [16, 16] f32 tile, staged in tile_s, to rows row0.. and
// columns col0.. of x (row stride `stride`, from `base`), times `factor`;
// rows at or past `rows_end` and columns at or past D are left out.
__device__ inline void write_tile(View x, int64_t base, int64_t stride, int row0, int rows_end, int col0, int D,
                                  const float* tile_s, float factor) {
  const int lane = threadIdx.x % 32, r = lane / 2, c0 = lane % 2 * 8;
  if (row0 + r >= rows_end) return;
  for (int e = 0; e < 8; ++e)
    if (col0 + c0 + e < D)
      store(x, base + int64_t(row0 + r) * stride + col0 + c0 + e, factor * tile_s[r * 16 + c0 + e]);
}

template <int kMaxD>
__global__ void __launch_bounds__(kThreads)
    attention_backward_tc_kernel(View dk, View dv, float* dq_accum, ConstView q, ConstView k, ConstView v,
                                 ConstView dout, const float* lse, const float* di, float scale,
                                 AttentionDims dims) {
  using C = TcBackwardTile<kMaxD>;
  constexpr int kBr = C::kBr, kBc = C::kBc, kLdS = kBc + kFloatPad, kLdP = kBc + kRowPad;
  constexpr int kScoreTiles = kBr / 16 * (kBc / 16);
  constexpr int kKvPerWarp = (kBc / 16 * (kMaxD / 16) + kWarps - 1) / kWarps;
  const int T = dims.seq, D = dims.head_dim, Dp = padded_head_dim(D), ld = Dp + kRowPad, chunks = Dp / 16;
  const int warp = threadIdx.x / 32;
  const int k0 = blockIdx.x * kBc, hk = blockIdx.y, b = blockIdx.z;
  const HeadRows k_rows = head_rows(dims.k_pitch, dims.kv_heads, T, b, hk);
  const HeadRows v_rows = head_rows(dims.v_pitch, dims.kv_heads, T, b, hk);

  FT_DYNAMIC_SHARED(bf16, smem);
  bf16* k_s = smem;                 // [Bc, ld]
  bf16* v_s = k_s + kBc * ld;       // [Bc, ld]
  bf16* q_s = v_s + kBc * ld;       // [Br, ld]
  bf16* do_s = q_s + kBr * ld;      // [Br, ld]
  float* s_s = reinterpret_cast<float*>(do_s + kBr * ld);  // [Br, Bc + pad]
  float* dp_s = s_s + kBr * kLdS;                           // [Br, Bc + pad]
  float* tile_s = dp_s + kBr * kLdS + warp * 256;           // this warp's [16, 16]
  float* lse_s = dp_s + kBr * kLdS + kWarps * 256;          // [Br]
  float* di_s = lse_s + kBr;                                // [Br]
  int* first_key_s = reinterpret_cast<int*>(di_s + kBr);    // [Br]: where each query row's sequence starts
  bf16* p_s = reinterpret_cast<bf16*>(first_key_s + kBr);   // [Br, Bc + pad]
  bf16* ds_s = p_s + kBr * kLdP;                            // [Br, Bc + pad]

  stage_tile(k_s, ld, k, k_rows.base, k_rows.stride, k0, kBc, T, D, Dp);
  stage_tile(v_s, ld, v, v_rows.base, v_rows.stride, k0, kBc, T, D, Dp);
  // dK and dV tiles [16 keys, 16 columns]: warp w owns tiles w, w + 4, ...
  const int kv_tiles = kBc / 16 * chunks;
  AccFrag dk_acc[kKvPerWarp], dv_acc[kKvPerWarp];
  FT_UNROLL
  for (int i = 0; i < kKvPerWarp; ++i) {
    wmma::fill_fragment(dk_acc[i], 0.0f);
    wmma::fill_fragment(dv_acc[i], 0.0f);
  }
  const int last_key = (k0 + kBc < T ? k0 + kBc : T) - 1;
  const int q_tiles = end_query_tile(k0, kBc, kBr, dims.window, sequence_of(dims, b, last_key).end);
  for (int h = hk * dims.group; h < (hk + 1) * dims.group; ++h) {
    // dout and the dQ workspace are contiguous [B, T, Hq, D].
    const HeadRows q_rows = head_rows(dims.q_pitch, dims.q_heads, T, b, h);
    const HeadRows d_rows = head_rows(D, dims.q_heads, T, b, h);
    const int64_t row_base = (int64_t(b) * dims.q_heads + h) * T;
    // Query tiles from the diagonal to the window's or the last key's sequence's end.
    for (int qt = k0 / kBr; qt < q_tiles; ++qt) {
      const int q0 = qt * kBr;
      __syncthreads();  // the previous pair's tiles are read
      stage_tile(q_s, ld, q, q_rows.base, q_rows.stride, q0, kBr, T, D, Dp);
      stage_tile(do_s, ld, dout, d_rows.base, d_rows.stride, q0, kBr, T, D, Dp);
      for (int r = threadIdx.x; r < kBr; r += kThreads) {
        bool valid = q0 + r < T;
        lse_s[r] = valid ? lse[row_base + q0 + r] : 0.0f;
        di_s[r] = valid ? di[row_base + q0 + r] : 0.0f;
        first_key_s[r] = valid ? sequence_of(dims, b, q0 + r).start : 0;
      }
      __syncthreads();
      // S = Q K^T and dP = dO V^T, [16, 16] tiles spread over the warps.
      for (int t = warp; t < kScoreTiles; t += kWarps) {
        const int r = t / (kBc / 16), n = t % (kBc / 16);
        AccFrag s_acc, dp_acc;
        wmma::fill_fragment(s_acc, 0.0f);
        wmma::fill_fragment(dp_acc, 0.0f);
        for (int c = 0; c < chunks; ++c) {
          AFrag<wmma::row_major> a;
          BFrag<wmma::col_major> bt;
          wmma::load_matrix_sync(a, q_s + r * 16 * ld + c * 16, ld);
          wmma::load_matrix_sync(bt, k_s + n * 16 * ld + c * 16, ld);
          wmma::mma_sync(s_acc, a, bt, s_acc);
          wmma::load_matrix_sync(a, do_s + r * 16 * ld + c * 16, ld);
          wmma::load_matrix_sync(bt, v_s + n * 16 * ld + c * 16, ld);
          wmma::mma_sync(dp_acc, a, bt, dp_acc);
        }
        wmma::store_matrix_sync(s_s + r * 16 * kLdS + n * 16, s_acc, kLdS, wmma::mem_row_major);
        wmma::store_matrix_sync(dp_s + r * 16 * kLdS + n * 16, dp_acc, kLdS, wmma::mem_row_major);
      }
      __syncthreads();
      // P and dS; P = 0 where the key is hidden from the query or the query is past the end.
      for (int i = threadIdx.x; i < kBr * kBc; i += kThreads) {
        const int r = i / kBc, c = i % kBc, query = q0 + r;
        float p = query < T && key_visible(query, k0 + c, first_key_s[r], dims.window)
                      ? expf(scale * s_s[r * kLdS + c] - lse_s[r])
                      : 0.0f;
        p_s[r * kLdP + c] = __float2bfloat16(p);
        ds_s[r * kLdP + c] = __float2bfloat16(p * (dp_s[r * kLdS + c] - di_s[r]));
      }
      __syncthreads();
      // dV += P^T dO and dK += dS^T Q (scale applied at the end).
      FT_UNROLL
      for (int i = 0; i < kKvPerWarp; ++i) {
        const int t = warp + i * kWarps;
        if (t < kv_tiles) {
          const int n = t / chunks, c = t % chunks;
          for (int r = 0; r < kBr / 16; ++r) {
            AFrag<wmma::col_major> at;  // P^T, dS^T: column j of the fragment is query row j
            BFrag<wmma::row_major> bm;
            wmma::load_matrix_sync(at, p_s + r * 16 * kLdP + n * 16, kLdP);
            wmma::load_matrix_sync(bm, do_s + r * 16 * ld + c * 16, ld);
            wmma::mma_sync(dv_acc[i], at, bm, dv_acc[i]);
            wmma::load_matrix_sync(at, ds_s + r * 16 * kLdP + n * 16, kLdP);
            wmma::load_matrix_sync(bm, q_s + r * 16 * ld + c * 16, ld);
            wmma::mma_sync(dk_acc[i], at, bm, dk_acc[i]);
          }
        }
      }
      // dQ += dS K into the f32 workspace (scale applied by the last kernel).
      for (int t = warp; t < kBr / 16 * chunks; t += kWarps) {
        const int r = t / chunks, c = t % chunks;
        AccFrag acc;
        wmma::fill_fragment(acc, 0.0f);
        for (int n = 0; n < kBc / 16; ++n) {
          AFrag<wmma::row_major> a;
          BFrag<wmma::row_major> bm;
          wmma::load_matrix_sync(a, ds_s + r * 16 * kLdP + n * 16, kLdP);
          wmma::load_matrix_sync(bm, k_s + n * 16 * ld + c * 16, ld);
          wmma::mma_sync(acc, a, bm, acc);
        }
        wmma::store_matrix_sync(tile_s, acc, 16, wmma::mem_row_major);
        __syncwarp();
        const int lane = threadIdx.x % 32, query = q0 + r * 16 + lane / 2, col0 = c * 16 + lane % 2 * 8;
        const float* from = tile_s + (lane / 2) * 16 + lane % 2 * 8;
        if (query < T)
          for (int e = 0; e < 8; ++e)
            if (col0 + e < D) atomicAdd(dq_accum + d_rows.base + int64_t(query) * d_rows.stride + col0 + e, from[e]);
        __syncwarp();
      }
    }
  }
  const HeadRows dk_rows = head_rows(dims.dk_pitch, dims.kv_heads, T, b, hk);
  const HeadRows dv_rows = head_rows(dims.dv_pitch, dims.kv_heads, T, b, hk);
  FT_UNROLL
  for (int i = 0; i < kKvPerWarp; ++i) {
    const int t = warp + i * kWarps;
    if (t < kv_tiles) {
      const int n = t / chunks, c = t % chunks;
      wmma::store_matrix_sync(tile_s, dk_acc[i], 16, wmma::mem_row_major);
      __syncwarp();
      write_tile(dk, dk_rows.base, dk_rows.stride, k0 + n * 16, T, c * 16, D, tile_s, scale);
      __syncwarp();
      wmma::store_matrix_sync(tile_s, dv_acc[i], 16, wmma::mem_row_major);
      __syncwarp();
      write_tile(dv, dv_rows.base, dv_rows.stride, k0 + n * 16, T, c * 16, D, tile_s, 1.0f);
      __syncwarp();
    }
  }
}

// dq = scale * dq_accum: element d of head row r is dq_accum[r * D + d] and
// dq's r * pitch + d.
__global__ void __launch_bounds__(256) attention_dq_scale_kernel(View dq, const float* dq_accum, float scale,
                                                                  int64_t n, int D, int64_t pitch) {
  int64_t i = int64_t(blockIdx.x) * 256 + threadIdx.x;
  if (i < n) store(dq, i / D * pitch + i % D, scale * dq_accum[i]);
}

template <int kMaxD>
void launch_forward_tc(Tensor& out, Tensor& lse, const HeadsView& q, const HeadsView& k, const HeadsView& v,
                       float scale, const AttentionDims& dims, int64_t batch, cudaStream_t stream) {
  dim3 grid(unsigned((dims.seq + kFwdBr - 1) / kFwdBr), unsigned(dims.q_heads), unsigned(batch));
  launch<attention_forward_tc_kernel<kMaxD>>(grid, kThreads, size_t(tc_forward_smem_bytes<kMaxD>(dims.head_dim)),
                                             stream, view(out), lse.ptr<float>(), const_view(q),
                                             const_view(k), const_view(v), scale, dims);
  FT_CUDA_CHECK_LAUNCH();
}

template <int kMaxD>
void launch_backward_tc(const HeadsView& dk, const HeadsView& dv, float* dq_accum, const Tensor& dout,
                        const HeadsView& q, const HeadsView& k, const HeadsView& v, const Tensor& lse, const float* di,
                        float scale, const AttentionDims& dims, int64_t batch, cudaStream_t stream) {
  constexpr int kBc = TcBackwardTile<kMaxD>::kBc;
  dim3 grid(unsigned((dims.seq + kBc - 1) / kBc), unsigned(dims.kv_heads), unsigned(batch));
  launch<attention_backward_tc_kernel<kMaxD>>(
      grid, kThreads, size_t(tc_backward_smem_bytes<kMaxD>(dims.head_dim)), stream, view(dk), view(dv), dq_accum,
      const_view(q), const_view(k), const_view(v), const_view(dout),
      lse.ptr<const float>(), di, scale, dims);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void attention_forward_tc(Tensor& out, Tensor& lse, const HeadsView& q, const HeadsView& k, const HeadsView& v,
                          float scale, const AttentionDims& dims, int64_t batch, cudaStream_t stream) {
  if (dims.head_dim <= 64) launch_forward_tc<64>(out, lse, q, k, v, scale, dims, batch, stream);
  else if (dims.head_dim <= 128) launch_forward_tc<128>(out, lse, q, k, v, scale, dims, batch, stream);
  else launch_forward_tc<256>(out, lse, q, k, v, scale, dims, batch, stream);
}

void attention_backward_tc(const HeadsView& dq, const HeadsView& dk, const HeadsView& dv, const Tensor& dout,
                           const HeadsView& q, const HeadsView& k, const HeadsView& v, const Tensor& lse,
                           const float* di, float* dq_accum, float scale, const AttentionDims& dims, int64_t batch,
                           cudaStream_t stream) {
  const int64_t n = dout.numel();
  FT_CUDA_CHECK(cudaMemsetAsync(dq_accum, 0, size_t(n) * sizeof(float), stream));
  if (dims.head_dim <= 64) launch_backward_tc<64>(dk, dv, dq_accum, dout, q, k, v, lse, di, scale, dims, batch, stream);
  else if (dims.head_dim <= 128)
    launch_backward_tc<128>(dk, dv, dq_accum, dout, q, k, v, lse, di, scale, dims, batch, stream);
  else launch_backward_tc<256>(dk, dv, dq_accum, dout, q, k, v, lse, di, scale, dims, batch, stream);
  launch<attention_dq_scale_kernel>(unsigned((n + 255) / 256), 256, 0, stream, view(dq), dq_accum, scale, n,
                                    dims.head_dim, dq.pitch());
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft::cuda
