// LLM.int8() linear layer: a frozen weight stored as i8 codes [out, in] in
// weight.value plus f32 row scales [out] in weight.scales. Forward routes the
// outlier input columns (any |x| >= threshold) through an f32 product and the
// rest through int8 x int8 -> int32; backward yields dx only (no weight
// gradient: the weight never trains). An optional bias stays in 16/32 bits,
// as bitsandbytes keeps it; it and a LoRA update are added in the op's
// epilogue (Backend::int8_linear_forward), so out is written once.
#pragma once
#include "model/linear.h"

namespace ft {

class Int8Linear final : public Linear {
 public:
  // threshold: bitsandbytes' llm_int8_threshold (transformers' default 6.0; 0
  // disables the outlier path). bias: null for none.
  Int8Linear(Parameter& weight, float threshold, Parameter* bias = nullptr);
  void forward(Backend& backend, Tensor& out, const Tensor& x) override;
  void forward_with_lora(Backend& backend, Tensor& out, const Tensor& x, const Tensor& h, const Tensor& B,
                         float scaling) override;
  void backward(Backend& backend, Tensor* dx, const Tensor& dout, const Tensor& x, bool accumulate_dx) override;

 private:
  void forward_fused(Backend& backend, Tensor& out, const Tensor& x, Int8Epilogue epilogue);

  Parameter& weight_;
  float threshold_;
  Parameter* bias_;
};

// Sets p.value to the i8 codes [out, in] and p.scales (f32 [out]) of a
// full-precision [out, in] weight; used at load time. Reuses p.value/p.scales
// when the model already allocated them (i8 of that shape), else allocates
// both on the backend as weights. The full-precision tensor may live on the host.
void quantize_parameter(Backend& backend, Parameter& p, const Tensor& full_precision);

}  // namespace ft
