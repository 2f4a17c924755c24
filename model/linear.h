// Linear layers y = x W^T (+ b) with W stored [out_features, in_features] and
// the optional bias b [out_features] as in PyTorch. Every variant (dense, quantized, with LoRA adapters) has the same
// two calls, so architectures are written once.
#pragma once
#include <any>
#include <initializer_list>
#include <vector>

#include "kernels/backend.h"
#include "model/parameter.h"

namespace ft {

// What a base computes from its input alone (LLM.int8(): x's outlier
// columns, row scales and codes), computed once for the linears that read
// the same x one after another (q/k/v, gate/up) while an InputShare holds
// them: the first base to need it makes it, the others read the same.
class SharedInput {
 public:
  explicit SharedInput(const Tensor& x) : x_(x) {}
  // Whether x is the shared input (the same data and shape).
  bool holds(const Tensor& x) const { return x.data == x_.data && x.shape == x_.shape && x.dtype == x_.dtype; }
  // The value make() returns, made on the first call.
  template <class T, class Make>
  const T& get(Make make) {
    if (!value_.has_value()) value_ = make();
    return std::any_cast<const T&>(value_);
  }

 private:
  Tensor x_;
  std::any value_;
};

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
  // tile [out_features, C] = columns [col0, col0 + C) of W in tile's dtype,
  // dequantised as the layer's own backward reads them (DoRA's weight norm).
  virtual void weight_columns(Backend& backend, Tensor& tile, int64_t col0) = 0;
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
  // Until share_input(nullptr), forwards of shared->x's tensor use shared
  // (set by InputShare); a base with nothing to share ignores it.
  virtual void share_input(SharedInput* /*shared*/) {}
};

// For its lifetime, the given linears' forwards of x share one SharedInput:
// construct it around the calls that read the same x (null entries: none).
class InputShare {
 public:
  InputShare(const Tensor& x, std::initializer_list<Linear*> linears);
  ~InputShare();
  InputShare(const InputShare&) = delete;
  InputShare& operator=(const InputShare&) = delete;

 private:
  SharedInput shared_;
  std::vector<Linear*> linears_;
};

// A plain 16/32-bit weight, optionally trainable (full fine-tuning,
// pretraining), with an optional bias (null: none).
class DenseLinear final : public Linear {
 public:
  explicit DenseLinear(Parameter& weight, Parameter* bias = nullptr) : weight_(weight), bias_(bias) {}
  void forward(Backend& backend, Tensor& out, const Tensor& x) override;
  void backward(Backend& backend, Tensor* dx, const Tensor& dout, const Tensor& x, bool accumulate_dx) override;
  void weight_columns(Backend& backend, Tensor& tile, int64_t col0) override {
    backend.copy_columns(tile, 0, weight_.value, col0, tile.cols());
  }

 private:
  Parameter& weight_;
  Parameter* bias_;
};

// The bias part of every base linear (dense or quantised): out += bias, and
// bias.grad += column sums of dout when the bias trains. Null: no bias.
void add_linear_bias(Backend& backend, Tensor& out, const Parameter* bias);
void linear_bias_backward(Backend& backend, Parameter* bias, const Tensor& dout);

}  // namespace ft
