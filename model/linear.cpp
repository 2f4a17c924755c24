#include "model/linear.h"

namespace ft {

void DenseLinear::forward(Backend& backend, Tensor& out, const Tensor& x) {
  backend.matmul(out, x, weight_.value, false, true);
}

void DenseLinear::backward(Backend& backend, Tensor& dx, const Tensor& dout, const Tensor& x, bool accumulate_dx) {
  backend.matmul(dx, dout, weight_.value, false, false, 1.0f, accumulate_dx ? 1.0f : 0.0f);
  if (weight_.trainable()) backend.matmul(weight_.grad, dout, x, true, false, 1.0f, 1.0f);
}

}  // namespace ft
