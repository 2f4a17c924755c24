// A named model parameter: its value and, when trainable, its gradient
// (same shape, f32, category gradients). Frozen parameters have no gradient
// buffer at all, so they cost nothing beyond their weights.
#pragma once
#include <string>

#include "kernels/tensor.h"

namespace ft {

struct Parameter {
  std::string name;  // Hugging Face tensor name, e.g. model.layers.0.self_attn.q_proj.weight
  Tensor value;
  Tensor grad;
  // Only for quantised parameters (value i8 [out, in]): f32 [out] absmax of
  // each row of the full-precision weight, so W ~ value * scales / 127.
  Tensor scales;
  // Only for NF4 parameters (value u8 packed codes, kernels/nf4.h): scales
  // holds the block absmax (f32, or u8 codes with double quantisation, then
  // with these three), nf4_shape the weight's [out, in].
  Tensor nested_absmax;
  Tensor nested_map;
  float nested_offset = 0.0f;
  Shape nf4_shape;

  bool trainable() const { return grad.data != nullptr || grad.storage != nullptr; }
};

// The members a quantized weight keeps its tensors in (undefined ones unused).
inline constexpr Tensor Parameter::*kQuantizedTensors[] = {&Parameter::value, &Parameter::scales,
                                                          &Parameter::nested_absmax, &Parameter::nested_map};

}  // namespace ft
