// Every quantized format by its QuantizedBase, and what picks a parameter's
// format for it: assigning its weight from full precision, loading it from a
// checkpoint in whichever layout it is stored.
#pragma once
#include "model/model_config.h"
#include "model/quantized_format.h"

namespace ft {

// The format of a quantized base (not none).
const QuantizedFormat& quantized_format(QuantizedBase base);

// p = a full-precision tensor of its weight's shape: copied, or quantised
// in p's format.
void assign_weight(Backend& backend, Parameter& p, const Tensor& full_precision);

// Loads p from the checkpoint: a tensor saved in p's format as it is, a
// 16/32-bit one copied or quantised (assign_weight). A tensor saved in
// another format, or of another shape, is an Error naming the file and
// the tensor.
void load_parameter(Backend& backend, const Checkpoint& checkpoint, Parameter& p);

// A checkpoint whose config.json says how it is quantised (its
// quantization_config) loads only into a model quantised the same way:
// otherwise an Error naming the config.json, its field and the
// quantization setting it needs.
void check_stored_quantization(const StoredQuantization& stored, const ModelOptions& options);

}  // namespace ft
