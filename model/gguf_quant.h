// Tensor values to and from the ggml types GGUF export writes, with the same
// rounding as llama.cpp's converter (convert_hf_to_gguf.py and ggml's
// reference quantisers): F16 and BF16 round to nearest even; Q8_0 takes each
// block of 32 values, d = max|x| / 127 (in f32, stored as F16) and codes
// q = roundf(x * (1 / d)) (half away from zero; all zero when d is 0),
// ggml-quants.c's quantize_row_q8_0_ref.
#pragma once
#include <cstdint>
#include <vector>

#include "model/gguf_file.h"

namespace ft {

// numel f32 values as type's bytes (Q8_0: numel a multiple of 32).
std::vector<uint8_t> to_ggml(const float* values, int64_t numel, GgmlType type);
// And back: Q8_0 gives d * q per value.
std::vector<float> from_ggml(const uint8_t* data, int64_t numel, GgmlType type);

}  // namespace ft
