#include "model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "kernels/error.h"

namespace ft {

std::vector<float> default_rope_inv_freq(float theta, int64_t rotary_dim) {
  std::vector<float> inv_freq(size_t(rotary_dim / 2));
  for (size_t i = 0; i < inv_freq.size(); ++i)
    inv_freq[i] = 1.0f / std::pow(theta, float(2 * i) / float(rotary_dim));
  return inv_freq;
}

namespace {

// _compute_llama3_parameters: wavelengths above original / low_freq_factor
// are divided by factor, those below original / high_freq_factor are kept,
// and the band between is interpolated. Python scalars meet f32 tensors, so
// every operation is an f32 one; scalar / tensor is torch's reciprocal(tensor)
// * scalar.
std::vector<float> llama3_inv_freq(std::vector<float> inv_freq, const RopeScaling& s) {
  const float factor = float(s.factor), low = float(s.low_freq_factor);
  const float old_context = float(s.original_max_position_embeddings);
  const float low_freq_wavelen = float(double(s.original_max_position_embeddings) / s.low_freq_factor);
  const float high_freq_wavelen = float(double(s.original_max_position_embeddings) / s.high_freq_factor);
  const float band = float(s.high_freq_factor - s.low_freq_factor);
  for (float& f : inv_freq) {
    const float wavelen = (1.0f / f) * float(2.0 * std::numbers::pi);
    const float scaled = wavelen > low_freq_wavelen ? f / factor : f;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    if (!medium) {
      f = scaled;
      continue;
    }
    const float smooth = ((1.0f / wavelen) * old_context - low) / band;
    const float low_part = (1.0f - smooth) * scaled / factor;
    const float high_part = smooth * scaled;
    f = low_part + high_part;
  }
  return inv_freq;
}

// _compute_dynamic_ntk_parameters for a sequence of seq_tokens: the base
// grows once seq_tokens exceeds max_position_embeddings. seq_len is a tensor
// there (max(position_ids) + 1), so the base is computed in f32 too.
std::vector<float> dynamic_inv_freq(const ModelConfig& config, int64_t seq_tokens) {
  const int64_t dim = config.rotary_dim(), max_positions = config.max_position_embeddings;
  const float seq_len = float(std::max(seq_tokens, max_positions));
  const float factor = float(config.rope_scaling.factor);
  const float stretch = factor * seq_len / float(max_positions) - float(config.rope_scaling.factor - 1.0);
  const float base = config.rope_theta * std::pow(stretch, float(double(dim) / double(dim - 2)));
  return default_rope_inv_freq(base, dim);
}

}  // namespace

std::vector<float> rope_inv_freq(const ModelConfig& config, int64_t seq_tokens) {
  const RopeScaling& scaling = config.rope_scaling;
  if (scaling.type == "dynamic") return dynamic_inv_freq(config, seq_tokens);
  std::vector<float> inv_freq = default_rope_inv_freq(config.rope_theta, config.rotary_dim());
  if (scaling.type == "linear")
    for (float& f : inv_freq) f /= float(scaling.factor);
  else if (scaling.type == "llama3")
    inv_freq = llama3_inv_freq(std::move(inv_freq), scaling);
  else
    FT_CHECK(scaling.type == "default", "rope_type \"", scaling.type, "\" is not supported");
  return inv_freq;
}

}  // namespace ft
