// LLM.int8() working-set bounds, shared by every backend and by the memory
// planner (kernels/meta/), so the planner's model of an op's scratch is the
// op's own arithmetic. Both bounds keep the scratch of an int8 linear layer
// independent of the layer's size (GPT-NeoX-20B's MLP weights are 144 MiB).
#pragma once
#include <algorithm>
#include <cstdint>

#include "kernels/dtype.h"

namespace ft {

// int8_linear_backward dequantises the frozen weight [O, K] one block of
// input-feature columns at a time: a tile [O, kb] with O * kb at most this
// many elements (16 MiB in f32, 8 MiB in bf16). The CPU's budget: its tile
// stays in cache-friendly sizes.
constexpr int64_t kInt8DequantTileElements = int64_t(4) << 20;
// The CPU's tile dtype for dout's: bf16 for bf16 dout (the GPU's tile, whose
// dtype is dout's, value for value), else f32 (the CPU's GEMMs take f32 and
// bf16 operands).
inline DType int8_backward_cpu_tile_dtype(DType dout_dtype) {
  return dout_dtype == DType::bf16 ? DType::bf16 : DType::f32;
}
// The GPU's budget (128 MiB in bf16): a few wide GEMMs per weight instead of
// dozens of narrow ones (GPT-NeoX-20B: 9 per layer, not 129), each tile
// dequantised once, within the memory planner's budget (it charges the tile).
constexpr int64_t kInt8DequantTileElementsGpu = int64_t(64) << 20;

// kb for a weight [out_features, in_features] under a tile budget of
// tile_elements: the fewest blocks the budget allows, split evenly (no narrow
// tail block), a multiple of 64 where the budget allows (whole GEMM tiles),
// at least 1, at most in_features.
inline int64_t int8_backward_tile_columns(int64_t out_features, int64_t in_features,
                                          int64_t tile_elements = kInt8DequantTileElements) {
  const int64_t K = std::max<int64_t>(1, in_features);
  int64_t most = std::max<int64_t>(1, tile_elements / std::max<int64_t>(1, out_features));
  if (most >= 64) most = most / 64 * 64;
  if (most >= K) return K;
  const int64_t blocks = (K + most - 1) / most;
  const int64_t even = (K + blocks - 1) / blocks, rounded = (even + 63) / 64 * 64;
  return rounded <= most ? rounded : even;
}

// The rows of each of the fewest chunks of at most `most` rows that cover
// `rows`, as even as whole rows allow (no 2-row tail after full chunks).
// Idempotent: balanced_chunk_rows(rows, balanced_chunk_rows(rows, m)) is the same.
inline int64_t balanced_chunk_rows(int64_t rows, int64_t most) {
  rows = std::max<int64_t>(1, rows);
  most = std::max<int64_t>(1, most);
  const int64_t chunks = (rows + most - 1) / most;
  return (rows + chunks - 1) / chunks;
}

// int8_linear_forward on the GPU holds the int32 product [rows, O] of the
// codes for a block of rows at a time: rows * O at most this many elements
// (96 MiB of int32: GPT-NeoX-20B's widest products, 2048 x 18432 and
// 2048 x 24576, in two blocks of 1024 rows).
constexpr int64_t kInt8ProductChunkElements = int64_t(24) << 20;
// Row blocks of the int8 GEMM are whole multiples of this where the budget
// allows: a block of 410 rows fills four 128-row GEMM tiles to 80%.
constexpr int64_t kInt8ProductRowGranule = 128;

// Rows per int32 product block: at least 1, at most rows, balanced, rounded up
// to a multiple of kInt8ProductRowGranule while that stays within the budget.
inline int64_t int8_forward_chunk_rows(int64_t rows, int64_t out_features) {
  const int64_t most = std::max<int64_t>(1, kInt8ProductChunkElements / std::max<int64_t>(1, out_features));
  const int64_t chunk = balanced_chunk_rows(rows, most);
  const int64_t rounded = (chunk + kInt8ProductRowGranule - 1) / kInt8ProductRowGranule * kInt8ProductRowGranule;
  return chunk < rows && rounded <= most ? rounded : chunk;
}

// The CPU's oneDNN int32 product [rows, O] (host memory) is held for rows * O
// of at most this many elements at a time (32 MiB of int32), in balanced blocks.
constexpr int64_t kInt8CpuProductChunkElements = int64_t(8) << 20;

// The GPU forward gathers the weight codes of up to this many elements' worth
// of outlier columns ([c, O] i8, 8 MiB) into one contiguous buffer per call,
// so its epilogue reads them coalesced; columns past it (rare: LLM.int8()'s
// outliers are a few dozen columns) are read in place.
constexpr int64_t kInt8OutlierGatherElements = int64_t(8) << 20;

inline int64_t int8_outlier_gather_columns(int64_t in_features, int64_t out_features) {
  const int64_t most = std::max<int64_t>(1, kInt8OutlierGatherElements / std::max<int64_t>(1, out_features));
  return std::min(most, std::max<int64_t>(0, in_features));
}

// The fused GPU forward (a library int8 GEMM writes the dequantised product)
// adds up to this many outlier columns to it with LoRA's update as one small
// bf16 GEMM whose inner size is fixed on the host (the count is known only
// on the device): columns past it, rarely any, are added in place.
constexpr int64_t kInt8FusedOutlierColumns = 64;

}  // namespace ft
