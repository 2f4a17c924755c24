// NF4, QLoRA's 4-bit quantized base: a frozen weight stored as bitsandbytes
// does (kernels/nf4.h) in a Parameter: value = packed codes u8
// [ceil(O*K/2), 1] (the shape transformers saves); its constants the block
// absmax, f32, or with double quantisation u8 codes followed by the nested
// absmax (f32) and the nested map (f32 [256]), with the nested offset in
// quantized.offset. Saved and loaded in bitsandbytes' 4-bit layout as
// transformers saves a QLoRA model: the codes under the weight's name U8
// plus "<name>.absmax", "<name>.quant_map", "<name>.nested_absmax",
// "<name>.nested_quant_map" and "<name>.quant_state.bitsandbytes__nf4"; a
// layout that does not match p's (other quant_type, blocksize or shape,
// double quantisation on one side only) is an Error naming the file and
// the tensor.
//
// Nf4Linear's forward and backward dequantise tiles and run the GEMM
// (Backend::nf4_linear_forward / nf4_linear_backward); backward yields dx
// only. Bias and LoRA are added as for a dense base.
#pragma once
#include "model/linear.h"
#include "model/quantized_format.h"

namespace ft {

// A saved NF4 base's __metadata__ kQuantizationMetadataKey value.
inline constexpr const char* kQuantizationNf4 = "bitsandbytes_nf4";

const QuantizedFormat& nf4_format();

class Nf4Linear final : public Linear {
 public:
  Nf4Linear(Parameter& weight, Parameter* bias = nullptr);
  void forward(Backend& backend, Tensor& out, const Tensor& x) override;
  void backward(Backend& backend, Tensor* dx, const Tensor& dout, const Tensor& x, bool accumulate_dx) override;
  void weight_columns(Backend& backend, Tensor& tile, int64_t col0) override;

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

}  // namespace ft
