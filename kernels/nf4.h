// NF4 (QLoRA's 4-bit NormalFloat) exactly as bitsandbytes stores it, on the
// host: shared by the CPU backend's NF4 linear ops, weight loading and
// saving, and the tests. The CUDA kernels use the same code table
// (kernels/cuda/nf4_linear.cu).
//
// Layout (bitsandbytes.functional.quantize_4bit, quant_type "nf4"): the
// weight [O, K] is flattened row-major and cut into blocks of 64 elements
// (the last may be short); each block is scaled by its absmax and every
// element replaced by the index of the nearest of the 16 NF4 codes; two
// indices per byte, the even element in the HIGH nibble. With double
// quantisation the f32 absmax constants, minus their mean (the offset), are
// quantised again to 8 bits in blocks of 256 with bitsandbytes' dynamic map
// (create_dynamic_map), each block keeping its own f32 absmax.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/int8_tiles.h"

namespace ft {

constexpr int64_t kNf4BlockSize = 64;         // elements per absmax (bnb blocksize)
constexpr int64_t kNf4NestedBlockSize = 256;  // absmax constants per nested absmax

// bitsandbytes' NF4 code values (functional.get_4bit_type("nf4")), ascending.
inline constexpr float kNf4Codes[16] = {
    -1.0f,          -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f,  0.16093020141124725f,  0.24611230194568634f,  0.33791524171829224f,
    0.44070982933044434f,  0.5626170039176941f,   0.7229568362236023f,   1.0f};

inline int64_t nf4_blocks(int64_t elements) { return (elements + kNf4BlockSize - 1) / kNf4BlockSize; }
inline int64_t nf4_packed_bytes(int64_t elements) { return (elements + 1) / 2; }
inline int64_t nf4_nested_blocks(int64_t blocks) { return (blocks + kNf4NestedBlockSize - 1) / kNf4NestedBlockSize; }

// The 4-bit index of element e (flat, row-major) in the packed codes.
inline int nf4_index(const uint8_t* packed, int64_t e) {
  const uint8_t byte = packed[e / 2];
  return e % 2 == 0 ? byte >> 4 : byte & 0x0f;
}

// Element e dequantised as bitsandbytes does: code * absmax in f32.
inline float nf4_value(const uint8_t* packed, const float* block_absmax, int64_t e) {
  return kNf4Codes[nf4_index(packed, e)] * block_absmax[e / kNf4BlockSize];
}

// Rows of the weight [O, K] that Backend::nf4_linear_forward dequantises at a
// time: a tile of at most kInt8DequantTileElements (kernels/int8_tiles.h)
// elements, at least one row, at most O.
inline int64_t nf4_tile_rows(int64_t out_features, int64_t in_features) {
  const int64_t rows = std::max<int64_t>(1, kInt8DequantTileElements / std::max<int64_t>(1, in_features));
  return std::min(rows, std::max<int64_t>(1, out_features));
}

// Quantises x[0 .. n) into packed (nf4_packed_bytes(n)) and absmax
// (nf4_blocks(n) f32), as bitsandbytes' CPU quantize_4bit: per block
// absmax = max |x|, s = clamp(x * (1 / max(absmax, 1e-38)), -1, 1) in f32,
// and the index is the number of code midpoints (f32) strictly below s, so a
// value exactly on a midpoint takes the lower code. An odd n pads with index 0.
void nf4_quantize(const float* x, int64_t n, uint8_t* packed, float* absmax);

// bitsandbytes' signed 8-bit dynamic map (create_dynamic_map(signed=True)):
// 256 f32 values, ascending, from -0.99297 to 1.
std::vector<float> dynamic_map_8bit();

// Double quantisation of absmax[0 .. blocks): offset = their mean (in f32,
// summed as PyTorch's CPU torch.mean does), then bitsandbytes' CPU quantize_blockwise of
// absmax - offset with the dynamic map in blocks of 256: nested_absmax = max
// |d| per block, and each code the nearest map value to d / nested_absmax,
// ties to the lower one, with the map's first value read as -1 (the native
// kernel's binary search does).
struct Nf4DoubleQuant {
  std::vector<uint8_t> codes;        // [blocks]
  std::vector<float> nested_absmax;  // [nf4_nested_blocks(blocks)]
  float offset = 0.0f;
};
Nf4DoubleQuant nf4_double_quantize(const float* absmax, int64_t blocks, const std::vector<float>& map);

// absmax[b] = map[codes[b]] * nested_absmax[b / 256] + offset in f32, as
// bitsandbytes' dequantize_4bit recovers them.
void nf4_dequantize_absmax(float* absmax, const uint8_t* codes, int64_t blocks, const float* nested_absmax,
                           const float* map, float offset);

}  // namespace ft
