#include "model/linear.h"

namespace ft {

void Linear::forward_with_lora(Backend& backend, Tensor& out, const Tensor& x, const Tensor& h, const Tensor& B,
                               float scaling) {
  forward(backend, out, x);
  backend.matmul(out, h, B, false, true, scaling, 1.0f);
}

InputShare::InputShare(const Tensor& x, std::initializer_list<Linear*> linears) : shared_(x) {
  for (Linear* linear : linears)
    if (linear) linears_.push_back(linear);  // null: an absent linear (T5's wi_1 without a gate)
  for (Linear* linear : linears_) linear->share_input(&shared_);
}

InputShare::~InputShare() {
  for (Linear* linear : linears_) linear->share_input(nullptr);
}

void DenseLinear::forward(Backend& backend, Tensor& out, const Tensor& x) {
  backend.matmul(out, x, weight_.value, false, true);
  add_linear_bias(backend, out, bias_);
}

void DenseLinear::backward(Backend& backend, Tensor* dx, const Tensor& dout, const Tensor& x, bool accumulate_dx) {
  if (dx) backend.matmul(*dx, dout, weight_.value, false, false, 1.0f, accumulate_dx ? 1.0f : 0.0f);
  if (weight_.trainable()) backend.matmul(weight_.grad, dout, x, true, false, 1.0f, 1.0f);
  linear_bias_backward(backend, bias_, dout);
}

void add_linear_bias(Backend& backend, Tensor& out, const Parameter* bias) {
  if (bias) backend.add_bias(out, bias->value);
}

void linear_bias_backward(Backend& backend, Parameter* bias, const Tensor& dout) {
  if (bias && bias->trainable()) backend.bias_backward(bias->grad, dout);
}

}  // namespace ft
