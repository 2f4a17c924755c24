#include "model/int8_linear.h"

#include "kernels/error.h"

namespace ft {

Int8Linear::Int8Linear(Parameter& weight, float threshold, Parameter* bias)
    : weight_(weight), threshold_(threshold), bias_(bias) {
  FT_CHECK(weight.value.dtype == DType::i8 && weight.value.ndim() == 2 && weight.scales.defined(), "Int8Linear: \"",
           weight.name, "\" is not a quantised weight (call quantize_parameter first)");
  FT_CHECK(!weight.trainable(), "Int8Linear: \"", weight.name, "\" is int8 and cannot be trainable");
}

void Int8Linear::forward(Backend& backend, Tensor& out, const Tensor& x) { forward_fused(backend, out, x, {}); }

void Int8Linear::forward_with_lora(Backend& backend, Tensor& out, const Tensor& x, const Tensor& h, const Tensor& B,
                                   float scaling) {
  forward_fused(backend, out, x, {nullptr, &h, &B, scaling});
}

// The op with the bias (if any) added to the given epilogue.
void Int8Linear::forward_fused(Backend& backend, Tensor& out, const Tensor& x, Int8Epilogue epilogue) {
  if (bias_) epilogue.bias = &bias_->value;
  backend.int8_linear_forward(out, x, weight_.value, weight_.scales, threshold_, epilogue);
}

void Int8Linear::backward(Backend& backend, Tensor* dx, const Tensor& dout, const Tensor&, bool accumulate_dx) {
  if (dx) backend.int8_linear_backward(*dx, dout, weight_.value, weight_.scales, accumulate_dx);
  linear_bias_backward(backend, bias_, dout);
}

void quantize_parameter(Backend& backend, Parameter& p, const Tensor& full_precision) {
  FT_CHECK(full_precision.ndim() == 2, "quantize_parameter: \"", p.name, "\" must be 2-D [out, in], got ",
           shape_string(full_precision.shape));
  Tensor source = full_precision;
  if (full_precision.device != backend.allocator().device()) {
    source = backend.empty(full_precision.shape, full_precision.dtype, MemCategory::workspace);
    backend.copy(source, full_precision);
  }
  if (p.value.dtype != DType::i8 || p.value.shape != full_precision.shape) {
    p.value = backend.empty(full_precision.shape, DType::i8, MemCategory::weights);
    p.scales = backend.empty({full_precision.dim(0)}, DType::f32, MemCategory::weights);
  }
  backend.quantize_rows_int8(p.value, p.scales, source);
}

}  // namespace ft
