// QLoRA's NF4 linear layer: a frozen weight stored as bitsandbytes does
// (kernels/nf4.h) in a Parameter: value = packed codes u8 [ceil(O*K/2), 1]
// (the shape transformers saves), scales = the block absmax (f32, or u8 with
// double quantisation plus nested_absmax, nested_map and nested_offset).
// Forward and backward dequantise tiles and run the GEMM
// (Backend::nf4_linear_forward / nf4_linear_backward); backward yields dx
// only. Bias and LoRA are added as for a dense base.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "model/linear.h"
#include "model/safetensors.h"

namespace ft {

class Nf4Linear final : public Linear {
 public:
  Nf4Linear(Parameter& weight, Parameter* bias = nullptr);
  void forward(Backend& backend, Tensor& out, const Tensor& x) override;
  void backward(Backend& backend, Tensor* dx, const Tensor& dout, const Tensor& x, bool accumulate_dx) override;

 private:
  Parameter& weight_;
  Parameter* bias_;
};

// The op operand for an NF4 parameter.
Nf4Weight nf4_weight(const Parameter& p);

// Allocates p's NF4 tensors for a weight [out_features, in_features] from
// allocator (the backend's, or pinned host memory for a streamed layer),
// category weights.
void allocate_nf4_parameter(Allocator& allocator, Parameter& p, int64_t out_features, int64_t in_features,
                            bool double_quant);

// Quantises a full-precision [out, in] weight (any floating dtype, host or
// device) into p's NF4 tensors, on the host, as bitsandbytes' quantize_4bit
// with compress_statistics = double quantisation does.
void quantize_nf4_parameter(Backend& backend, Parameter& p, const Tensor& full_precision);

// Loads p from a checkpoint: bitsandbytes' layout as transformers saves it
// (p.name as U8 codes plus "<name>.absmax", "<name>.quant_map",
// "<name>.nested_absmax", "<name>.nested_quant_map" and
// "<name>.quant_state.bitsandbytes__nf4") taken as it is, or a 16/32-bit
// weight quantised here. A layout that does not match p's (other quant_type,
// blocksize or shape, double quantisation on one side only) is an Error
// naming the file and the tensor.
void load_nf4_parameter(Backend& backend, const Checkpoint& checkpoint, Parameter& p);

// The tensors save_quantized_base writes for p, in that layout: host copies
// from `host`, which must outlive them. weight_dtype: the quant state's dtype.
std::vector<std::pair<std::string, Tensor>> nf4_state_dict(Backend& backend, const Parameter& p, DType weight_dtype,
                                                           Allocator& host);

}  // namespace ft
