// A named model parameter: its value and, when trainable, its gradient
// (same shape, f32, category gradients). Frozen parameters have no gradient
// buffer at all, so they cost nothing beyond their weights.
#pragma once
#include <string>
#include <vector>

#include "kernels/tensor.h"
#include "model/model_options.h"

namespace ft {

// A frozen quantized weight's tensors beyond its codes (the parameter's
// value), laid out by its format (model/quantized_format.h), which alone
// reads them: the rest of the model only holds, moves and counts them.
struct QuantizedTensors {
  QuantizedBase format = QuantizedBase::none;  // none: a dense parameter
  Shape shape;                                 // the weight's [out, in]; the codes' shape may differ
  std::vector<Tensor> constants;               // what dequantises the codes, in the format's order
  float offset = 0.0f;                         // a scalar constant of the weight (NF4: the nested offset)
};

// Under tensor parallelism (model/tensor_parallel.h) the part of the whole
// tensor a rank holds: [offset, offset + its own size) along dim, of full.
// dim -1: the whole tensor. replicas: how many neighbouring ranks of the
// group hold this same slice (key/value heads fewer than the ranks), each
// with its share of the slice's gradient.
struct TensorSlice {
  int dim = -1;
  int64_t offset = 0, full = 0;
  int64_t replicas = 1;
  bool whole() const { return dim < 0; }
};

struct Parameter {
  std::string name;  // Hugging Face tensor name, e.g. model.layers.0.self_attn.q_proj.weight
  Tensor value;      // a quantized weight's codes
  Tensor grad;
  QuantizedTensors quantized;
  TensorSlice slice;
  // Tensor parallel: a replicated parameter whose gradient each rank holds
  // only its share of (LoRA's A over a column-parallel base, B over a
  // row-parallel one): summed over the tensor group before it is used.
  bool partial_grad = false;

  bool trainable() const { return grad.data != nullptr || grad.storage != nullptr; }
  bool is_quantized() const { return quantized.format != QuantizedBase::none; }
  // The weight's shape, whatever holds it.
  const Shape& shape() const { return is_quantized() ? quantized.shape : value.shape; }
};

// The shape of the whole tensor p holds a slice of (p.shape() when whole).
inline Shape whole_shape(const Parameter& p) {
  Shape shape = p.shape();
  if (!p.slice.whole()) shape[size_t(p.slice.dim)] = p.slice.full;
  return shape;
}

// The tensors holding p's weight: value, then a quantized weight's constants.
inline std::vector<Tensor*> weight_tensors(Parameter& p) {
  std::vector<Tensor*> tensors{&p.value};
  for (Tensor& constant : p.quantized.constants) tensors.push_back(&constant);
  return tensors;
}

}  // namespace ft
