// What each CUDA op allocates beyond its operands (category workspace, held
// while the op runs), as a function of the operands' shapes and dtypes.
// CudaBackend allocates exactly these tensors and the memory planner
// (kernels/meta/) charges them, so a plan is the CUDA path's own arithmetic.
// Also here, for the same reason: cuBLASLt's workspace and the caching
// allocator's block rounding (kernels/caching_allocator.h). Plain C++
// without CUDA, like kernels/int8_tiles.h (whose sizes the int8 ops use).
#pragma once
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "kernels/allocator.h"
#include "kernels/int8_tiles.h"
#include "kernels/nf4.h"
#include "kernels/op_operands.h"
#include "kernels/tensor.h"

namespace ft::cuda {

struct ScratchTensor {
  Shape shape;
  DType dtype;
};

// ---- not an op's: the GEMM engine and the caching allocator ----------------

// cuBLASLt's workspace, allocated once per backend (category workspace), as llm.c.
constexpr size_t kCublasLtWorkspaceBytes = size_t(32) << 20;

// CachingAllocator's size class of a request: multiples of 512 bytes up to
// 1 MiB, above that multiples of 1/8 of the request's power of two (<= 12.5%
// waste), so slightly different large sizes (e.g. another sequence length)
// share blocks.
inline size_t caching_size_class(size_t bytes) {
  constexpr size_t kSmallLimit = size_t(1) << 20;
  size_t step = bytes <= kSmallLimit ? 512 : std::bit_floor(bytes) / 8;
  return (bytes + step - 1) / step * step;
}
// Whether CachingAllocator caches blocks of this category (the step's transient tensors).
inline bool caching_caches(MemCategory category) {
  return category == MemCategory::activations || category == MemCategory::workspace;
}
// The bytes a request occupies: its size class when cached, else the request
// rounded to 512 bytes (cudaMalloc's alignment is 256).
inline size_t caching_block_bytes(size_t bytes, MemCategory category) {
  return caching_caches(category) ? caching_size_class(bytes) : (bytes + 511) / 512 * 512;
}

// ---- copy ------------------------------------------------------------------

// A dtype-converting copy converts on the device: a host source is staged
// there first, a host destination is converted there first.
inline std::optional<ScratchTensor> copy_scratch(const Tensor& dst, const Tensor& src) {
  if (dst.dtype == src.dtype) return std::nullopt;
  if (src.device == Device::cpu) return ScratchTensor{src.shape, src.dtype};
  if (dst.device == Device::cpu) return ScratchTensor{dst.shape, dst.dtype};
  return std::nullopt;
}

// ---- matmul ----------------------------------------------------------------

// A mixed-dtype product widens its bf16 operand to f32 first.
inline std::optional<ScratchTensor> matmul_scratch(const Tensor& a, const Tensor& b) {
  if (a.dtype == b.dtype) return std::nullopt;
  return ScratchTensor{(a.dtype == DType::bf16 ? a : b).shape, DType::f32};
}

// ---- bias_backward and the norms' parameter gradients ----------------------

// Deterministic reductions without float atomics (parameter gradients of
// norms and biases, sum_squares): at most this many blocks each reduce a fixed
// strided subset of rows into their own row of f32 partials, which a second
// kernel adds up in block order.
constexpr int64_t kMaxPartialRows = 256;

inline int64_t partial_rows(int64_t rows) { return std::min(rows, kMaxPartialRows); }

// One f32 row of partial column sums per block, per parameter gradient.
inline ScratchTensor column_partials_scratch(int64_t rows, int64_t channels) {
  return {{partial_rows(rows), channels}, DType::f32};
}

// ---- attention_backward ----------------------------------------------------

// The tensor-core kernels (attention_tc.cu) run when q, k and v are all bf16
// (the bf16 activation path); f32 and mixed operands take the f32 kernels.
inline bool attention_uses_tensor_cores(const HeadsView& q, const HeadsView& k, const HeadsView& v) {
  return q.dtype() == DType::bf16 && k.dtype() == DType::bf16 && v.dtype() == DType::bf16;
}

struct AttentionBackwardScratch {
  ScratchTensor di;                       // f32 [B, Hq, T] (lse's shape): rowsum(dO * O)
  std::optional<ScratchTensor> dq_accum;  // tensor cores only: f32 [B, T, Hq, D], dQ summed over key tiles
};
inline AttentionBackwardScratch attention_backward_scratch(const HeadsView& q, const HeadsView& k,
                                                           const HeadsView& v) {
  const int64_t B = q.dim(0), T = q.dim(1), Hq = q.dim(2), D = q.dim(3);
  AttentionBackwardScratch s{{{B, Hq, T}, DType::f32}, std::nullopt};
  if (attention_uses_tensor_cores(q, k, v)) s.dq_accum = ScratchTensor{{B, T, Hq, D}, DType::f32};
  return s;
}

// The workspace the library attention engine (cuDNN SDPA, attention_engine.h)
// takes per call, whatever cuDNN asks for up to it. Forward: two f32
// [B, Hq, T] rows. Backward: an f32 [B, Hq, T, D] dQ accumulator and an f32
// [B, Hq, T] row, and with grouped-query heads also dK and dV in bf16 per
// query head ([B, Hq, T, D] each), which cuDNN sums into the kv heads. On an
// H100 (cuDNN 9, B=2 T=77 Hq=8 Hkv=2 D=64) it asked for exactly those bytes
// plus 272; kSdpaWorkspaceSlackBytes covers such alignment. A problem whose
// cuDNN plan wants more runs on our kernels instead.
inline constexpr size_t kSdpaWorkspaceSlackBytes = 4096;
inline size_t sdpa_workspace_budget_bytes(int64_t batch, int64_t q_heads, int64_t kv_heads, int64_t seq,
                                          int64_t head_dim, bool backward) {
  const size_t rows = size_t(batch * q_heads * seq);
  if (!backward) return rows * 2 * sizeof(float) + kSdpaWorkspaceSlackBytes;
  const size_t grouped_grads = kv_heads < q_heads ? 2 * rows * size_t(head_dim) * 2 : 0;
  return rows * size_t(head_dim + 1) * sizeof(float) + grouped_grads + kSdpaWorkspaceSlackBytes;
}
inline ScratchTensor sdpa_workspace_scratch(int64_t batch, int64_t q_heads, int64_t kv_heads, int64_t seq,
                                            int64_t head_dim, bool backward) {
  return {{int64_t(sdpa_workspace_budget_bytes(batch, q_heads, kv_heads, seq, head_dim, backward))}, DType::i8};
}

// ---- LLM.int8() --------------------------------------------------------------

// The outlier columns of x [N, K] as the int8 ops find them (the count, the
// columns, then their bit mask): int8_linear_forward's and int8_row_absmax's.
inline ScratchTensor int8_outlier_columns_scratch(int64_t K) { return {{int8_outlier_list_elements(K)}, DType::i32}; }

// int8_linear_forward on x [N, K] and weight [O, K], holding the int32 product
// of chunk_rows rows at a time (int8_forward_chunk_rows for the backend). The
// outlier product reads x and W in place and the epilogue its operands: no
// data-dependent buffers, so the plan does not depend on a batch's outliers.
// The gathered outlier weights hold gather_columns columns
// (int8_outlier_gather_columns for the backend), not the batch's outlier count.
// Given x quantised (Int8Epilogue::input, !quantizes_input), the op holds no
// outlier columns, codes or row scales of its own (empty tensors).
struct Int8ForwardScratch {
  ScratchTensor outlier_columns;  // i32 [K + 1 + ceil(K / 32)]: the count, the columns, then their bit mask
  ScratchTensor outlier_weights;  // i8 [gather columns, O]: W's outlier columns, gathered
  ScratchTensor codes;            // i8 [N, K]: x's inlier codes
  ScratchTensor row_scales;       // f32 [N]: x's row scales
  ScratchTensor product;          // i32 [chunk_rows, O]: one block of the product
};
inline Int8ForwardScratch int8_forward_scratch(int64_t N, int64_t K, int64_t O, int64_t chunk_rows,
                                               int64_t gather_columns, bool quantizes_input) {
  const int64_t rows = quantizes_input ? N : 0;
  return {quantizes_input ? int8_outlier_columns_scratch(K) : ScratchTensor{{0}, DType::i32},
          {{gather_columns, O}, DType::i8},
          {{rows, K}, DType::i8},
          {{rows}, DType::f32},
          {{chunk_rows, O}, DType::i32}};
}

// The fused forward (int8_linear.cu, a library int8 GEMM: int8_gemm_engine.h)
// runs where the backend has the engine, the engine takes K -> O and x, out
// and LoRA's h are bf16. CUTLASS's Hopper kernel reads rows of codes and
// writes rows of out through TMA, which needs 16-byte rows: K % 16 == 0 (i8)
// and O % 8 == 0 (bf16). Operands must start 16-byte aligned too, as every
// tensor an allocator hands out does; the planner assumes they do.
inline bool int8_scaled_gemm_takes(int64_t K, int64_t O) {
  return K > 0 && O > 0 && K % 16 == 0 && O % 8 == 0 && K < (int64_t(1) << 31) && O < (int64_t(1) << 31);
}
inline bool int8_forward_fuses(const Tensor& out, const Tensor& x, const Int8Epilogue& epilogue) {
  return out.dtype == DType::bf16 && x.dtype == DType::bf16 &&
         (!epilogue.lora_h || epilogue.lora_h->dtype == DType::bf16);
}
// Its scratch: the input side as Int8ForwardScratch, the bias widened to f32
// where it is not f32, and the small GEMM's operands [x's outlier columns
// (the first `columns`, zero past the count) | h] and [their dequantised
// weight columns | scaling * B], bf16, rows padded to 8 elements (16 bytes).
struct Int8FusedScratch {
  ScratchTensor outlier_columns, codes, row_scales;
  ScratchTensor bias;    // f32 [O] or [0]
  ScratchTensor side_x;  // bf16 [N, width]
  ScratchTensor side_w;  // bf16 [O, width]
};
inline int64_t int8_fused_side_width(int64_t columns, int64_t lora_r) { return (columns + lora_r + 7) / 8 * 8; }
inline Int8FusedScratch int8_fused_scratch(int64_t N, int64_t K, int64_t O, int64_t columns, int64_t lora_r,
                                           bool widens_bias, bool quantizes_input) {
  const int64_t rows = quantizes_input ? N : 0, width = int8_fused_side_width(columns, lora_r);
  return {quantizes_input ? int8_outlier_columns_scratch(K) : ScratchTensor{{0}, DType::i32},
          {{rows, K}, DType::i8},
          {{rows}, DType::f32},
          {{widens_bias ? O : 0}, DType::f32},
          {{N, width}, DType::bf16},
          {{O, width}, DType::bf16}};
}

// int8_linear_backward's dequantised weight tile [O, tile_columns] in dout's
// dtype (int8_backward_tile_columns with kInt8DequantTileElementsGpu for the
// backend); dx is written in place.
inline ScratchTensor int8_backward_scratch(int64_t O, int64_t tile_columns, DType dout_dtype) {
  return {{O, tile_columns}, dout_dtype};
}

// ---- NF4 (QLoRA) ---------------------------------------------------------------

// Backend::nf4_linear_forward on x [N, K] and an NF4 weight [O, K]: the
// dequantised rows [tile_rows, K] in x's dtype, and, when the rows do not
// cover all of O, one block of out [N, tile_rows] in out's dtype.
struct Nf4Scratch {
  ScratchTensor tile;
  ScratchTensor block;  // empty shape {0}: out is written in place
};
inline Nf4Scratch nf4_forward_scratch(int64_t N, int64_t K, int64_t O, DType x_dtype, DType out_dtype) {
  const int64_t rows = nf4_tile_rows(O, K);
  return {{{rows, K}, x_dtype}, {{rows < O ? N : 0, rows}, out_dtype}};
}
// Backend::nf4_linear_backward: the dequantised columns [O, tile_columns] in
// dout's dtype and, when they do not cover all of K, one block of dx
// [N, tile_columns] in dx's dtype.
inline Nf4Scratch nf4_backward_scratch(int64_t N, int64_t K, int64_t O, DType dout_dtype, DType dx_dtype) {
  const int64_t columns = int8_backward_tile_columns(O, K);
  return {{{O, columns}, dout_dtype}, {{columns < K ? N : 0, columns}, dx_dtype}};
}

// ---- optimizer -----------------------------------------------------------------

// sum_squares's blocks of 256 threads over n elements: a fixed function of n,
// so the same partition, and the same sum, on every GPU and run.
inline int64_t sum_squares_blocks(int64_t n) { return std::min((n + 255) / 256, kMaxPartialRows); }

// The partial sums of sum_squares and sum_squares_many (blocks in all), then
// the total: doubles, which have no DType, as 8 bytes each of i8.
inline ScratchTensor sum_squares_scratch(int64_t blocks) { return {{blocks + 1, 8}, DType::i8}; }

// The device tables of adamw_update_many and sum_squares_many, one entry per
// non-empty tensor, built per call in scratch; block b of the launch works on
// the last entry whose first_block <= b.
struct AdamWEntry {
  float* param;
  const float* grad;
  float* m;
  float* v;
  int64_t numel, first_block;
  float decay;  // 1 - lr * weight_decay, the tensor's own
};
struct SumSquaresEntry {
  const void* data;
  int64_t numel, first_block, blocks;
  DType dtype;
};
template <class Entry>
ScratchTensor table_scratch(int64_t entries) {
  return {{entries * int64_t(sizeof(Entry))}, DType::i8};
}

}  // namespace ft::cuda
