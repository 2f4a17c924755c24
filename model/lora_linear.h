// PEFT's LoRA around any base layer (dense or int8):
//   y = base(x) + scaling * (dropout(x) A^T) B^T
// with A [r, in] and B [out, r] trainable parameters owned by the model (f32,
// or bf16 when the optimizer keeps their f32 masters), computed in x's dtype
// (bf16 copies of f32 A and B under bf16 activations),
// dropout only on A's input (p = 0: no dropout op at all). Forward computes
// h = dropout(x) A^T first and hands scaling * h B^T to the base
// (Linear::forward_with_lora), which an int8 base fuses into its output pass.
// Backward recomputes the dropped input and h from the seed instead of
// saving them: at rank r that costs little and frees [N, in] + [N, r] per
// layer.
//
// DoRA (PEFT's use_dora) adds a trainable magnitude m [out], and with
// g = m / ||W + scaling B A||_row, PEFT's
//   y = x W^T + bias + (g - 1) xd W^T + g scaling h B^T,  xd = dropout(x)
// which without dropout is g * (x W^T + scaling h B^T) + bias. The norm is
// a constant of the step (DoRA's section 4.3, PEFT's detach()): no
// gradient flows through it. It is computed a column tile of W at a time
// (the base dequantises its own tiles), never as a full copy, once per
// forward after a backward or an adapter change (so a step's recomputed
// forwards and every decoding step reuse it). Backward recomputes the
// branch z = xd W^T + scaling h B^T for m's gradient rather than keeping
// [N, out] per layer: one more product over W per adapted linear. Under
// dropout xd W^T reads W's dequantised tiles as PEFT's F.linear does, and
// the base runs twice in forward and backward (x's product and xd's).
#pragma once
#include <cstdint>
#include <memory>

#include "kernels/dropout_hash.h"
#include "model/linear.h"

namespace ft {

class LoraLinear final : public Linear {
 public:
  // magnitude: DoRA's m [out] (null: plain LoRA); base_bias: the bias the base
  // adds (null: none), which DoRA leaves unscaled.
  LoraLinear(std::unique_ptr<Linear> base, Parameter& lora_A, Parameter& lora_B, float scaling, float dropout,
             Parameter* magnitude = nullptr, const Parameter* base_bias = nullptr);
  // The dropout mask is a function of (seed, element index): give every
  // layer a distinct seed each step, and keep it for the backward (and any
  // recomputed forward) of that step.
  void set_dropout_seed(uint64_t seed) { dropout_seed_ = seed; }
  void set_first_row(int64_t row) override { first_row_ = row; }
  bool scans_rows() const override { return base_->scans_rows(); }
  void scan_rows(Backend& backend, const Tensor& x_rows) override { base_->scan_rows(backend, x_rows); }
  void end_scan() override { base_->end_scan(); }
  void share_input(SharedInput* shared) override { base_->share_input(shared); }
  // x is columns [first, first + x.cols()) of a layer `full` columns wide (a
  // row-parallel shard): dropout draws those columns' share of the mask.
  void set_input_columns(int64_t first, int64_t full) {
    first_column_ = first;
    full_columns_ = full;
  }
  // Dropout applies only while training (PEFT's nn.Dropout in train mode).
  void set_training(bool training) { training_ = training; }
  // Disabled, the layer is its base alone (PEFT's disable_adapter()): how DPO
  // gets its reference model from the same weights.
  void set_enabled(bool enabled) { enabled_ = enabled; }
  // A, B or m were written other than by a step after backward (an adapter
  // loaded, a state resumed): DoRA's weight norms are recomputed at the next
  // forward.
  void adapters_changed() { norms_current_ = false; }
  // DoRA's initial magnitude, as PEFT's: m = ||W + scaling B A||_row (with B
  // zero, the base weight's row norms). No-op without DoRA.
  void init_magnitude(Backend& backend);
  void forward(Backend& backend, Tensor& out, const Tensor& x) override;
  void backward(Backend& backend, Tensor* dx, const Tensor& dout, const Tensor& x, bool accumulate_dx) override;
  void weight_columns(Backend& backend, Tensor& tile, int64_t col0) override {
    base_->weight_columns(backend, tile, col0);
  }
  Linear& base() { return *base_; }
  Parameter& lora_A() { return A_; }
  Parameter& lora_B() { return B_; }

 private:
  static Tensor compute_copy(Backend& backend, const Parameter& p, DType dtype);
  Tensor adapter_input(Backend& backend, const Tensor& x);
  Tensor adapter_hidden(Backend& backend, const Tensor& xd);
  void update_weight_norms(Backend& backend);
  const Tensor* base_bias() const { return base_bias_ ? &base_bias_->value : nullptr; }
  Tensor dropped_branch(Backend& backend, const Shape& shape, const Tensor& xd, const Tensor& h, const Tensor& B);
  void dora_gradients(Backend& backend, Tensor& dz, Tensor* dbase, const Tensor& dout, const Tensor& x);
  void adapter_backward(Backend& backend, Tensor* dx, const Tensor& dout, const Tensor* dbase, const Tensor& x);
  bool dropout_active() const { return training_ && dropout_ > 0.0f; }
  // The dropout op's row_stride: 0 (x's own rows) unless x is a column shard.
  int64_t row_stride() const { return full_columns_; }
  uint64_t rows_seed(const Tensor& x) const {
    return seed_at(dropout_seed_, uint64_t(first_row_ * (full_columns_ ? full_columns_ : x.cols()) + first_column_));
  }

  std::unique_ptr<Linear> base_;
  Parameter& A_;
  Parameter& B_;
  float scaling_;
  float dropout_;
  uint64_t dropout_seed_ = 0;
  int64_t first_row_ = 0;
  int64_t first_column_ = 0, full_columns_ = 0;  // 0: x is whole rows
  bool training_ = true;
  bool enabled_ = true;
  Parameter* magnitude_ = nullptr;
  const Parameter* base_bias_ = nullptr;
  Tensor weight_sum_squares_;   // f32 [out]: ||W + scaling B A||^2 per row
  // weight_sum_squares_ holds for A and B's values: set by a forward, reset
  // by a backward (an optimizer step may follow) and by adapters_changed.
  bool norms_current_ = false;
};

// The name DoRA's magnitude takes after its module's (PEFT's parameter and
// saved key: model.layers.0.self_attn.q_proj.lora_magnitude_vector).
inline constexpr char kDoraMagnitudeSuffix[] = ".lora_magnitude_vector";

// PEFT's adapter shapes for a weight [out, in] at rank r: lora_A [r, in]
// (Linear(in, r)), lora_B [out, r] (Linear(r, out)).
struct LoraShapes {
  Shape a, b;
  int64_t numel() const { return a[0] * a[1] + b[0] * b[1]; }
};
LoraShapes lora_shapes(int64_t out_features, int64_t in_features, int64_t r);

// PEFT's scaling: lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora.
float lora_scaling(double lora_alpha, int64_t r, bool use_rslora);

// PEFT's init_lora_weights (LoraInit, model/model_options.h): true, A ~
// kaiming_uniform_(a = sqrt(5)) and B = 0, so the adapted layer starts out
// equal to its base; "gaussian", A ~ normal_(std = 1 / r) and B = 0; false,
// A and B both kaiming-uniform. The values come from hash_uniform(seed, .):
// the same distributions as PyTorch, not its numbers.
void init_lora_parameters(Backend& backend, Parameter& A, Parameter& B, LoraInit init, uint64_t seed);

}  // namespace ft
