// Linear layers y = x W^T with W stored [out_features, in_features] as in
// PyTorch. Every variant (dense, quantized, with LoRA adapters) has the same
// two calls, so architectures are written once.
#pragma once
#include "kernels/backend.h"
#include "model/parameter.h"

namespace ft {

class Linear {
 public:
  virtual ~Linear() = default;
  // out[N, out_features] = x[N, in_features] W^T.
  virtual void forward(Backend& backend, Tensor& out, const Tensor& x) = 0;
  // dx = dout W (or dx += dout W when accumulate_dx), and trainable
  // parameters' gradients += their share of dout.
  virtual void backward(Backend& backend, Tensor& dx, const Tensor& dout, const Tensor& x, bool accumulate_dx) = 0;
};

// A plain 16/32-bit weight, optionally trainable (full fine-tuning, pretraining).
class DenseLinear final : public Linear {
 public:
  explicit DenseLinear(Parameter& weight) : weight_(weight) {}
  void forward(Backend& backend, Tensor& out, const Tensor& x) override;
  void backward(Backend& backend, Tensor& dx, const Tensor& dout, const Tensor& x, bool accumulate_dx) override;

 private:
  Parameter& weight_;
};

}  // namespace ft
