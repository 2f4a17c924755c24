// Linear layers y = x W^T (+ b) with W stored [out_features, in_features] and
// the optional bias b [out_features] as in PyTorch. Every variant (dense, quantized, with LoRA adapters) has the same
// two calls, so architectures are written once.
#pragma once
#include "kernels/backend.h"
#include "model/parameter.h"

namespace ft {

class Linear {
 public:
  virtual ~Linear() = default;
  // out[N, out_features] = x[N, in_features] W^T (+ bias).
  virtual void forward(Backend& backend, Tensor& out, const Tensor& x) = 0;
  // out = forward(x) + scaling * h B^T: a LoRA update over this layer, with
  // h [N, r] = dropout(x) A^T and B [out_features, r]. By default forward
  // then a matmul accumulating into out; a base whose output pass can take
  // the product (Int8Linear's epilogue) overrides it to write out once.
  virtual void forward_with_lora(Backend& backend, Tensor& out, const Tensor& x, const Tensor& h, const Tensor& B,
                                 float scaling);
  // dx = dout W (or dx += dout W when accumulate_dx), and trainable
  // parameters' gradients += their share of dout. dx null: no input gradient
  // is wanted (the first layer's, under a frozen embedding), only those.
  virtual void backward(Backend& backend, Tensor* dx, const Tensor& dout, const Tensor& x, bool accumulate_dx) = 0;
  // The following calls' x is rows [row, row + x.rows()) of the step's
  // tokens (a layer run over chunks of tokens): LoRA dropout draws those
  // rows' share of the whole batch's mask, so chunking leaves it unchanged.
  // Nothing else depends on the row.
  virtual void set_first_row(int64_t /*row*/) {}
  // A layer run over chunks of tokens shows a base that scans_rows() every
  // row of the step's batch (scan_rows, in any blocks) before the chunks'
  // forwards, and calls end_scan after them. LLM.int8() picks its outlier
  // columns over the rows of each call, as bitsandbytes does over its batch;
  // scanned, the chunks use the whole batch's columns, so their outputs are
  // the unchunked call's bit for bit.
  virtual bool scans_rows() const { return false; }
  virtual void scan_rows(Backend& /*backend*/, const Tensor& /*x_rows*/) {}
  virtual void end_scan() {}
};

// A plain 16/32-bit weight, optionally trainable (full fine-tuning,
// pretraining), with an optional bias (null: none).
class DenseLinear final : public Linear {
 public:
  explicit DenseLinear(Parameter& weight, Parameter* bias = nullptr) : weight_(weight), bias_(bias) {}
  void forward(Backend& backend, Tensor& out, const Tensor& x) override;
  void backward(Backend& backend, Tensor* dx, const Tensor& dout, const Tensor& x, bool accumulate_dx) override;

 private:
  Parameter& weight_;
  Parameter* bias_;
};

// The bias part of every base linear (dense or quantised): out += bias, and
// bias.grad += column sums of dout when the bias trains. Null: no bias.
void add_linear_bias(Backend& backend, Tensor& out, const Parameter* bias);
void linear_bias_backward(Backend& backend, Parameter* bias, const Tensor& dout);

}  // namespace ft
