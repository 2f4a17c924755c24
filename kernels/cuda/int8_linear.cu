// LLM.int8() linear layers on the GPU, as the CPU reference (kernels/cpu/int8.cpp).
//
// Forward, out[N, O] = x[N, K] @ W^T with W = q[O, K] * s_w[O] / 127:
//   1. outlier columns (any |x[:, k]| >= threshold): flagged per column by a
//      grid of 256-column x 64-row blocks (a flag set by any block that saw
//      one), then compacted on the device into `columns` = [count, ascending
//      indices..., then a bit mask of the K columns], so no kernel waits on
//      the host for the count;
//   2. the outlier columns' weight codes gathered once into a contiguous
//      [c, O] buffer (up to int8_outlier_gather_columns of them), so the
//      epilogue reads them coalesced rather than one byte K apart per thread;
//   3. per row of x (1 to 8 warps each, 16-byte loads of bf16, the outlier
//      columns read from the bit mask a word per 8 elements): absmax with the
//      outlier columns zeroed, and the codes;
//      (1 and 3 are int8_quantize_input: given its result, Int8Epilogue::input,
//      the forward skips them, so q/k/v and gate/up quantise x once a layer)
//   4. per block of rows (int8_forward_chunk_rows: balanced, whole 128-row
//      GEMM tiles where the budget allows): the int8 x int8 -> int32 product
//      of the codes with q through cuda::Gemm (cuBLASLt's IMMA path on a GPU);
//   5. an epilogue dequantises the product, adds the outlier columns in f32
//      (x in place, the gathered codes), the bias and the LoRA update
//      scaling * h B^T (reading h [N, r] and B [O, r] in place), and rounds
//      out once; each thread owns one output column for 16 rows, so the
//      column's scale and B row are read once per 16 outputs (wider thread
//      shapes, 4 or 2 columns x 8 rows with 16-byte accesses, measured no
//      faster on an H200: docs/gpu-int8.md, run 5).
// Fused, where the backend has a library int8 GEMM (int8_gemm_engine.h:
// CUTLASS on an sm_90 GPU) and x, out and h are bf16, 4 and 5 are instead:
//   4'. the int8 GEMM writes out = bf16(product * s_x s_w / 127^2 + bias)
//      from its epilogue (no int32 product in memory, no epilogue pass);
//   5'. the first kInt8FusedOutlierColumns outlier columns and the LoRA
//      update as one small bf16 GEMM accumulated into out (beta = 1):
//      [x's outlier columns | h] @ [their dequantised weights | scaling B]^T,
//      its inner size fixed on the host (zero columns past the device's
//      count); outlier columns past it, rarely any, added in place after.
//   (2 is part of 5'; kernels/backend.h gives the rounding this changes.)
// The scratch is exactly what the memory planner models
// (kernels/meta/meta_backend.cpp): it does not depend on the outlier count.
//
// Backward, dx = dout @ W: W is dequantised a few wide blocks of
// input-feature columns at a time (kInt8DequantTileElementsGpu: one to three
// per GPT-NeoX-20B weight) into a tile of dout's dtype (bf16 tensor cores on
// the real path; 16 codes per thread from one 16-byte load), and one GEMM per
// block writes its columns of dx in place with f32 accumulation, so dx is
// rounded once.
#include "kernels/cuda/int8_linear.h"

#include <algorithm>
#include <cstring>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/int8_gemm_engine.h"
#include "kernels/int8_tiles.h"

namespace ft {
namespace {

constexpr int kBlock = 256;
constexpr int kScanBlock = 1024;       // the one block that compacts the outlier list
constexpr int kRun = 8;                // elements of a row of x a lane reads at a time
constexpr int kWarps = kBlock / 32;
constexpr int kFlagColumns = 32 * kRun;  // outlier flagging: columns per block, a run per lane
constexpr int64_t kFlagRows = 64;        // rows per outlier-flagging block, kFlagRows / kWarps per warp
constexpr int kEpilogueRows = 16;      // rows of out per epilogue thread
constexpr int kStagedColumns = 32;     // outlier columns of x / LoRA ranks of h staged at a time
constexpr int kTileRowsPerBlock = 4;   // weight-tile dequantisation: rows per block
constexpr int kTileRun = 16;           // weight-tile dequantisation: codes per thread, one 16-byte load
constexpr float kInv127Sq = 1.0f / (127.0f * 127.0f);

// Element i of a grid-stride loop's first pass.
__device__ inline int64_t grid_index() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline int64_t grid_stride() { return int64_t(gridDim.x) * blockDim.x; }

// The outlier flags and the quantisation read x kRun consecutive elements of
// a row per lane at a time: one 16-byte load where x is bf16 with rows of
// whole runs and 16-byte aligned (`vector`).
struct alignas(16) Bf16Run {
  __nv_bfloat16 v[kRun];
};
struct alignas(8) CodeRun {
  int8_t v[kRun];
};

// v[j] = x[i + j] in f32, 0 past end.
__device__ inline void load_run(float (&v)[kRun], cuda::ConstView x, int64_t i, int64_t end, bool vector) {
  if (vector) {
    const Bf16Run run = *reinterpret_cast<const Bf16Run*>(static_cast<const __nv_bfloat16*>(x.data) + i);
    FT_UNROLL
    for (int j = 0; j < kRun; ++j) v[j] = __bfloat162float(run.v[j]);
  } else {
    FT_UNROLL
    for (int j = 0; j < kRun; ++j) v[j] = i + j < end ? cuda::load(x, i + j) : 0.0f;
  }
}

// flags[k] = 1 where any |x[:, k]| >= threshold (threshold > 0); flags must
// be zero on entry. A block owns kFlagColumns columns of kFlagRows rows: each
// lane reads a run of 8 consecutive columns of a row (16 bytes in bf16; a
// warp reads 512 contiguous bytes), the 8 warps split the rows, and warp 0
// sets the flags the block's rows earned. Blocks tile rows as well as
// columns, so the grid fills the GPU even where K / 256 is a few dozen.
template <bool Vector>
__global__ void __launch_bounds__(kBlock)
    flag_outlier_columns_kernel(int32_t* flags, cuda::ConstView x, int64_t N, int64_t K, float threshold) {
  __shared__ uint32_t seen[kWarps][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t k = int64_t(blockIdx.y) * kFlagColumns + int64_t(lane) * kRun;
  const int64_t n_first = int64_t(blockIdx.x) * kFlagRows, n_end = N < n_first + kFlagRows ? N : n_first + kFlagRows;
  uint32_t any = 0;  // bit j: column k + j
  for (int64_t n = n_first + warp; k < K && n < n_end; n += kWarps) {
    float v[kRun];
    load_run(v, x, n * K + k, n * K + K, Vector);
    FT_UNROLL
    for (int j = 0; j < kRun; ++j) any |= uint32_t(fabsf(v[j]) >= threshold) << j;
  }
  seen[warp][lane] = any;
  __syncthreads();
  if (warp != 0) return;
  for (int w = 1; w < kWarps; ++w) any |= seen[w][lane];
  FT_UNROLL
  for (int j = 0; j < kRun; ++j)  // other row blocks may set the same flag
    if ((any >> j) & 1u) atomicExch(&flags[k + j], 1);
}

__global__ void __launch_bounds__(kBlock) zero_kernel(int32_t* values, int64_t n) {
  for (int64_t i = grid_index(); i < n; i += grid_stride()) values[i] = 0;
}

// columns = [flags[0..K), mask] in place -> [count, indices of the set flags,
// ascending, mask], where mask (ceil(K / 32) words after the K + 1 entries)
// has bit k % 32 of word k / 32 set for each set flag k. One block walks the
// flags 1024 at a time: a ballot numbers the set flags within each warp (and
// is the warp's mask word), the warps' counts offset each other. An index
// lands at or before its own flag, which every thread has read by then.
__global__ void __launch_bounds__(kScanBlock) compact_outlier_columns_kernel(int32_t* columns, int64_t K) {
  __shared__ int32_t warp_counts[kScanBlock / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  uint32_t* mask = reinterpret_cast<uint32_t*>(columns + 1 + K);
  int32_t base = 0;
  for (int64_t k0 = 0; k0 < K; k0 += kScanBlock) {
    const int64_t k = k0 + threadIdx.x;
    const bool flagged = k < K && columns[1 + k] != 0;
    const unsigned votes = __ballot_sync(0xffffffffu, flagged);
    if (lane == 0) warp_counts[warp] = __popc(votes);
    if (lane == 0 && k < K) mask[k / 32] = votes;
    __syncthreads();
    int32_t slot = base + __popc(votes & ((1u << lane) - 1u));
    for (int w = 0; w < warp; ++w) slot += warp_counts[w];
    for (int w = 0; w < kScanBlock / 32; ++w) base += warp_counts[w];
    __syncthreads();  // warp_counts and this chunk's flags read before they are overwritten
    if (flagged) columns[1 + slot] = int32_t(k);
  }
  if (threadIdx.x == 0) columns[0] = base;
}

// The outlier bits of the 8 columns k..k+7 (k a multiple of 8, so one mask word holds them).
__device__ inline unsigned outlier_bits(const uint32_t* mask, int64_t k) { return (mask[k / 32] >> (k % 32)) & 0xffu; }

// round-half-even(v * 127 / absmax), the rounding of the exact quotient, as
// the CPU computes it in double (absmax > 0, |v| <= absmax).
// exact_code divides: for bf16 and f16 x (and so a bf16 or f16 absmax) f32
// gives the same code without FP64 (1/64 rate on consumer GPUs): v * 127 is
// exact in f32 (at most 11 + 7 significant bits), and a quotient
// A 2^a / (S 2^s) of such numbers that is not a tie lies at least 2^-18 of
// itself (or 2^-12 absolutely) from the nearest tie, while a correctly
// rounded f32 quotient (|q| <= 127) is within 2^-24 of itself: both round
// alike, and an exact tie is representable.
__device__ inline int8_t exact_code(float v, float absmax, bool narrow_input) {
  if (narrow_input) return int8_t(rintf(__fdiv_rn(__fmul_rn(v, 127.0f), absmax)));
  return int8_t(rint(double(v) * 127.0 / double(absmax)));
}

// The codes without a division per element (ncu put the IEEE division at
// most of what the quantisation issued on an H200: docs/gpu-int8.md, run 4):
// p = v * inv with inv = f32(127 / absmax) is the quotient Q times
// (1 + e1)(1 + e2), |e| <= 2^-24, so |p - Q| <= 2^-23 |Q| < 2^-16
// (|Q| <= 127). Where p is more than 2^-16 from every half-integer, Q rounds
// as p does; a run of codes with any other element (exact ties such as
// v = absmax / 2, whose p may fall either side, or anything near one; an inv
// that overflowed to inf gives NaN and lands here too) takes exact_code for
// the run.
constexpr float kNearTie = 0.5f - 1.0f / 65536.0f;

// warps_per_row warps (1, 2, 4 or 8) per row of x: the absmax over the row
// with its outlier columns zeroed (warp reductions, then the row's warps
// through shared memory), then the codes (exact_code's; quantize_rows_int8
// and the CPU round alike). Outlier columns get code 0. max is exact, so any
// order of the reduction agrees. Long rows take more warps, so the grid has
// enough of them at NeoX-20B's 2048 x 18432 (one warp per row gave 2048).
// Vector: x is bf16 with rows of whole runs, 16-byte aligned (a separate
// instantiation, so that kernel holds neither the dtype switch nor the f32
// input's double-precision division). given_scales (a row-parallel shard's
// whole-row absmax, Int8Epilogue::row_absmax), where not null, replaces the
// computed absmax; q null computes the scales only (int8_row_absmax).
template <bool Vector>
__global__ void __launch_bounds__(kBlock)
    quantize_inliers_kernel(int8_t* q, float* scales, cuda::ConstView x, const uint32_t* outlier_mask,
                            const float* given_scales, int64_t N, int64_t K, int warps_per_row) {
  __shared__ float warp_absmax[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, part = warp % warps_per_row;
  const int64_t n = int64_t(blockIdx.x) * (kWarps / warps_per_row) + warp / warps_per_row;
  const bool live = n < N;  // no early return: every warp reaches the barrier
  const int64_t row = n * K, end = row + K, step = int64_t(32) * warps_per_row * kRun;
  const int64_t first = (int64_t(part) * 32 + lane) * kRun;
  float absmax = 0.0f;
  for (int64_t k = first; live && !given_scales && k < K; k += step) {
    float v[kRun];
    load_run(v, x, row + k, end, Vector);
    const unsigned outliers = outlier_bits(outlier_mask, k);
    FT_UNROLL
    for (int j = 0; j < kRun; ++j)
      if (k + j < K && !((outliers >> j) & 1u)) absmax = fmaxf(absmax, fabsf(v[j]));
  }
  absmax = cuda::warp_max(absmax);
  if (lane == 0) warp_absmax[warp] = absmax;
  __syncthreads();
  for (int w = 0; w < warps_per_row; ++w) absmax = fmaxf(absmax, warp_absmax[warp - part + w]);
  if (!live) return;
  if (given_scales) absmax = given_scales[n];
  if (part == 0 && lane == 0) scales[n] = absmax;
  if (!q) return;
  const bool narrow_input = Vector || x.dtype != DType::f32;
  const float inv = absmax > 0.0f ? __fdiv_rn(127.0f, absmax) : 0.0f;
  for (int64_t k = first; k < K; k += step) {
    float v[kRun];
    load_run(v, x, row + k, end, Vector);
    const unsigned outliers = outlier_bits(outlier_mask, k);
    CodeRun codes;
    unsigned zero_bits = 0;  // bit j: code j is 0 (an outlier column, past the row's end, or an all-zero row)
    bool near_tie = false;
    FT_UNROLL
    for (int j = 0; j < kRun; ++j) {
      const bool zero = absmax == 0.0f || k + j >= K || ((outliers >> j) & 1u);
      const float p = __fmul_rn(v[j], inv), code = rintf(p);
      const bool near = !(fabsf(__fadd_rn(p, -code)) < kNearTie);
      near_tie |= !zero && near;
      codes.v[j] = zero || near ? int8_t(0) : int8_t(code);
      zero_bits |= unsigned(zero) << j;
    }
    if (near_tie) {
      FT_UNROLL
      for (int j = 0; j < kRun; ++j)
        if (!((zero_bits >> j) & 1u)) codes.v[j] = exact_code(v[j], absmax, narrow_input);
    }
    if (Vector) {
      *reinterpret_cast<CodeRun*>(q + row + k) = codes;  // row + k is a multiple of 8: aligned
    } else {
      FT_UNROLL
      for (int j = 0; j < kRun; ++j)
        if (k + j < K) q[row + k + j] = codes.v[j];
    }
  }
}

// Warps per row of x for quantize_inliers_kernel: about 4 runs of 8 elements
// per lane, at most a block's 8 warps.
int quantize_warps_per_row(int64_t K) {
  const int64_t runs_per_lane = 4;
  int warps = 1;
  while (warps < kWarps && int64_t(warps) * 2 * 32 * kRun * runs_per_lane <= K) warps *= 2;
  return warps;
}

// gathered[c, o] = q[o, columns[1 + c]] for the first min(count, capacity)
// outlier columns. The reads are strided, but once per call instead of once
// per row of x in the epilogue.
__global__ void __launch_bounds__(kBlock) gather_outlier_weights_kernel(int8_t* gathered, const int8_t* wq,
                                                                        const int32_t* columns, int64_t O,
                                                                        int64_t K, int64_t capacity) {
  const int64_t count = columns[0] < capacity ? int64_t(columns[0]) : capacity;
  for (int64_t i = grid_index(); i < count * O; i += grid_stride())
    gathered[i] = wq[(i % O) * K + columns[1 + i / O]];
}

// Backend::int8_linear_forward's Int8Epilogue as kernel arguments; a null
// view is an absent operand, r = 0 no LoRA update.
struct EpilogueViews {
  cuda::ConstView bias, lora_h, lora_B;
  int64_t r;
  float lora_scaling;
};

EpilogueViews epilogue_views(const Int8Epilogue& e) {
  const cuda::ConstView none{nullptr, DType::f32};
  if (!e.lora_h) return {e.bias ? cuda::const_view(*e.bias) : none, none, none, 0, 0.0f};
  return {e.bias ? cuda::const_view(*e.bias) : none, cuda::const_view(*e.lora_h), cuda::const_view(*e.lora_B),
          e.lora_B->cols(), e.lora_scaling};
}

// out rows [n0, n0 + rows): the int32 product dequantised, plus the outlier
// columns in f32 and the epilogue, in the CPU's order and arithmetic
// (forward_block in kernels/cpu/int8.cpp), rounded once.
// The outlier codes come from the gathered [capacity, O] buffer (coalesced
// across o), past its capacity from q in place: the same bytes either way.
struct OutlierWeights {
  const int8_t *gathered, *wq;
  int64_t capacity;
};

// staged[i][c] = src[(first + i) * pitch + column c] for the block's rows
// i < count and c < columns (column c is indices[c], or col0 + c without
// indices), 0 elsewhere, in f32: one load per value for the whole block,
// where every thread would otherwise load it (a dtype switch and 64-bit
// index math each). Barriers on both sides: all threads must call it.
__device__ inline void stage_rows(float (&staged)[kEpilogueRows][kStagedColumns], cuda::ConstView src,
                                  int64_t first, int count, int64_t pitch, const int32_t* indices, int64_t col0,
                                  int columns) {
  __syncthreads();  // the previous stage's readers are done
  for (int t = threadIdx.x; t < kEpilogueRows * kStagedColumns; t += kBlock) {
    const int i = t / kStagedColumns, c = t % kStagedColumns;
    const int64_t column = indices ? int64_t(indices[c < columns ? c : 0]) : col0 + c;
    staged[i][c] = i < count && c < columns ? cuda::load(src, (first + i) * pitch + column) : 0.0f;
  }
  __syncthreads();
}

// A block covers kBlock columns of out and kEpilogueRows rows: each thread
// one column o for all the rows, so sw[o], the outlier weights and B[o, :]
// are read once per 16 outputs, and the rows' outlier x values and h values
// are staged in shared memory (read as broadcasts). Each element's
// arithmetic is the CPU's, term by term, in the order of kernels/backend.h.
__global__ void __launch_bounds__(kBlock)
    forward_epilogue_kernel(cuda::View out, const int32_t* product, cuda::ConstView x, OutlierWeights w,
                            const float* sx, const float* sw, const int32_t* columns, EpilogueViews e,
                            int64_t n0, int64_t rows, int64_t O, int64_t K) {
  __shared__ float staged[kEpilogueRows][kStagedColumns];
  const int64_t o = int64_t(blockIdx.y) * kBlock + threadIdx.x;
  const bool active = o < O;  // no early return: every thread takes part in the staging
  const int64_t first = n0 + int64_t(blockIdx.x) * kEpilogueRows;
  const int count = n0 + rows - first < kEpilogueRows ? int(n0 + rows - first) : kEpilogueRows;
  const float sw_o = active ? sw[o] : 0.0f;
  const int32_t* block_product = product + (first - n0) * O + o;
  float value[kEpilogueRows], lora[kEpilogueRows];
  FT_UNROLL
  for (int i = 0; i < kEpilogueRows; ++i) {
    value[i] = active && i < count ? float(block_product[i * O]) * (sx[first + i] * sw_o * kInv127Sq) : 0.0f;
    lora[i] = 0.0f;
  }
  const int32_t outliers = columns[0];
  for (int32_t c0 = 0; c0 < outliers; c0 += kStagedColumns) {
    const int staged_columns = outliers - c0 < kStagedColumns ? int(outliers - c0) : kStagedColumns;
    stage_rows(staged, x, first, count, K, columns + 1 + c0, 0, staged_columns);
    if (!active) continue;
    for (int c = 0; c < staged_columns; ++c) {
      const int32_t index = c0 + c;
      const int8_t code = index < w.capacity ? w.gathered[index * O + o] : w.wq[o * K + columns[1 + index]];
      const float weight = float(code) * sw_o / 127.0f;
      FT_UNROLL
      for (int i = 0; i < kEpilogueRows; ++i) value[i] = fmaf(staged[i][c], weight, value[i]);
    }
  }
  if (e.bias.data && active) {
    const float bias = cuda::load(e.bias, o);
    // __fadd_rn keeps nvcc from contracting the add into an FMA with the
    // dequantisation, which the CPU does not do.
    FT_UNROLL
    for (int i = 0; i < kEpilogueRows; ++i) value[i] = __fadd_rn(value[i], bias);
  }
  for (int64_t j0 = 0; j0 < e.r; j0 += kStagedColumns) {
    const int staged_ranks = e.r - j0 < kStagedColumns ? int(e.r - j0) : kStagedColumns;
    stage_rows(staged, e.lora_h, first, count, e.r, nullptr, j0, staged_ranks);
    if (!active) continue;
    for (int j = 0; j < staged_ranks; ++j) {
      const float b = cuda::load(e.lora_B, o * e.r + j0 + j);
      FT_UNROLL
      for (int i = 0; i < kEpilogueRows; ++i) lora[i] = fmaf(staged[i][j], b, lora[i]);
    }
  }
  if (!active) return;
  FT_UNROLL
  for (int i = 0; i < kEpilogueRows; ++i)
    if (i < count) cuda::store(out, (first + i) * O + o, e.r > 0 ? fmaf(e.lora_scaling, lora[i], value[i]) : value[i]);
}

// The fused forward's small GEMM operands, row i of [rows, width] bf16: the
// first `columns` entries for outlier columns c (zero where c >= count),
// then the r LoRA entries, then zero padding. side_x rows are x's rows
// (x[n, column c], h[n, j]); side_w rows are W's (q[o, column c] * s_w[o] /
// 127 as the exact path's weight, scaling * B[o, j]), each rounded once to bf16.
struct SideOperand {
  const int32_t* columns;  // the outlier list: count, then the columns
  int64_t outlier_columns, r, width;
};
// Where a side operand's rows come from: x [rows, K] (wq null), or W's codes
// wq [rows, K] with scales sw; lora (h or B [rows, r]) times lora_scaling.
struct SideRows {
  cuda::ConstView x;
  const int8_t* wq;
  const float* sw;
  cuda::ConstView lora;
  float lora_scaling;
};

__global__ void __launch_bounds__(kBlock) side_operand_kernel(__nv_bfloat16* side, SideRows from, SideOperand s,
                                                               int64_t rows, int64_t K) {
  const int64_t count = s.columns[0];
  for (int64_t i = grid_index(); i < rows * s.width; i += grid_stride()) {
    const int64_t row = i / s.width, c = i % s.width;
    float v = 0.0f;
    if (c < s.outlier_columns) {
      if (c < count) {
        const int64_t k = s.columns[1 + c];
        v = from.wq ? float(from.wq[row * K + k]) * from.sw[row] / 127.0f : cuda::load(from.x, row * K + k);
      }
    } else if (c < s.outlier_columns + s.r) {
      v = from.lora_scaling * cuda::load(from.lora, row * s.r + c - s.outlier_columns);
    }
    side[i] = __float2bfloat16(v);
  }
}

// out[n, o] += the outlier columns from `first` on (none unless the count
// passes it), in f32 per element, rounded once more.
__global__ void __launch_bounds__(kBlock)
    outlier_overflow_kernel(__nv_bfloat16* out, cuda::ConstView x, const int8_t* wq, const float* sw,
                            const int32_t* columns, int64_t first, int64_t N, int64_t O, int64_t K) {
  const int64_t count = columns[0];
  if (count <= first) return;
  for (int64_t i = grid_index(); i < N * O; i += grid_stride()) {
    const int64_t n = i / O, o = i % O;
    float v = __bfloat162float(out[i]);
    for (int64_t c = first; c < count; ++c) {
      const int64_t k = columns[1 + c];
      v = fmaf(cuda::load(x, n * K + k), float(wq[o * K + k]) * sw[o] / 127.0f, v);
    }
    out[i] = __float2bfloat16(v);
  }
}

// Two f32 values as a bf16 pair (lo in the low half, as in memory), each
// rounded as __float2bfloat16 rounds it.
__device__ inline uint32_t bf16x2_bits(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  uint32_t bits;
  memcpy(&bits, &pair, sizeof(bits));
  return bits;
}

// tile[o, j] = W[o, k0 + j] dequantised as the CPU's f32 tile, rounded once to
// the tile's dtype; the tile is [O, kb], packed. A block owns
// kTileRowsPerBlock rows of W at a time, all kb columns: it first tabulates
// code * sw[o] / 127 for the 256 codes of each row (the division is the
// costly part: a 256-entry table per row replaces one per element, the same
// value bit for bit), then each thread takes runs of 16 consecutive codes of
// those rows. Vector: the tile is bf16 and every run starts 16-byte aligned
// in W and 32-byte aligned in the tile (K, k0 and kb multiples of 16), so a
// run is one 16-byte load and two 16-byte stores.
static_assert(kTileRun == 16, "a tile run is one int4 of codes and two uint4 of bf16");

template <bool Vector>
__global__ void __launch_bounds__(kBlock) dequantize_tile_kernel(cuda::View tile, const int8_t* wq, const float* sw,
                                                                 int64_t O, int64_t K, int64_t k0, int64_t kb) {
  __shared__ float values[kTileRowsPerBlock][256];
  const int runs_per_row = int((kb + kTileRun - 1) / kTileRun);
  for (int64_t o = int64_t(blockIdx.x) * kTileRowsPerBlock; o < O; o += int64_t(gridDim.x) * kTileRowsPerBlock) {
    const int rows = O - o < kTileRowsPerBlock ? int(O - o) : kTileRowsPerBlock;
    __syncthreads();  // the previous rows' table is no longer read
    for (int t = threadIdx.x; t < kTileRowsPerBlock * 256; t += kBlock) {
      const int r = t / 256, code = t % 256 - 128;
      values[r][t % 256] = r < rows ? float(code) * sw[o + r] / 127.0f : 0.0f;
    }
    __syncthreads();
    for (int u = threadIdx.x; u < rows * runs_per_row; u += kBlock) {
      const int r = u / runs_per_row;
      const int64_t j = int64_t(u % runs_per_row) * kTileRun, at = (o + r) * kb + j;
      const int8_t* codes = wq + (o + r) * K + k0 + j;
      if (Vector) {
        const int4 run = *reinterpret_cast<const int4*>(codes);
        const uint32_t words[4] = {uint32_t(run.x), uint32_t(run.y), uint32_t(run.z), uint32_t(run.w)};
        uint32_t pairs[8];  // bf16 pairs, codes 2t and 2t + 1 (little-endian bytes of the words)
        FT_UNROLL
        for (int t = 0; t < 8; ++t) {
          const uint32_t word = words[t / 2] >> (16 * (t % 2));
          pairs[t] = bf16x2_bits(values[r][int(int8_t(word & 0xffu)) + 128], values[r][int(int8_t(word >> 8)) + 128]);
        }
        uint4* dst = reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(tile.data) + at);
        dst[0] = make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
        dst[1] = make_uint4(pairs[4], pairs[5], pairs[6], pairs[7]);
      } else {
        const int length = kb - j < kTileRun ? int(kb - j) : kTileRun;
        for (int t = 0; t < length; ++t) cuda::store(tile, at + t, values[r][int(codes[t]) + 128]);
      }
    }
  }
}

// Whether x's rows can be read in 16-byte runs of bf16 (load_run's vector path).
bool vector_runs(const Tensor& x) {
  return x.dtype == DType::bf16 && x.cols() % kRun == 0 && reinterpret_cast<uintptr_t>(x.data) % sizeof(Bf16Run) == 0;
}

// quantize_inliers_kernel over x [N, K] with the outlier columns' bit mask.
void quantize_inliers(int8_t* q, float* scales, const Tensor& x, const uint32_t* outlier_mask,
                      const float* given_scales, cudaStream_t stream) {
  const int64_t N = x.rows(), K = x.cols();
  const int warps_per_row = quantize_warps_per_row(K);
  const int64_t rows_per_block = kWarps / warps_per_row;
  const unsigned blocks = unsigned((N + rows_per_block - 1) / rows_per_block);
  if (vector_runs(x))
    launch<quantize_inliers_kernel<true>>(blocks, kBlock, 0, stream, q, scales, cuda::const_view(x), outlier_mask,
                                          given_scales, N, K, warps_per_row);
  else
    launch<quantize_inliers_kernel<false>>(blocks, kBlock, 0, stream, q, scales, cuda::const_view(x), outlier_mask,
                                           given_scales, N, K, warps_per_row);
  FT_CUDA_CHECK_LAUNCH();
}

Tensor scratch(const cuda::Int8Context& context, const cuda::ScratchTensor& t) {
  return Tensor::empty(t.shape, t.dtype, context.allocator, MemCategory::workspace);
}

// flags[k] = 1 where any |x[:, k]| >= threshold, the others left as they are.
void flag_outlier_columns(int32_t* flags, const Tensor& x, float threshold, cudaStream_t stream) {
  const int64_t N = x.rows(), K = x.cols();
  if (K == 0 || N == 0 || threshold <= 0.0f) return;
  const int64_t column_blocks = (K + kFlagColumns - 1) / kFlagColumns;
  FT_CHECK(column_blocks <= 65535, "int8 outlier columns: too many input features (", K, ")");
  const dim3 grid(unsigned((N + kFlagRows - 1) / kFlagRows), unsigned(column_blocks));
  if (vector_runs(x))
    launch<flag_outlier_columns_kernel<true>>(grid, kBlock, 0, stream, flags, cuda::const_view(x), N, K, threshold);
  else
    launch<flag_outlier_columns_kernel<false>>(grid, kBlock, 0, stream, flags, cuda::const_view(x), N, K, threshold);
  FT_CUDA_CHECK_LAUNCH();
}

// columns = [count, outlier column indices ascending, then the bit mask of
// the outlier columns in ceil(K / 32) words] for x [N, K]: the given flags'
// columns (int8_outlier_columns over a batch x is rows of), else x's own.
void find_outlier_columns(Tensor& columns, const Tensor& x, float threshold, const Tensor* given_flags,
                          cudaStream_t stream) {
  const int64_t K = x.cols();
  if (given_flags) {
    FT_CUDA_CHECK(cudaMemcpyAsync(columns.ptr<int32_t>() + 1, given_flags->data, size_t(K) * sizeof(int32_t),
                                  cudaMemcpyDeviceToDevice, stream));
  } else {
    launch<zero_kernel>(cuda::elementwise_blocks(K + 1, kBlock), kBlock, 0, stream, columns.ptr<int32_t>(), K + 1);
    FT_CUDA_CHECK_LAUNCH();
    flag_outlier_columns(columns.ptr<int32_t>() + 1, x, threshold, stream);
  }
  launch<compact_outlier_columns_kernel>(1, kScanBlock, 0, stream, columns.ptr<int32_t>(), K);
  FT_CUDA_CHECK_LAUNCH();
}

// product[0:rows, :] = codes[n0:n0 + rows, :] @ q^T in int32. Row-major
// product [rows, O] is the column-major [O, rows] = q (column-major [K, O],
// transposed) @ codes (column-major [K, rows]): cuBLASLt's "TN" int8 form.
void int8_product(Tensor& product, const Tensor& codes, const Tensor& weight, int64_t n0, int64_t rows,
                  const cuda::Int8Context& context) {
  const int64_t K = weight.dim(1), O = weight.dim(0);
  cuda::GemmArgs args{};
  args.m = O;
  args.n = rows;
  args.k = K;
  args.batch = 1;
  args.alpha = 1.0f;
  args.beta = 0.0f;
  args.a = {weight.data, DType::i8, true, K, 0};
  args.b = {codes.ptr<int8_t>() + n0 * K, DType::i8, false, K, 0};
  args.c = {product.data, DType::i32, O, 0};
  context.gemm.gemm(args, context.stream);
}

// dx[:, k0:k0 + kb] = dout [N, O] @ tile [O, kb] (+= when accumulating), in
// place in row-major dx. As in matmul.cu, the row-major product is the
// column-major dx^T = tile^T @ dout^T: tile as column-major [kb, O] with
// leading dimension kb, dout as [O, N] with O, dx's block as [kb, N] with K.
void backward_block(Tensor& dx, const Tensor& dout, const Tensor& tile, int64_t k0, int64_t kb, bool accumulate,
                    const cuda::Int8Context& context) {
  const int64_t N = dout.rows(), O = dout.cols(), K = dx.cols();
  cuda::GemmArgs args{};
  args.m = kb;
  args.n = N;
  args.k = O;
  args.batch = 1;
  args.alpha = 1.0f;
  args.beta = accumulate ? 1.0f : 0.0f;
  args.a = {tile.data, tile.dtype, false, kb, 0};
  args.b = {dout.data, dout.dtype, false, O, 0};
  args.c = {static_cast<char*>(dx.data) + k0 * int64_t(dtype_size_bytes(dx.dtype)), dx.dtype, K, 0};
  context.gemm.gemm(args, context.stream);
}

// out += side_x [N, width] @ side_w [O, width]^T in f32, rounded once (beta =
// 1): the column-major [O, N] = side_w^T-as-stored @ side_x, int8_product's form.
void side_product(Tensor& out, const Tensor& side_x, const Tensor& side_w, const cuda::Int8Context& context) {
  const int64_t width = side_x.cols();
  cuda::GemmArgs args{};
  args.m = side_w.rows();
  args.n = side_x.rows();
  args.k = width;
  args.batch = 1;
  args.alpha = 1.0f;
  args.beta = 1.0f;
  args.a = {side_w.data, DType::bf16, true, width, 0};
  args.b = {side_x.data, DType::bf16, false, width, 0};
  args.c = {out.data, DType::bf16, args.m, 0};
  context.gemm.gemm(args, context.stream);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The forward through the library int8 GEMM (4' and 5' at the top).
void fused_forward(Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& weight_scales,
                   float threshold, const Int8Epilogue& epilogue, int64_t outlier_columns,
                   const cuda::Int8Context& context) {
  const int64_t N = x.rows(), K = x.cols(), O = weight.dim(0);
  const int64_t r = epilogue.lora_h ? epilogue.lora_B->cols() : 0;
  const int64_t columns = threshold > 0.0f ? std::min(outlier_columns, K) : 0;
  const bool widens_bias = epilogue.bias && epilogue.bias->dtype != DType::f32;
  const Int8Input* given = epilogue.input;
  const cuda::Int8FusedScratch sizes = cuda::int8_fused_scratch(N, K, O, columns, r, widens_bias, !given);
  Int8Input own{scratch(context, sizes.codes), scratch(context, sizes.row_scales),
                scratch(context, sizes.outlier_columns), threshold};
  Tensor bias = scratch(context, sizes.bias);
  Tensor side_x = scratch(context, sizes.side_x), side_w = scratch(context, sizes.side_w);
  if (!given) {
    cuda::int8_quantize_input(own, x, threshold, epilogue.outlier_flags, epilogue.row_absmax, context);
    given = &own;
  }
  if (widens_bias) cuda::convert(bias, *epilogue.bias, context.stream);
  context.int8_gemm->scaled_product(out, given->codes, weight, given->row_absmax, weight_scales,
                                    widens_bias ? &bias : epilogue.bias, context.stream);
  context.passed("int8 GEMM");
  const int32_t* list = given->outlier_columns.ptr<const int32_t>();
  if (side_x.cols() > 0) {
    const SideOperand side{list, columns, r, side_x.cols()};
    const cuda::ConstView none{nullptr, DType::bf16};
    const SideRows x_rows{cuda::const_view(x), nullptr, nullptr, r ? cuda::const_view(*epilogue.lora_h) : none, 1.0f};
    const SideRows w_rows{none, weight.ptr<const int8_t>(), weight_scales.ptr<const float>(),
                          r ? cuda::const_view(*epilogue.lora_B) : none, epilogue.lora_scaling};
    launch<side_operand_kernel>(cuda::elementwise_blocks(N * side.width, kBlock), kBlock, 0, context.stream,
                                side_x.ptr<__nv_bfloat16>(), x_rows, side, N, K);
    FT_CUDA_CHECK_LAUNCH();
    launch<side_operand_kernel>(cuda::elementwise_blocks(O * side.width, kBlock), kBlock, 0, context.stream,
                                side_w.ptr<__nv_bfloat16>(), w_rows, side, O, K);
    FT_CUDA_CHECK_LAUNCH();
    context.passed("side operands");
    side_product(out, side_x, side_w, context);
    context.passed("side GEMM");
  }
  if (columns > 0 && columns < K) {
    launch<outlier_overflow_kernel>(cuda::elementwise_blocks(N * O, kBlock), kBlock, 0, context.stream,
                                    out.ptr<__nv_bfloat16>(), cuda::const_view(x), weight.ptr<const int8_t>(),
                                    weight_scales.ptr<const float>(), list, columns, N, O, K);
    FT_CUDA_CHECK_LAUNCH();
    context.passed("outlier overflow");
  }
}

// tile [O, kb] (packed) = columns [k0, k0 + kb) of every row of W, dequantised.
void dequantize_tile(Tensor& tile, const Tensor& weight, const Tensor& weight_scales, int64_t k0, int64_t kb,
                     CUstream_st* stream) {
  const int64_t O = weight.dim(0), K = weight.dim(1);
  const unsigned blocks = unsigned(std::min<int64_t>((O + kTileRowsPerBlock - 1) / kTileRowsPerBlock, 1 << 20));
  const bool vector = tile.dtype == DType::bf16 && K % kTileRun == 0 && k0 % kTileRun == 0 && kb % kTileRun == 0 &&
                      reinterpret_cast<uintptr_t>(weight.data) % sizeof(int4) == 0 &&
                      reinterpret_cast<uintptr_t>(tile.data) % sizeof(uint4) == 0;
  if (vector)
    launch<dequantize_tile_kernel<true>>(blocks, kBlock, 0, stream, cuda::view(tile), weight.ptr<const int8_t>(),
                                         weight_scales.ptr<const float>(), O, K, k0, kb);
  else
    launch<dequantize_tile_kernel<false>>(blocks, kBlock, 0, stream, cuda::view(tile), weight.ptr<const int8_t>(),
                                          weight_scales.ptr<const float>(), O, K, k0, kb);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace

namespace cuda {

bool int8_forward_runs_fused(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& weight_scales,
                             const Int8Epilogue& epilogue, const Int8Context& context) {
  // The library GEMM reads every operand it is handed in 16-byte vectors: a
  // bias that is not f32 goes through an f32 copy of ours.
  const Int8Input* given = epilogue.input;
  const bool f32_bias = epilogue.bias && epilogue.bias->dtype == DType::f32;
  return context.int8_gemm && int8_forward_fuses(out, x, epilogue) &&
         context.int8_gemm->takes(x.cols(), weight.dim(0)) && aligned16(out.data) && aligned16(weight.data) &&
         aligned16(weight_scales.data) && (!f32_bias || aligned16(epilogue.bias->data)) &&
         (!given || (aligned16(given->codes.data) && aligned16(given->row_absmax.data)));
}

void int8_linear_forward(Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& weight_scales,
                         float threshold, const Int8Epilogue& epilogue, int64_t chunk_rows, int64_t gather_columns,
                         int64_t fused_columns, const Int8Context& context) {
  const char* op = "int8_linear_forward";
  const int64_t N = x.rows(), K = x.cols(), O = weight.dim(0);
  FT_CHECK(chunk_rows >= 1, op, ": chunk_rows must be >= 1, got ", chunk_rows);
  FT_CHECK(N < (int64_t(1) << 31), op, ": too many rows (", N, ")");
  if (int8_forward_runs_fused(out, x, weight, weight_scales, epilogue, context)) {
    if (N > 0) fused_forward(out, x, weight, weight_scales, threshold, epilogue, fused_columns, context);
    return;
  }
  // The caller's block as given (int8_forward_chunk_rows for the backend,
  // already balanced): the planner charges exactly [chunk_rows, O].
  const int64_t chunk = std::min(chunk_rows, std::max<int64_t>(1, N));
  FT_CHECK(gather_columns >= 0, op, ": gather_columns must be >= 0, got ", gather_columns);
  const Int8Input* given = epilogue.input;
  const Int8ForwardScratch sizes = int8_forward_scratch(N, K, O, chunk, std::min(gather_columns, K), !given);
  Int8Input own{scratch(context, sizes.codes), scratch(context, sizes.row_scales),
                scratch(context, sizes.outlier_columns), threshold};
  Tensor outlier_weights = scratch(context, sizes.outlier_weights);
  Tensor product = scratch(context, sizes.product);
  if (N == 0 || O == 0) return;
  if (!given) {
    int8_quantize_input(own, x, threshold, epilogue.outlier_flags, epilogue.row_absmax, context);
    given = &own;
  }
  const Tensor &columns = given->outlier_columns, &codes = given->codes, &row_scales = given->row_absmax;
  const OutlierWeights w{outlier_weights.ptr<const int8_t>(), weight.ptr<const int8_t>(), outlier_weights.dim(0)};
  if (w.capacity > 0) {
    launch<gather_outlier_weights_kernel>(elementwise_blocks(w.capacity * O, kBlock), kBlock, 0, context.stream,
                                          outlier_weights.ptr<int8_t>(), w.wq, columns.ptr<const int32_t>(), O, K,
                                          w.capacity);
    FT_CUDA_CHECK_LAUNCH();
    context.passed("gather outlier weights");
  }
  FT_CHECK((O + kBlock - 1) / kBlock <= 65535, op, ": too many output features (", O, ")");
  for (int64_t n0 = 0; n0 < N; n0 += chunk) {
    const int64_t rows = std::min(chunk, N - n0);
    int8_product(product, codes, weight, n0, rows, context);
    context.passed("int8 GEMM");
    const dim3 grid(unsigned((rows + kEpilogueRows - 1) / kEpilogueRows), unsigned((O + kBlock - 1) / kBlock));
    launch<forward_epilogue_kernel>(grid, kBlock, 0, context.stream, view(out),
                                    product.ptr<const int32_t>(), const_view(x), w,
                                    row_scales.ptr<const float>(), weight_scales.ptr<const float>(),
                                    columns.ptr<const int32_t>(), epilogue_views(epilogue), n0, rows, O, K);
    FT_CUDA_CHECK_LAUNCH();
    context.passed("epilogue");
  }
}

void int8_quantize_input(Int8Input& input, const Tensor& x, float threshold, const Tensor* outlier_flags,
                         const Tensor* given_scales, const Int8Context& context) {
  if (x.rows() == 0) return;
  find_outlier_columns(input.outlier_columns, x, threshold, outlier_flags, context.stream);
  context.passed("outlier columns");
  const int32_t* list = input.outlier_columns.ptr<const int32_t>();
  quantize_inliers(input.codes.ptr<int8_t>(), input.row_absmax.ptr<float>(), x,
                   reinterpret_cast<const uint32_t*>(list + 1 + x.cols()),
                   given_scales ? given_scales->ptr<const float>() : nullptr, context.stream);
  context.passed("quantize");
}

// The forward's outlier and absmax passes, writing no codes.
void int8_row_absmax(Tensor& absmax, const Tensor& x, float threshold, const Tensor* outlier_flags,
                     const Int8Context& context) {
  Tensor columns = scratch(context, int8_outlier_columns_scratch(x.cols()));
  if (x.rows() == 0) return;
  find_outlier_columns(columns, x, threshold, outlier_flags, context.stream);
  context.passed("outlier columns");
  const uint32_t* outlier_mask = reinterpret_cast<const uint32_t*>(columns.ptr<const int32_t>() + 1 + x.cols());
  quantize_inliers(nullptr, absmax.ptr<float>(), x, outlier_mask, nullptr, context.stream);
  context.passed("row absmax");
}

void int8_linear_backward(Tensor& dx, const Tensor& dout, const Tensor& weight, const Tensor& weight_scales,
                          bool accumulate, int64_t tile_columns, const Int8Context& context) {
  const char* op = "int8_linear_backward";
  const int64_t N = dout.rows(), O = dout.cols(), K = weight.dim(1);
  FT_CHECK(tile_columns >= 1, op, ": tile_columns must be >= 1, got ", tile_columns);
  if (N == 0 || K == 0) return;
  Tensor w_tile = scratch(context, int8_backward_scratch(O, tile_columns, dout.dtype));
  for (int64_t k0 = 0; k0 < K; k0 += tile_columns) {
    const int64_t kb = std::min(tile_columns, K - k0);
    dequantize_tile(w_tile, weight, weight_scales, k0, kb, context.stream);
    context.passed("dequantize tile");
    backward_block(dx, dout, w_tile, k0, kb, accumulate, context);
    context.passed("dx GEMM");
  }
}

}  // namespace cuda

void CudaBackend::int8_linear_forward_impl(Tensor& out, const Tensor& x, const Tensor& weight,
                                           const Tensor& weight_scales, float threshold, const Int8Epilogue& epilogue) {
  cuda::int8_linear_forward(out, x, weight, weight_scales, threshold, epilogue,
                            int8_forward_chunk_rows(x.rows(), weight.dim(0)),
                            int8_outlier_gather_columns(x.cols(), weight.dim(0)), kInt8FusedOutlierColumns,
                            {*gemm_, allocator_, stream_, int8_gemm_.get()});
}

void CudaBackend::int8_quantize_input_impl(Int8Input& input, const Tensor& x, float threshold,
                                           const Tensor* outlier_flags) {
  cuda::int8_quantize_input(input, x, threshold, outlier_flags, nullptr, {*gemm_, allocator_, stream_});
}

void CudaBackend::int8_outlier_columns_impl(Tensor& flags, const Tensor& x, float threshold) {
  flag_outlier_columns(flags.ptr<int32_t>(), x, threshold, stream_);
}

void CudaBackend::int8_row_absmax_impl(Tensor& absmax, const Tensor& x, float threshold,
                                       const Tensor* outlier_flags) {
  cuda::int8_row_absmax(absmax, x, threshold, outlier_flags, {*gemm_, allocator_, stream_});
}

void CudaBackend::int8_dequantize_impl(Tensor& tile, const Tensor& weight, const Tensor& weight_scales,
                                       int64_t col0) {
  dequantize_tile(tile, weight, weight_scales, col0, tile.cols(), stream_);
}

void CudaBackend::int8_linear_backward_impl(Tensor& dx, const Tensor& dout, const Tensor& weight,
                                            const Tensor& weight_scales, bool accumulate) {
  cuda::int8_linear_backward(dx, dout, weight, weight_scales, accumulate,
                             int8_backward_tile_columns(weight.dim(0), weight.dim(1), kInt8DequantTileElementsGpu),
                             {*gemm_, allocator_, stream_});
}

}  // namespace ft
