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
#include "kernels/tensor.h"

namespace ft {

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

  // ---- linear algebra ----------------------------------------------------
  // out[M,N] = alpha * op(a)[M,K] @ op(b)[K,N] + beta * out, op = transpose
  // when the flag is set. a, b, out are 2-D (or viewed as [rows, cols]).
  // beta = 0 ignores out's previous contents (even NaN).
  virtual void matmul(Tensor& out, const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b,
                      float alpha = 1.0f, float beta = 0.0f) = 0;

  // out = a + b, elementwise; out may alias a or b.
  virtual void add(Tensor& out, const Tensor& a, const Tensor& b) = 0;

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
};

}  // namespace ft
