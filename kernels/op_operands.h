// The small operand structs of Backend's ops, apart from kernels/backend.h
// so that the argument checks (kernels/op_checks.h) can name them and
// backend.h can call the checks.
#pragma once
#include <cstdint>
#include <memory>

#include "kernels/tensor.h"

namespace ft {

// The two streams a backend runs work on (Backend::copy_async). Work on one
// stream runs in issue order; the streams are ordered only by events.
enum class Stream : uint8_t { compute, copy };

// A point in a stream's work (Backend::make_event): what the stream had been
// given when record_event was last called with it. The handle belongs to the
// backend (a cudaEvent_t on CUDA; none where work runs at issue).
struct StreamEvent {
  std::shared_ptr<void> handle;
};

// One AdamW step's scalars (see Backend::adamw_update); step counts from 1.
struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay, grad_scale;
  int64_t step;
};

// One tensor of Backend::adamw_update_many: adamw_update's operands, and
// whether the step's weight decay applies (matrices) or not (norms, biases).
struct AdamWTensors {
  Tensor* param;
  const Tensor* grad;
  Tensor* m;
  Tensor* v;
  bool decayed;

  AdamWStep step_for(const AdamWStep& step) const {
    AdamWStep s = step;
    if (!decayed) s.weight_decay = 0.0f;
    return s;
  }
};

// x's LLM.int8() input side, made once by Backend::int8_quantize_input for
// every linear that reads the same x (q/k/v, gate/up) instead of once per
// linear by int8_linear_forward (Int8Epilogue::input):
//   codes i8 [N, K]: round-half-even(x[n, k] * 127 / row_absmax[n]), 0 in
//     the outlier columns and in rows whose absmax is 0;
//   row_absmax f32 [N]: max |x[n, k]| over the columns that are not outliers;
//   outlier_columns i32 [int8_outlier_list_elements(K)]: the count, then the
//     outlier columns ascending, entries up to K + 1 unspecified, then a bit
//     mask of them in ceil(K / 32) words (bit k % 32 of word k / 32);
//   threshold: the one they were found with (int8_linear_forward's own).
struct Int8Input {
  Tensor codes, row_absmax, outlier_columns;
  float threshold = 0.0f;
};
inline int64_t int8_outlier_list_elements(int64_t K) { return K + 1 + (K + 31) / 32; }

// The optional operands int8_linear_forward folds into its output pass (null:
// absent): a linear layer's bias [O] and LoRA's update scaling * h B^T with
// h [N, r] = dropout(x) A^T and B [O, r] (f32 or bf16 each; both h and B or
// neither), so out is written once instead of re-read by add_bias and a
// matmul with beta = 1. row_absmax (f32 [N]), where given, replaces the row
// scales s_x the op would take from x itself: a row-parallel shard of x
// passes its whole row's (Backend::int8_row_absmax of each shard, the
// maximum over the ranks), so every rank quantises as one process would.
struct Int8Epilogue {
  const Tensor* bias = nullptr;
  const Tensor* lora_h = nullptr;
  const Tensor* lora_B = nullptr;
  float lora_scaling = 0.0f;
  const Tensor* row_absmax = nullptr;
  const Tensor* outlier_flags = nullptr;  // i32 [K]: Backend::int8_outlier_columns's
  // x quantised already (Backend::int8_quantize_input of this x): the op
  // reads its codes, row scales and outlier columns instead of making them.
  // Excludes row_absmax and outlier_flags, which went into it.
  const Int8Input* input = nullptr;
};

// A frozen NF4 weight [out_features, in_features] as bitsandbytes stores it
// (kernels/nf4.h): codes u8 (two per byte, nf4_packed_bytes(O * K) bytes,
// any shape), and the per-64-element absmax either f32 [blocks] or, double
// quantised, u8 [blocks] codes of the dynamic map nested_map (f32 [256]) with
// nested_absmax f32 [ceil(blocks / 256)] and nested_offset: then
// absmax[b] = nested_map[absmax[b]] * nested_absmax[b / 256] + nested_offset.
struct Nf4Weight {
  const Tensor* codes = nullptr;
  const Tensor* absmax = nullptr;
  const Tensor* nested_absmax = nullptr;  // double quantisation only
  const Tensor* nested_map = nullptr;     // double quantisation only
  float nested_offset = 0.0f;
  int64_t out_features = 0, in_features = 0;

  bool double_quant() const { return nested_map != nullptr; }
};

// GELU's two forms in Hugging Face configs: erf is the exact x * Phi(x)
// ("gelu"); tanh is 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// ("gelu_new", "gelu_fast", "gelu_pytorch_tanh").
enum class GeluKind { erf, tanh };

// Backend::activation_forward's function: relu, or GELU's tanh form
// (transformers' "gelu_new", T5 v1.1's gated-gelu).
enum class Activation { relu, gelu_tanh };

}  // namespace ft
