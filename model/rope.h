// Rotary inverse frequencies as transformers computes them
// (modeling_rope_utils.py, 5.23), in f32 like its float32 tensors: the
// default rope and the linear, dynamic (NTK) and llama3 scalings. The rope op
// (Backend::rope_forward) rotates by float(position) * inv_freq[i].
#pragma once
#include <cstdint>
#include <vector>

#include "model/model_config.h"

namespace ft {

// inv_freq[i] = 1 / theta^(2i / rotary_dim), i < rotary_dim / 2.
std::vector<float> default_rope_inv_freq(float theta, int64_t rotary_dim);

// The model's inv_freq for a step of seq_tokens tokens (positions
// 0..seq_tokens-1): config.rope_scaling applied to the default. Dynamic
// scaling depends on the length: a fresh transformers model in a forward of
// seq_tokens tokens computes the same (it caches the frequencies of the
// longest sequence seen until a sequence shorter than max_position_embeddings
// resets them; each step here uses its own length).
std::vector<float> rope_inv_freq(const ModelConfig& config, int64_t seq_tokens);

}  // namespace ft
