// The op interface. Model code calls only these functions, so a second backend
// (kernels/cuda/) slots in beside kernels/cpu/ without touching the model.
//
// Conventions, the same for every backend:
// - Outputs are preallocated by the caller; ops never allocate tensors that
//   outlive the call (workspace is the backend's business).
// - Tensors are contiguous and row-major; "rows" means the product of all
//   leading dimensions, the last dimension is the feature dimension.
// - Floating tensors may be f32 or bf16 (and f16 where noted); every
//   reduction and accumulation is done in f32.
// - Backward ops OVERWRITE activation gradients (dx) and ACCUMULATE (+=)
//   parameter gradients (dweight), so gradient accumulation across
//   micro-batches needs no extra buffers.
#pragma once
#include <span>

#include "kernels/tensor.h"

namespace ft {

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

// The optional operands int8_linear_forward folds into its output pass (null:
// absent): a linear layer's bias [O] and LoRA's update scaling * h B^T with
// h [N, r] = dropout(x) A^T and B [O, r] (f32 or bf16 each; both h and B or
// neither), so out is written once instead of re-read by add_bias and a
// matmul with beta = 1.
struct Int8Epilogue {
  const Tensor* bias = nullptr;
  const Tensor* lora_h = nullptr;
  const Tensor* lora_B = nullptr;
  float lora_scaling = 0.0f;
};

// GELU's two forms in Hugging Face configs: erf is the exact x * Phi(x)
// ("gelu"); tanh is 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// ("gelu_new", "gelu_fast", "gelu_pytorch_tanh").
enum class GeluKind { erf, tanh };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual Allocator& allocator() = 0;

  Tensor empty(const Shape& shape, DType dtype, MemCategory category) {
    return Tensor::empty(shape, dtype, allocator(), category);
  }

  // ---- data movement ---------------------------------------------------
  // dst = src converted to dst.dtype (element counts must match). Either side
  // may be a host tensor; this is how weights reach the device.
  virtual void copy(Tensor& dst, const Tensor& src) = 0;
  virtual void fill(Tensor& dst, float value) = 0;
  // dst[r, dst_offset + j] = src[r, src_offset + j] for j < width, dst and src
  // viewed as 2-D with the same number of rows (e.g. one of q, k, v out of a
  // fused [N, 3C] projection, or its gradient back in). No aliasing.
  virtual void copy_columns(Tensor& dst, int64_t dst_offset, const Tensor& src,
                            int64_t src_offset, int64_t width) = 0;

  // ---- linear algebra ----------------------------------------------------
  // out[M,N] = alpha * op(a)[M,K] @ op(b)[K,N] + beta * out, op = transpose
  // when the flag is set. a, b, out are 2-D (or viewed as [rows, cols]).
  // beta = 0 ignores out's previous contents (even NaN).
  virtual void matmul(Tensor& out, const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b,
                      float alpha = 1.0f, float beta = 0.0f) = 0;

  // out = a + b, elementwise; out may alias a or b.
  virtual void add(Tensor& out, const Tensor& a, const Tensor& b) = 0;
  // out[n, :] += bias (bias [C], out [N, C]): a linear layer's bias.
  virtual void add_bias(Tensor& out, const Tensor& bias) = 0;
  // dbias[c] += sum over n of dout[n, c] (accumulated, as every parameter gradient).
  virtual void bias_backward(Tensor& dbias, const Tensor& dout) = 0;

  // ---- embedding ---------------------------------------------------------
  // out[N,C] = table[ids[n], :]; ids i32[N].
  virtual void embedding_forward(Tensor& out, const Tensor& ids, const Tensor& table) = 0;
  // dtable[ids[n], :] += dout[n, :].
  virtual void embedding_backward(Tensor& dtable, const Tensor& ids, const Tensor& dout) = 0;

  // ---- normalisation -----------------------------------------------------
  // out = x * rstd * weight, rstd[n] = 1/sqrt(mean(x[n]^2) + eps) (f32[N], saved
  // for backward). As HF LlamaRMSNorm: normalise in f32, then scale.
  virtual void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& x, const Tensor& weight, float eps) = 0;
  // dx overwritten; dweight accumulated unless null.
  virtual void rmsnorm_backward(Tensor& dx, Tensor* dweight, const Tensor& dout, const Tensor& x,
                                const Tensor& weight, const Tensor& rstd) = 0;
  // As torch.nn.LayerNorm: out = (x - mean) * rstd * weight + bias with
  // mean[n] and rstd[n] = 1/sqrt(var(x[n]) + eps) (biased variance) in f32,
  // saved for backward (f32 [N] each); out rounded once to its dtype.
  virtual void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x,
                                 const Tensor& weight, const Tensor& bias, float eps) = 0;
  // dx overwritten; dweight and dbias accumulated unless null.
  virtual void layernorm_backward(Tensor& dx, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                                  const Tensor& x, const Tensor& weight, const Tensor& mean,
                                  const Tensor& rstd) = 0;
  // Fused with a decoder layer's residual add, one pass over [N, C] each.
  // Forward: sum = a + b, rounded to sum's dtype BEFORE the statistics are
  // computed from it, then the norm of the rounded sum into out/statistics:
  // on the CPU bit-identical to add(sum, a, b) followed by *norm_forward on
  // sum. sum (the residual stream, kept by the caller) may alias a or b; out
  // aliases nothing.
  virtual void add_rmsnorm_forward(Tensor& sum, Tensor& out, Tensor& rstd, const Tensor& a, const Tensor& b,
                                   const Tensor& weight, float eps) = 0;
  virtual void add_layernorm_forward(Tensor& sum, Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& a,
                                     const Tensor& b, const Tensor& weight, const Tensor& bias, float eps) = 0;
  // Backward: dx = the norm's input gradient ROUNDED TO dx's DTYPE, plus
  // dresidual (the gradient through the residual branch), rounded again: on
  // the CPU bit-identical to *norm_backward into a tensor of dx's dtype
  // followed by add(dx, that, dresidual). dx may alias dresidual (the
  // residual gradient updated in place), not dout; parameter gradients
  // accumulate unless null, as the unfused ops'.
  virtual void rmsnorm_backward_add(Tensor& dx, Tensor* dweight, const Tensor& dout, const Tensor& dresidual,
                                    const Tensor& x, const Tensor& weight, const Tensor& rstd) = 0;
  virtual void layernorm_backward_add(Tensor& dx, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                                      const Tensor& dresidual, const Tensor& x, const Tensor& weight,
                                      const Tensor& mean, const Tensor& rstd) = 0;

  // ---- rotary position embedding (in place) ------------------------------
  // x is [N, H, D] (N tokens, H heads, head size D); positions i32[N]. The first
  // rotary_dim features of each head are rotated with HF's rotate_half layout:
  // pairs (i, i + rotary_dim/2), inv_freq[i] = theta^(-2i/rotary_dim).
  virtual void rope_forward(Tensor& x, const Tensor& positions, int rotary_dim, float theta) = 0;
  // The transposed (inverse) rotation, applied in place to the gradient.
  virtual void rope_backward(Tensor& dx, const Tensor& positions, int rotary_dim, float theta) = 0;

  // ---- activations -------------------------------------------------------
  // out = silu(gate) * up.
  virtual void swiglu_forward(Tensor& out, const Tensor& gate, const Tensor& up) = 0;
  virtual void swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                               const Tensor& up) = 0;
  // out = gelu(x) in the given form (see GeluKind); out may alias x.
  virtual void gelu_forward(Tensor& out, const Tensor& x, GeluKind kind) = 0;
  // dx = dout * gelu'(x); dx may alias dout.
  virtual void gelu_backward(Tensor& dx, const Tensor& dout, const Tensor& x, GeluKind kind) = 0;

  // ---- attention ---------------------------------------------------------
  // Causal self-attention with grouped-query heads. q [B,T,Hq,D], k and v
  // [B,T,Hkv,D] with Hq % Hkv == 0 (query head h reads kv head h / (Hq/Hkv)),
  // out [B,T,Hq,D], lse f32 [B,Hq,T] = log-sum-exp of each score row (saved for
  // backward). scores = q.k * scale.
  virtual void attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                                 float scale) = 0;
  // dq, dk, dv overwritten.
  virtual void attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                                  const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                                  float scale) = 0;

  // ---- loss --------------------------------------------------------------
  // Softmax cross-entropy over logits [N,V] with targets i32[N]; a target of
  // -100 is ignored. losses f32[N] gets each row's loss (0 for ignored rows).
  // If dlogits is given it is set to (softmax - onehot) * dloss for counted
  // rows and 0 for ignored ones; dlogits may alias logits. For the mean over
  // counted tokens pass dloss = 1 / counted.
  virtual void cross_entropy(Tensor& losses, Tensor* dlogits, const Tensor& logits, const Tensor& targets,
                             float dloss) = 0;

  // ---- LLM.int8() --------------------------------------------------------
  // Row-wise absmax quantisation (bitsandbytes' vector-wise scheme): for each
  // row r of x [R, K] (f32, bf16 or f16), scales[r] = max|x[r, :]| (f32 [R])
  // and q[r, k] = round-half-even(x[r, k] * 127 / scales[r]) (i8 [R, K]),
  // rounding the exact quotient. An all-zero row gets scale 0 and zero codes.
  virtual void quantize_rows_int8(Tensor& q, Tensor& scales, const Tensor& x) = 0;
  // out[N, O] = LLM.int8() product of x [N, K] with a frozen weight stored as
  // i8 [O, K] + f32 row scales [O] (W ~ q * scale / 127). Input-feature
  // columns k where any |x[:, k]| >= threshold (threshold > 0; 0 disables)
  // are outliers, found anew on every call: they are multiplied in f32
  // against the dequantised weight columns. The other columns are quantised
  // per row of x (outlier columns zeroed before the absmax), multiplied
  // int8 x int8 -> int32 and dequantised with s_x[n] * s_w[o] / 127^2.
  // out = the sum of both parts plus the epilogue's operands (overwritten),
  // each element one f32 value rounded once to out's dtype, summed in this
  // order (fma = one rounding) on every backend:
  //   v = float(int32 product) * (s_x[n] * s_w[o] * (1 / 127^2));
  //   v = fma(x[n, k], q[o, k] * s_w[o] / 127, v) over outlier columns k ascending;
  //   v = v + bias[o];
  //   s = 0; s = fma(h[n, j], B[o, j], s) for j = 0 .. r-1; v = fma(lora_scaling, s, v).
  // The rule is the paper's: whole outlier columns leave the int8 product, so
  // s_x[n] is the absmax of x[n, :] over the non-outlier columns only.
  // bitsandbytes 0.50 (CPU: backends/default/ops.py int8_vectorwise_quant; CUDA:
  // kInt8VectorQuant) zeroes only the entries with |x| >= threshold before the
  // absmax, so the sub-threshold entries of outlier columns still count in
  // s_x[n] (their codes are then zeroed and the columns go to the 16-bit part,
  // as here); it rounds x * (127 / s) computed in f32 (weights too: ties such
  // as w = absmax / 2 round down in magnitude), not the exact quotient; and it
  // rounds the int8 part to f16 before adding the outlier part in f16. Both
  // multiply outlier columns by the dequantised weight columns, not the
  // original 16-bit ones. Measured on a Llama-2-7B q_proj-sized layer:
  // tests/fixtures/int8_vs_bnb/README.md.
  virtual void int8_linear_forward(Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& weight_scales,
                                   float threshold, const Int8Epilogue& epilogue = {}) = 0;
  // dx [N, K] = dout [N, O] @ dequant(weight) (dx += ... when accumulate).
  // The weight is dequantised tile by tile, never as a full f32 copy. No
  // weight gradient: int8 weights are frozen.
  virtual void int8_linear_backward(Tensor& dx, const Tensor& dout, const Tensor& weight,
                                    const Tensor& weight_scales, bool accumulate) = 0;

  // ---- dropout -----------------------------------------------------------
  // out = x * keep / (1 - p), keep[i] = hash_uniform(seed, i) >= p with i the
  // flat element index (kernels/dropout_hash.h), so every backend draws the
  // same mask and backward needs no saved mask. out may alias x.
  virtual void dropout_forward(Tensor& out, const Tensor& x, float p, uint64_t seed) = 0;
  // dx = dout * keep / (1 - p) with the same mask; dx may alias dout.
  virtual void dropout_backward(Tensor& dx, const Tensor& dout, float p, uint64_t seed) = 0;

  // ---- optimizer ---------------------------------------------------------
  // torch.optim.AdamW (foreach=False) on f32 param, grad, m, v, with grad
  // multiplied by step.grad_scale first (global-norm clipping):
  //   param *= 1 - lr * wd; m = lerp(m, g, 1 - b1); v = b2 * v + (1 - b2) * g * g;
  //   denom = sqrt(v) / sqrt(1 - b2^t) + eps; param -= (lr / (1 - b1^t)) * m / denom.
  virtual void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& step) = 0;
  // Sum of squares of all elements (f32/bf16) accumulated in double and
  // returned on the host (for global-norm clipping); independent of the
  // thread or block count.
  virtual double sum_squares(const Tensor& x) = 0;
  // adamw_update on each tensor with tensor.step_for(step), bit-identical to
  // those calls one by one; the CUDA backend updates them all in one launch.
  virtual void adamw_update_many(std::span<const AdamWTensors> tensors, const AdamWStep& step) = 0;
  // The sum of sum_squares(x) over the tensors, added in order in double
  // (each tensor's sum bit-identical to sum_squares on the same backend), with
  // one device->host copy.
  virtual double sum_squares_many(std::span<const Tensor* const> tensors) = 0;
};

}  // namespace ft
