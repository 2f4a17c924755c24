// LLM.int8() working-set bounds, shared by every backend and by the memory
// planner (kernels/meta/), so the planner's model of an op's scratch is the
// op's own arithmetic. Both bounds keep the scratch of an int8 linear layer
// independent of the layer's size (GPT-NeoX-20B's MLP weights are 144 MiB).
#pragma once
#include <algorithm>
#include <cstdint>

namespace ft {

// int8_linear_backward dequantises the frozen weight [O, K] one block of
// input-feature columns at a time: a tile [O, kb] with O * kb at most this
// many elements (16 MiB in f32, 8 MiB in bf16).
constexpr int64_t kInt8DequantTileElements = int64_t(4) << 20;

// kb for a weight [out_features, in_features]: a multiple of 64 where the
// budget allows (whole GEMM tiles), at least 1, at most in_features.
inline int64_t int8_backward_tile_columns(int64_t out_features, int64_t in_features) {
  int64_t columns = std::max<int64_t>(1, kInt8DequantTileElements / std::max<int64_t>(1, out_features));
  if (columns >= 64) columns = columns / 64 * 64;
  return std::min(columns, std::max<int64_t>(1, in_features));
}

// int8_linear_forward on the GPU holds the int32 product [rows, O] of the
// codes for a block of rows at a time: rows * O at most this many elements
// (32 MiB of int32).
constexpr int64_t kInt8ProductChunkElements = int64_t(8) << 20;

// Rows per int32 product block: at least 1, at most rows.
inline int64_t int8_forward_chunk_rows(int64_t rows, int64_t out_features) {
  int64_t chunk = std::max<int64_t>(1, kInt8ProductChunkElements / std::max<int64_t>(1, out_features));
  return std::min(chunk, std::max<int64_t>(1, rows));
}

}  // namespace ft
