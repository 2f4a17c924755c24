// The op interface. Model code calls only these functions, so a second backend
// (kernels/cuda/) slots in beside kernels/cpu/ without touching the model.
// Each public op checks its arguments' contract (kernels/op_checks.h), opens
// an OpTimer (kernels/op_profile.h: per-op time when a profile is attached)
// and calls its backend's implementation, the protected virtual <op>_impl, so
// every backend (CPU, CUDA, the planner's meta) rejects the same calls the
// same way. Adding an op: its public method here (check, timer, <op>_impl),
// its line in FT_BACKEND_OP_IMPLS, its check in op_checks.h, one
// implementation per backend.
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

#include "kernels/op_checks.h"
#include "kernels/op_operands.h"
#include "kernels/op_profile.h"
#include "kernels/tensor.h"

namespace ft {

// Every op's implementation hook, declared once for Backend (prefix virtual,
// suffix = 0) and once per backend (suffix override) from this one list.
#define FT_BACKEND_OP_IMPLS(PREFIX, SUFFIX)                                                                         \
  PREFIX void copy_impl(Tensor& dst, const Tensor& src) SUFFIX;                                                     \
  PREFIX void copy_async_impl(Tensor& dst, const Tensor& src) SUFFIX;                                               \
  PREFIX StreamEvent make_event_impl() SUFFIX;                                                                      \
  PREFIX void record_event_impl(StreamEvent& event, Stream stream) SUFFIX;                                          \
  PREFIX void wait_event_impl(Stream stream, const StreamEvent& event) SUFFIX;                                      \
  PREFIX void fill_impl(Tensor& dst, float value) SUFFIX;                                                           \
  PREFIX void accumulate_outer_products_impl(Tensor& grad, const Tensor& a, const Tensor& b, float alpha) SUFFIX;  \
  PREFIX void copy_columns_impl(Tensor& dst, int64_t dst_offset, const Tensor& src, int64_t src_offset,             \
                                int64_t width) SUFFIX;                                                              \
  PREFIX void matmul_impl(Tensor& out, const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b,        \
                          float alpha, float beta) SUFFIX;                                                          \
  PREFIX void add_impl(Tensor& out, const Tensor& a, const Tensor& b) SUFFIX;                                       \
  PREFIX void add_bias_impl(Tensor& out, const Tensor& bias) SUFFIX;                                                \
  PREFIX void bias_backward_impl(Tensor& dbias, const Tensor& dout) SUFFIX;                                         \
  PREFIX void row_sum_squares_impl(Tensor& sums, const Tensor& x, bool accumulate) SUFFIX;                          \
  PREFIX void dora_scale_forward_impl(Tensor& out, const Tensor& z, const Tensor& magnitude,                       \
                                      const Tensor& weight_sum_squares, const Tensor* bias) SUFFIX;                 \
  PREFIX void dora_scale_backward_impl(Tensor& dz, Tensor* dbase, Tensor* dmagnitude, const Tensor& dout,           \
                                       const Tensor& z,                                                             \
                                       const Tensor& magnitude, const Tensor& weight_sum_squares,                   \
                                       const Tensor* bias) SUFFIX;                                                  \
  PREFIX void embedding_forward_impl(Tensor& out, const Tensor& ids, const Tensor& table) SUFFIX;                   \
  PREFIX void embedding_backward_impl(Tensor& dtable, const Tensor& ids, const Tensor& dout) SUFFIX;                \
  PREFIX void rmsnorm_forward_impl(Tensor& out, Tensor& rstd, const Tensor& x, const Tensor& weight, float eps)     \
      SUFFIX;                                                                                                       \
  PREFIX void rmsnorm_backward_impl(Tensor& dx, Tensor* dweight, const Tensor& dout, const Tensor& x,               \
                                    const Tensor& weight, const Tensor& rstd) SUFFIX;                               \
  PREFIX void layernorm_forward_impl(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x,                      \
                                     const Tensor& weight, const Tensor& bias, float eps) SUFFIX;                   \
  PREFIX void layernorm_backward_impl(Tensor& dx, Tensor* dweight, Tensor* dbias, const Tensor& dout,               \
                                      const Tensor& x, const Tensor& weight, const Tensor& mean,                    \
                                      const Tensor& rstd) SUFFIX;                                                   \
  PREFIX void add_rmsnorm_forward_impl(Tensor& sum, Tensor& out, Tensor& rstd, const Tensor& a, const Tensor& b,    \
                                       const Tensor& weight, float eps) SUFFIX;                                     \
  PREFIX void add_layernorm_forward_impl(Tensor& sum, Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& a,     \
                                         const Tensor& b, const Tensor& weight, const Tensor& bias, float eps)      \
      SUFFIX;                                                                                                       \
  PREFIX void rmsnorm_backward_add_impl(Tensor& dx, Tensor* dweight, const Tensor& dout, const Tensor& dresidual,   \
                                        const Tensor& x, const Tensor& weight, const Tensor& rstd) SUFFIX;          \
  PREFIX void layernorm_backward_add_impl(Tensor& dx, Tensor* dweight, Tensor* dbias, const Tensor& dout,           \
                                          const Tensor& dresidual, const Tensor& x, const Tensor& weight,           \
                                          const Tensor& mean, const Tensor& rstd) SUFFIX;                           \
  PREFIX void rope_forward_impl(const HeadsView& x, const Tensor& positions, std::span<const float> inv_freq)      \
      SUFFIX;                                                                                                       \
  PREFIX void rope_backward_impl(const HeadsView& dx, const Tensor& positions, std::span<const float> inv_freq)    \
      SUFFIX;                                                                                                       \
  PREFIX void swiglu_forward_impl(Tensor& out, const Tensor& gate, const Tensor& up) SUFFIX;                        \
  PREFIX void swiglu_backward_impl(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,              \
                                   const Tensor& up) SUFFIX;                                                        \
  PREFIX void gelu_forward_impl(Tensor& out, const Tensor& x, GeluKind kind) SUFFIX;                                \
  PREFIX void gelu_backward_impl(Tensor& dx, const Tensor& dout, const Tensor& x, GeluKind kind) SUFFIX;            \
  PREFIX void attention_forward_impl(Tensor& out, Tensor& lse, const HeadsView& q, const HeadsView& k,            \
                                     const HeadsView& v, float scale, int64_t sliding_window,                       \
                                     const Tensor* cu_seqlens) SUFFIX;                                              \
  PREFIX void attention_backward_impl(const HeadsView& dq, const HeadsView& dk, const HeadsView& dv,               \
                                      const Tensor& dout, const HeadsView& q, const HeadsView& k,                   \
                                      const HeadsView& v, const Tensor& out, const Tensor& lse, float scale,        \
                                      int64_t sliding_window, const Tensor* cu_seqlens) SUFFIX;                     \
  PREFIX void attention_cached_impl(Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,     \
                                    const Tensor& positions, float scale, int64_t sliding_window) SUFFIX;          \
  PREFIX void biased_attention_forward_impl(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k,            \
                                            const Tensor& v, const Tensor* bias, const Tensor* key_lengths,         \
                                            bool causal) SUFFIX;                                                    \
  PREFIX void biased_attention_backward_impl(Tensor& dq, Tensor& dk, Tensor& dv, Tensor* dbias, const Tensor& dout, \
                                             const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,  \
                                             const Tensor& lse, const Tensor* bias, const Tensor* key_lengths,      \
                                             bool causal) SUFFIX;                                                   \
  PREFIX void activation_forward_impl(Tensor& out, const Tensor& x, const Tensor* up, Activation kind) SUFFIX;     \
  PREFIX void activation_backward_impl(Tensor& dx, Tensor* dup, const Tensor& dout, const Tensor& x,               \
                                       const Tensor* up, Activation kind) SUFFIX;                                   \
  PREFIX void cross_entropy_impl(Tensor& losses, Tensor* dlogits, const Tensor& logits, const Tensor& targets,      \
                                 float dloss, const Tensor* row_scales) SUFFIX;                                     \
  PREFIX void quantize_rows_int8_impl(Tensor& q, Tensor& scales, const Tensor& x) SUFFIX;                           \
  PREFIX void int8_outlier_columns_impl(Tensor& flags, const Tensor& x, float threshold) SUFFIX;                     \
  PREFIX void int8_quantize_input_impl(Int8Input& input, const Tensor& x, float threshold,                          \
                                       const Tensor* outlier_flags) SUFFIX;                                         \
  PREFIX void int8_row_absmax_impl(Tensor& absmax, const Tensor& x, float threshold, const Tensor* outlier_flags)   \
      SUFFIX;                                                                                                       \
  PREFIX void int8_linear_forward_impl(Tensor& out, const Tensor& x, const Tensor& weight,                          \
                                       const Tensor& weight_scales, float threshold, const Int8Epilogue& epilogue) \
      SUFFIX;                                                                                                       \
  PREFIX void int8_linear_backward_impl(Tensor& dx, const Tensor& dout, const Tensor& weight,                       \
                                        const Tensor& weight_scales, bool accumulate) SUFFIX;                       \
  PREFIX void int8_dequantize_impl(Tensor& tile, const Tensor& weight, const Tensor& weight_scales, int64_t col0)  \
      SUFFIX;                                                                                                       \
  PREFIX void nf4_dequantize_impl(Tensor& tile, const Nf4Weight& weight, int64_t row0, int64_t col0) SUFFIX;       \
  PREFIX void dropout_forward_impl(Tensor& out, const Tensor& x, float p, uint64_t seed, int64_t row_stride) SUFFIX; \
  PREFIX void dropout_backward_impl(Tensor& dx, const Tensor& dout, float p, uint64_t seed, int64_t row_stride)   \
      SUFFIX;                                                                                                       \
  PREFIX void add_uniform_noise_impl(Tensor& x, float magnitude, uint64_t seed) SUFFIX;                             \
  PREFIX void adamw_update_impl(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& step)     \
      SUFFIX;                                                                                                       \
  PREFIX double sum_squares_impl(const Tensor& x) SUFFIX;                                                           \
  PREFIX void adamw_update_many_impl(std::span<const AdamWTensors> tensors, const AdamWStep& step) SUFFIX;          \
  PREFIX double sum_squares_many_impl(std::span<const Tensor* const> tensors) SUFFIX;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual Allocator& allocator() = 0;
  // Where the backend's tensors live (its allocator's device).
  Device device() { return allocator().device(); }
  // Host memory copy_async reads from (page-locked on CUDA, so the copy
  // engine reads it while the host goes on; Device::cpu tensors).
  virtual Allocator& pinned_host_allocator() = 0;

  Tensor empty(const Shape& shape, DType dtype, MemCategory category) {
    return Tensor::empty(shape, dtype, allocator(), category);
  }

  // Times every op from now on into profile (kernels/op_profile.h); null
  // stops. The caller keeps profile alive while it is attached. The event
  // calls below are not timed: bookkeeping, no work on the CPU.
  void set_op_profile(OpProfile* profile) { profile_ = profile; }

  // ---- data movement ---------------------------------------------------
  // dst = src converted to dst.dtype (element counts must match). Either side
  // may be a host tensor; this is how weights reach the device.
  void copy(Tensor& dst, const Tensor& src) {
    checks::check_copy(device(), dst, src);
    const OpTimer timer(profile_, __func__);
    copy_impl(dst, src);
  }
  void fill(Tensor& dst, float value) {
    checks::check_fill(device(), dst);
    const OpTimer timer(profile_, __func__);
    fill_impl(dst, value);
  }
  // dst[r, dst_offset + j] = src[r, src_offset + j] for j < width, dst and src
  // viewed as 2-D with the same number of rows (e.g. one of q, k, v out of a
  // fused [N, 3C] projection, or its gradient back in). No aliasing.
  void copy_columns(Tensor& dst, int64_t dst_offset, const Tensor& src, int64_t src_offset, int64_t width) {
    checks::check_copy_columns(device(), dst, dst_offset, src, src_offset, width);
    const OpTimer timer(profile_, __func__);
    copy_columns_impl(dst, dst_offset, src, src_offset, width);
  }

  // ---- the copy stream -------------------------------------------------
  // Every other op runs on the compute stream, in issue order. copy_async
  // copies src to dst byte for byte (same dtype and size) between a
  // pinned_host_allocator tensor and one on the device, either way (weights
  // in, activation checkpoints out and back), on the copy stream, so it
  // overlaps the compute stream's work; the host does not wait for it. The streams are
  // ordered only by events: record_event marks what `stream` has been given
  // so far, wait_event makes `stream`'s later work wait until the event's
  // work is done (an event never recorded is done). So a copy into a buffer
  // the compute stream reads must wait for an event recorded on compute after
  // the last reader, and compute must wait for an event recorded on copy
  // after the copy before it reads. The CPU backend runs everything at issue
  // (copy_async is a memcpy, events are no-ops).
  void copy_async(Tensor& dst, const Tensor& src) {
    checks::check_copy_async(device(), dst, src);
    const OpTimer timer(profile_, __func__);
    copy_async_impl(dst, src);
  }
  StreamEvent make_event() { return make_event_impl(); }
  void record_event(StreamEvent& event, Stream stream) { record_event_impl(event, stream); }
  void wait_event(Stream stream, const StreamEvent& event) { wait_event_impl(stream, event); }

  // ---- linear algebra ----------------------------------------------------
  // out[M,N] = alpha * op(a)[M,K] @ op(b)[K,N] + beta * out, op = transpose
  // when the flag is set. a, b, out are 2-D (or viewed as [rows, cols]).
  // beta = 0 ignores out's previous contents (even NaN). out aliases neither input.
  void matmul(Tensor& out, const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b, float alpha = 1.0f,
              float beta = 0.0f) {
    checks::check_matmul(device(), out, a, b, transpose_a, transpose_b);
    const OpTimer timer(profile_, __func__);
    matmul_impl(out, a, b, transpose_a, transpose_b, alpha, beta);
  }
  // grad [M, P] (f32) += alpha * a [N, M]^T @ b [N, P], the rows' terms added
  // in row order: each element v = fma(alpha * a[n, i], b[n, j], v) for n =
  // 0 .. N-1 ascending, from grad's own value, in f32 (alpha * a[n, i]
  // rounded once), on every backend. So a sum over tokens added block of
  // rows after block of rows is bit for bit the sum over all of them at once:
  // a LoRA adapter's gradient is the same whether its layer runs over the
  // whole batch or over chunks of tokens (mlp_chunk_tokens). A GEMM's sum
  // over K is blocked by shape instead, so it cannot promise that.
  void accumulate_outer_products(Tensor& grad, const Tensor& a, const Tensor& b, float alpha) {
    checks::check_accumulate_outer_products(device(), grad, a, b);
    const OpTimer timer(profile_, __func__);
    accumulate_outer_products_impl(grad, a, b, alpha);
  }

  // out = a + b, elementwise; out may alias a or b.
  void add(Tensor& out, const Tensor& a, const Tensor& b) {
    checks::check_add(device(), out, a, b);
    const OpTimer timer(profile_, __func__);
    add_impl(out, a, b);
  }
  // out[n, :] += bias (bias [C], out [N, C]): a linear layer's bias.
  void add_bias(Tensor& out, const Tensor& bias) {
    checks::check_bias(device(), "add_bias", bias, "bias", out, "out");
    const OpTimer timer(profile_, __func__);
    add_bias_impl(out, bias);
  }
  // dbias[c] += sum over n of dout[n, c] (accumulated, as every parameter gradient).
  void bias_backward(Tensor& dbias, const Tensor& dout) {
    checks::check_bias(device(), "bias_backward", dbias, "dbias", dout, "dout");
    const OpTimer timer(profile_, __func__);
    bias_backward_impl(dbias, dout);
  }

  // ---- DoRA --------------------------------------------------------------
  // A DoRA linear (PEFT's use_dora) is y = x W^T + bias + (g - 1) xd W^T +
  // g s h B^T with xd = dropout(x), h = xd A^T and g = magnitude / ||W + s B
  // A|| per output row, the norm treated as a constant in backward (DoRA
  // paper section 4.3; PEFT detaches it). Without dropout (xd = x) that is
  // y = g (x W^T + s h B^T) + bias.
  //
  // sums[i] = (accumulate ? sums[i] : 0) + sum over j of x[i, j]^2, summed in
  // f32 in a fixed order per backend. x [R, C] (R the product of the leading
  // dimensions), sums f32 [R]: the squared row norms of W + s B A, one column
  // tile at a time.
  void row_sum_squares(Tensor& sums, const Tensor& x, bool accumulate) {
    checks::check_row_sum_squares(device(), sums, x);
    const OpTimer timer(profile_, __func__);
    row_sum_squares_impl(sums, x, accumulate);
  }
  // PEFT's DoRA output: with g[j] = magnitude[j] / sqrt(weight_sum_squares[j])
  // and b[j] = bias[j] (0 when bias is null), out[n, j] += (g[j] - 1) *
  // (z[n, j] - b[j]) in f32 (one fma), rounded once to out's dtype. out
  // [N, O] is the base's output plus the LoRA term (x W^T + b + s h B^T), z
  // the same over the dropped input (xd W^T + b + s h B^T, h = xd A^T); z
  // may alias out (no dropout: out becomes g * (out - b) + b). magnitude and
  // bias [O] floating, weight_sum_squares f32 [O] (row_sum_squares of W + s
  // B A), z shaped as out.
  void dora_scale_forward(Tensor& out, const Tensor& z, const Tensor& magnitude, const Tensor& weight_sum_squares,
                          const Tensor* bias) {
    checks::check_dora_scale_forward(device(), out, z, magnitude, weight_sum_squares, bias);
    const OpTimer timer(profile_, __func__);
    dora_scale_forward_impl(out, z, magnitude, weight_sum_squares, bias);
  }
  // dz[n, j] = dout[n, j] * g[j] (the gradient at the adapted branch's
  // output; may alias dout), dbase[n, j] = dout[n, j] * (g[j] - 1) unless
  // null (at the base's output over the dropped input), and unless
  // dmagnitude is null (a frozen magnitude), dmagnitude[j] += (sum over n of
  // dout[n, j] * (z[n, j] - b[j])) / sqrt(weight_sum_squares[j]), summed in
  // f32 in fixed row groups (cuda::partial_rows), the same bits on every
  // backend. z [N, O] is dora_scale_forward's z; dz and dbase
  // shaped and typed as dout (dbase aliasing neither); dmagnitude f32 [O];
  // the rest as in dora_scale_forward.
  void dora_scale_backward(Tensor& dz, Tensor* dbase, Tensor* dmagnitude, const Tensor& dout, const Tensor& z,
                           const Tensor& magnitude, const Tensor& weight_sum_squares, const Tensor* bias) {
    checks::check_dora_scale_backward(device(), dz, dbase, dmagnitude, dout, z, magnitude, weight_sum_squares, bias);
    const OpTimer timer(profile_, __func__);
    dora_scale_backward_impl(dz, dbase, dmagnitude, dout, z, magnitude, weight_sum_squares, bias);
  }

  // ---- embedding ---------------------------------------------------------
  // out[N,C] = table[ids[n], :]; ids i32[N].
  void embedding_forward(Tensor& out, const Tensor& ids, const Tensor& table) {
    checks::check_embedding(device(), "embedding_forward", out, "out", ids, table, "table");
    const OpTimer timer(profile_, __func__);
    embedding_forward_impl(out, ids, table);
  }
  // dtable[ids[n], :] += dout[n, :].
  void embedding_backward(Tensor& dtable, const Tensor& ids, const Tensor& dout) {
    checks::check_embedding(device(), "embedding_backward", dout, "dout", ids, dtable, "dtable");
    const OpTimer timer(profile_, __func__);
    embedding_backward_impl(dtable, ids, dout);
  }

  // ---- normalisation -----------------------------------------------------
  // out = x * rstd * weight, rstd[n] = 1/sqrt(mean(x[n]^2) + eps) (f32[N], saved
  // for backward). As HF LlamaRMSNorm: normalise in f32, then scale.
  void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& x, const Tensor& weight, float eps) {
    checks::check_rmsnorm_forward(device(), "rmsnorm_forward", out, rstd, x, weight);
    const OpTimer timer(profile_, __func__);
    rmsnorm_forward_impl(out, rstd, x, weight, eps);
  }
  // dx overwritten; dweight accumulated unless null.
  void rmsnorm_backward(Tensor& dx, Tensor* dweight, const Tensor& dout, const Tensor& x, const Tensor& weight,
                        const Tensor& rstd) {
    checks::check_norm_backward_op(device(), "rmsnorm_backward", dx, dweight, nullptr, dout, nullptr, x, weight,
                                   nullptr, rstd);
    const OpTimer timer(profile_, __func__);
    rmsnorm_backward_impl(dx, dweight, dout, x, weight, rstd);
  }
  // As torch.nn.LayerNorm: out = (x - mean) * rstd * weight + bias with
  // mean[n] and rstd[n] = 1/sqrt(var(x[n]) + eps) (biased variance) in f32,
  // saved for backward (f32 [N] each); out rounded once to its dtype.
  void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& weight,
                         const Tensor& bias, float eps) {
    checks::check_layernorm_forward(device(), "layernorm_forward", out, mean, rstd, x, weight, bias);
    const OpTimer timer(profile_, __func__);
    layernorm_forward_impl(out, mean, rstd, x, weight, bias, eps);
  }
  // dx overwritten; dweight and dbias accumulated unless null.
  void layernorm_backward(Tensor& dx, Tensor* dweight, Tensor* dbias, const Tensor& dout, const Tensor& x,
                          const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
    checks::check_norm_backward_op(device(), "layernorm_backward", dx, dweight, dbias, dout, nullptr, x, weight,
                                   &mean, rstd);
    const OpTimer timer(profile_, __func__);
    layernorm_backward_impl(dx, dweight, dbias, dout, x, weight, mean, rstd);
  }
  // Fused with a decoder layer's residual add, one pass over [N, C] each.
  // Forward: sum = a + b, rounded to sum's dtype BEFORE the statistics are
  // computed from it, then the norm of the rounded sum into out/statistics:
  // on the CPU bit-identical to add(sum, a, b) followed by *norm_forward on
  // sum. sum (the residual stream, kept by the caller) may alias a or b; out
  // aliases nothing.
  void add_rmsnorm_forward(Tensor& sum, Tensor& out, Tensor& rstd, const Tensor& a, const Tensor& b,
                           const Tensor& weight, float eps) {
    checks::check_rmsnorm_forward(device(), "add_rmsnorm_forward", out, rstd, a, weight);
    checks::check_residual_sum(device(), "add_rmsnorm_forward", sum, a, b);
    const OpTimer timer(profile_, __func__);
    add_rmsnorm_forward_impl(sum, out, rstd, a, b, weight, eps);
  }
  void add_layernorm_forward(Tensor& sum, Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& a, const Tensor& b,
                             const Tensor& weight, const Tensor& bias, float eps) {
    checks::check_layernorm_forward(device(), "add_layernorm_forward", out, mean, rstd, a, weight, bias);
    checks::check_residual_sum(device(), "add_layernorm_forward", sum, a, b);
    const OpTimer timer(profile_, __func__);
    add_layernorm_forward_impl(sum, out, mean, rstd, a, b, weight, bias, eps);
  }
  // Backward: dx = the norm's input gradient ROUNDED TO dx's DTYPE, plus
  // dresidual (the gradient through the residual branch), rounded again: on
  // the CPU bit-identical to *norm_backward into a tensor of dx's dtype
  // followed by add(dx, that, dresidual). dx may alias dresidual (the
  // residual gradient updated in place), not dout; parameter gradients
  // accumulate unless null, as the unfused ops'.
  void rmsnorm_backward_add(Tensor& dx, Tensor* dweight, const Tensor& dout, const Tensor& dresidual,
                            const Tensor& x, const Tensor& weight, const Tensor& rstd) {
    checks::check_norm_backward_op(device(), "rmsnorm_backward_add", dx, dweight, nullptr, dout, &dresidual, x,
                                   weight, nullptr, rstd);
    const OpTimer timer(profile_, __func__);
    rmsnorm_backward_add_impl(dx, dweight, dout, dresidual, x, weight, rstd);
  }
  void layernorm_backward_add(Tensor& dx, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                              const Tensor& dresidual, const Tensor& x, const Tensor& weight, const Tensor& mean,
                              const Tensor& rstd) {
    checks::check_norm_backward_op(device(), "layernorm_backward_add", dx, dweight, dbias, dout, &dresidual, x,
                                   weight, &mean, rstd);
    const OpTimer timer(profile_, __func__);
    layernorm_backward_add_impl(dx, dweight, dbias, dout, dresidual, x, weight, mean, rstd);
  }

  // ---- rotary position embedding (in place) ------------------------------
  // x is [..., H, D] heads (N tokens, H heads, head size D; a view, so q and
  // k rotate inside GPT-NeoX's fused qkv rows); positions i32[N]. The first
  // rotary_dim = 2 * inv_freq.size() features of each head are rotated with
  // HF's rotate_half layout: pair (i, i + rotary_dim/2) by the f32 angle
  // float(position) * inv_freq[i]. The caller computes inv_freq (host f32,
  // finite and positive) from the model's rope settings, scaling included
  // (model/rope.h), so every backend rotates by the same angles.
  void rope_forward(const HeadsView& x, const Tensor& positions, std::span<const float> inv_freq) {
    checks::check_rope(device(), "rope_forward", x, positions, inv_freq);
    const OpTimer timer(profile_, __func__);
    rope_forward_impl(x, positions, inv_freq);
  }
  // The transposed (inverse) rotation, applied in place to the gradient.
  void rope_backward(const HeadsView& dx, const Tensor& positions, std::span<const float> inv_freq) {
    checks::check_rope(device(), "rope_backward", dx, positions, inv_freq);
    const OpTimer timer(profile_, __func__);
    rope_backward_impl(dx, positions, inv_freq);
  }

  // ---- activations -------------------------------------------------------
  // out = silu(gate) * up.
  void swiglu_forward(Tensor& out, const Tensor& gate, const Tensor& up) {
    checks::check_swiglu(device(), "swiglu_forward", {{&out, "out"}, {&gate, "gate"}, {&up, "up"}}, out);
    const OpTimer timer(profile_, __func__);
    swiglu_forward_impl(out, gate, up);
  }
  void swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate, const Tensor& up) {
    checks::check_swiglu(device(), "swiglu_backward",
                         {{&dgate, "dgate"}, {&dup, "dup"}, {&dout, "dout"}, {&gate, "gate"}, {&up, "up"}}, dout);
    const OpTimer timer(profile_, __func__);
    swiglu_backward_impl(dgate, dup, dout, gate, up);
  }
  // out = gelu(x) in the given form (see GeluKind); out may alias x.
  void gelu_forward(Tensor& out, const Tensor& x, GeluKind kind) {
    checks::check_gelu(device(), "gelu_forward", out, "out", nullptr, x);
    const OpTimer timer(profile_, __func__);
    gelu_forward_impl(out, x, kind);
  }
  // dx = dout * gelu'(x); dx may alias dout.
  void gelu_backward(Tensor& dx, const Tensor& dout, const Tensor& x, GeluKind kind) {
    checks::check_gelu(device(), "gelu_backward", dx, "dx", &dout, x);
    const OpTimer timer(profile_, __func__);
    gelu_backward_impl(dx, dout, x, kind);
  }

  // ---- attention ---------------------------------------------------------
  // Causal self-attention with grouped-query heads. q [B,T,Hq,D], k and v
  // [B,T,Hkv,D] with Hq % Hkv == 0 (query head h reads kv head h / (Hq/Hkv)),
  // out [B,T,Hq,D], lse f32 [B,Hq,T] = log-sum-exp of each score row (saved for
  // backward). scores = q.k * scale. sliding_window (Mistral's) 0 means plain
  // causal; otherwise key j is visible to query i iff j <= i and
  // i - j < sliding_window (transformers' mask kv_idx > q_idx - window).
  // q, k and v are head views (kernels/tensor.h): GPT-NeoX's are read in place
  // from the fused query_key_value output, as FlashAttention's qkvpacked
  // form reads them, and its dq, dk and dv written in place into dqkv.
  // Packed rows (padding-free packing): cu_seqlens, when given, is i32 [S + 1]
  // on the backend, FlashAttention's varlen offsets: the S sequences of the
  // B * T tokens in row-major order, sequence s = tokens [cu_seqlens[s],
  // cu_seqlens[s + 1]). It starts at 0, ends at B * T, increases strictly and
  // holds every row start b * T (no sequence crosses a row). Query i then sees
  // key j only within its own sequence (and the window counts within it too,
  // as positions restart there). Null: each row is one sequence. Its values
  // are checked where the host can read them (the CPU backend, and
  // checks::check_cu_seqlens_values for the caller that builds them).
  void attention_forward(Tensor& out, Tensor& lse, const HeadsView& q, const HeadsView& k, const HeadsView& v,
                         float scale, int64_t sliding_window, const Tensor* cu_seqlens = nullptr) {
    checks::check_attention(device(), "attention_forward", q, k, v, out, lse, sliding_window, cu_seqlens);
    const OpTimer timer(profile_, __func__);
    attention_forward_impl(out, lse, q, k, v, scale, sliding_window, cu_seqlens);
  }
  // dq, dk, dv overwritten (every column of their views), none overlapping
  // another operand.
  void attention_backward(const HeadsView& dq, const HeadsView& dk, const HeadsView& dv, const Tensor& dout,
                          const HeadsView& q, const HeadsView& k, const HeadsView& v, const Tensor& out,
                          const Tensor& lse, float scale, int64_t sliding_window,
                          const Tensor* cu_seqlens = nullptr) {
    checks::check_attention(device(), "attention_backward", q, k, v, out, lse, sliding_window, cu_seqlens);
    checks::check_attention_gradients(device(), "attention_backward", dq, dk, dv, dout, q, k, v, out);
    const OpTimer timer(profile_, __func__);
    attention_backward_impl(dq, dk, dv, dout, q, k, v, out, lse, scale, sliding_window, cu_seqlens);
  }

  // Generation's attention: new queries against a key/value cache. q and out
  // [B, Tq, Hq, D]; k_cache and v_cache [B, S, Hkv, D] hold each row's keys
  // and values by position (rotated as attention_forward's k); positions
  // i32 [B * Tq]. Query (b, t) at position p = positions[b * Tq + t] sees the
  // cached keys j <= p of row b (and p - j < sliding_window when that is > 0),
  // exactly the keys attention_forward shows query p of a sequence, and
  // p must be < S. No lse: generation has no backward. On the CPU each query
  // row is computed with attention_forward's own tiles and order (bit for
  // bit the same row in f32), so cached and uncached generation agree.
  void attention_cached(Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                        const Tensor& positions, float scale, int64_t sliding_window) {
    checks::check_attention_cached(device(), out, q, k_cache, v_cache, positions, sliding_window);
    const OpTimer timer(profile_, __func__);
    attention_cached_impl(out, q, k_cache, v_cache, positions, scale, sliding_window);
  }

  // T5's attention (encoder self-attention, decoder self- and
  // cross-attention): scores[i, j] = q_i . k_j + bias[i, j, h], NOT scaled by
  // 1/sqrt(D) (T5 folds that into its initialisation), softmax over the
  // visible keys, out = P v. q [B, Tq, H, D], k and v [B, Tk, H, D], out like
  // q, lse f32 [B, H, Tq] as attention_forward's. bias (null: none, as in
  // cross-attention) is [Tq, Tk, H] f32 or bf16, shared by the batch rows:
  // the relative position bias, an embedding lookup of bucket ids. causal:
  // key j is visible to query i iff j <= i (Tq == Tk); otherwise every key is.
  // key_lengths (null: every key) i32 [B] on the backend, each in [1, Tk]:
  // besides, key j of row b is visible only when j < key_lengths[b], so a
  // right-padded row attends as the row alone would (the encoder's padding
  // mask). Queries past a row's length still get outputs (over its real keys).
  void biased_attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor* bias, const Tensor* key_lengths, bool causal) {
    checks::check_biased_attention(device(), "biased_attention_forward", q, k, v, out, lse, bias, key_lengths,
                                   causal);
    const OpTimer timer(profile_, __func__);
    biased_attention_forward_impl(out, lse, q, k, v, bias, key_lengths, causal);
  }
  // dq, dk, dv overwritten. dbias (null: not wanted) f32 [Tq, Tk, H] +=
  // d(loss)/d(bias) summed over the batch, accumulated like a parameter
  // gradient because T5's later layers reuse the first layer's bias. Masked
  // keys get dk = dv = 0.
  void biased_attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, Tensor* dbias, const Tensor& dout,
                                 const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                 const Tensor& lse, const Tensor* bias, const Tensor* key_lengths, bool causal) {
    checks::check_biased_attention(device(), "biased_attention_backward", q, k, v, out, lse, bias, key_lengths,
                                   causal);
    checks::check_biased_attention_gradients(device(), "biased_attention_backward", dq, dk, dv, dbias, dout, q, k,
                                             lse);
    const OpTimer timer(profile_, __func__);
    biased_attention_backward_impl(dq, dk, dv, dbias, dout, q, k, v, out, lse, bias, key_lengths, causal);
  }

  // ---- T5 feed-forward activation ------------------------------------------
  // out = act(x), times up when given: T5's MLP (relu, up null) and T5 v1.1 /
  // FLAN-T5's gated-gelu (gelu_tanh(wi_0 x) * wi_1 x). All shaped as out;
  // out may alias x.
  void activation_forward(Tensor& out, const Tensor& x, const Tensor* up, Activation kind) {
    checks::check_activation(device(), "activation_forward", out, "out", x, up, nullptr, nullptr);
    const OpTimer timer(profile_, __func__);
    activation_forward_impl(out, x, up, kind);
  }
  // dx = dout * act'(x) (times up when given) and, with up, dup = dout *
  // act(x), both overwritten. relu'(0) = 0, as torch. dx may alias dout.
  void activation_backward(Tensor& dx, Tensor* dup, const Tensor& dout, const Tensor& x, const Tensor* up,
                           Activation kind) {
    checks::check_activation(device(), "activation_backward", dx, "dx", x, up, &dout, dup);
    const OpTimer timer(profile_, __func__);
    activation_backward_impl(dx, dup, dout, x, up, kind);
  }

  // ---- loss --------------------------------------------------------------
  // Softmax cross-entropy over logits [N,V] with targets i32[N]; a target of
  // -100 is ignored. losses f32[N] gets each row's loss (0 for ignored rows).
  // If dlogits is given it is set to (softmax - onehot) * dloss for counted
  // rows and 0 for ignored ones; dlogits may alias logits. For the mean over
  // counted tokens pass dloss = 1 / counted. With row_scales (f32 [N]) row n's
  // gradient is scaled by dloss * row_scales[n] (formed in f64): a loss that
  // weighs each token's log-probability differently (RL's per-token losses).
  void cross_entropy(Tensor& losses, Tensor* dlogits, const Tensor& logits, const Tensor& targets, float dloss,
                     const Tensor* row_scales = nullptr) {
    checks::check_cross_entropy(device(), losses, dlogits, logits, targets, row_scales);
    const OpTimer timer(profile_, __func__);
    cross_entropy_impl(losses, dlogits, logits, targets, dloss, row_scales);
  }

  // ---- LLM.int8() --------------------------------------------------------
  // Row-wise absmax quantisation (bitsandbytes' vector-wise scheme): for each
  // row r of x [R, K] (f32, bf16 or f16), scales[r] = max|x[r, :]| (f32 [R])
  // and q[r, k] = round-half-even(x[r, k] * 127 / scales[r]) (i8 [R, K]),
  // rounding the exact quotient. An all-zero row gets scale 0 and zero codes.
  void quantize_rows_int8(Tensor& q, Tensor& scales, const Tensor& x) {
    checks::check_quantize_rows_int8(device(), q, scales, x);
    const OpTimer timer(profile_, __func__);
    quantize_rows_int8_impl(q, scales, x);
  }
  // out[N, O] = LLM.int8() product of x [N, K] with a frozen weight stored as
  // i8 [O, K] + f32 row scales [O] (W ~ q * scale / 127). Input-feature
  // columns k where any |x[:, k]| >= threshold (threshold > 0; 0 disables)
  // are outliers, found anew on every call (or taken from
  // epilogue.outlier_flags): they are multiplied in f32
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
  // Except on the CUDA backend where it runs fused on a library int8 GEMM
  // (CUTLASS on an sm_90 GPU; bf16 x, out and h: kernels/cuda/int8_linear.cu),
  // which rounds more often for speed: out = bf16(bf16(int8 part + bias) +
  // the outlier and LoRA terms summed in f32), each dequantised outlier
  // weight and lora_scaling * B[o, j] rounded to bf16 first, and outlier
  // columns past kInt8FusedOutlierColumns added with one more rounding;
  // within 4 bf16 units (2^-6) of |out| plus the terms' magnitudes.
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
  // With epilogue.row_absmax the op takes s_x[n] from it instead (it must be
  // at least x's own: int8_row_absmax of x, or the maximum of that over the
  // shards of a row-parallel layer); codes are round(x * 127 / s_x[n]) as
  // above, 0 where s_x[n] is 0.
  // With epilogue.outlier_flags the outlier columns are the flags' set
  // entries instead of x's own: int8_outlier_columns over every row of a
  // batch that x is rows of, so a layer run over chunks of tokens routes the
  // same columns through the 16-bit part as one call over the whole batch.
  // With epilogue.input (int8_quantize_input of this x, made with this
  // threshold) the op takes x's codes, row scales and outlier columns from
  // it and reads x only at the outlier columns.
  void int8_linear_forward(Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& weight_scales,
                           float threshold, const Int8Epilogue& epilogue = {}) {
    checks::check_int8_linear_forward(device(), out, x, weight, weight_scales, threshold, epilogue);
    const OpTimer timer(profile_, __func__);
    int8_linear_forward_impl(out, x, weight, weight_scales, threshold, epilogue);
  }
  // input = x's LLM.int8() input side as int8_linear_forward would make it
  // (the Int8Input's tensors allocated by the caller, its threshold set
  // here): the outlier columns, x's own or the given flags' set entries as
  // the epilogue's outlier_flags, the row scales and the codes. A forward
  // given it (Int8Epilogue::input) is the forward without it, bit for bit;
  // linears that read the same x share one, so x is quantised once a layer.
  void int8_quantize_input(Int8Input& input, const Tensor& x, float threshold,
                           const Tensor* outlier_flags = nullptr) {
    checks::check_int8_quantize_input(device(), input, x, threshold, outlier_flags);
    const OpTimer timer(profile_, __func__);
    input.threshold = threshold;
    int8_quantize_input_impl(input, x, threshold, outlier_flags);
  }
  // flags i32 [K]: flags[k] = 1 where any |x[:, k]| >= threshold (threshold
  // > 0), the others left as they are; so a caller that zeroes flags and
  // calls this once per block of rows has the outlier columns of all the
  // rows, as int8_linear_forward over all of them would find them.
  void int8_outlier_columns(Tensor& flags, const Tensor& x, float threshold) {
    checks::check_int8_outlier_columns(device(), flags, x, threshold);
    const OpTimer timer(profile_, __func__);
    int8_outlier_columns_impl(flags, x, threshold);
  }
  // absmax [N] (f32) = the s_x[n] int8_linear_forward computes from x [N, K]
  // itself (with outlier_flags, the flags' columns are the outliers, as the
  // epilogue's): the absmax of x[n, :] over the columns that are not outliers
  // under threshold. Max is exact, so for x split by columns the maximum
  // over the parts' values is the whole row's, bit for bit (a row-parallel
  // layer's ranks agree on s_x through it: model/tensor_parallel.h).
  void int8_row_absmax(Tensor& absmax, const Tensor& x, float threshold, const Tensor* outlier_flags = nullptr) {
    checks::check_int8_row_absmax(device(), absmax, x, threshold, outlier_flags);
    const OpTimer timer(profile_, __func__);
    int8_row_absmax_impl(absmax, x, threshold, outlier_flags);
  }
  // dx [N, K] = dout [N, O] @ dequant(weight) (dx += ... when accumulate).
  // The weight is dequantised tile by tile, never as a full copy, each value
  // code * scale / 127 in f32, rounded to dout's dtype where that is 16-bit
  // (as bitsandbytes dequantises to the activations' dtype; the CPU takes
  // f16 dout against an f32 tile); products summed in f32. No weight
  // gradient: int8 weights are frozen.
  void int8_linear_backward(Tensor& dx, const Tensor& dout, const Tensor& weight, const Tensor& weight_scales,
                            bool accumulate) {
    checks::check_int8_linear_backward(device(), dx, dout, weight, weight_scales);
    const OpTimer timer(profile_, __func__);
    int8_linear_backward_impl(dx, dout, weight, weight_scales, accumulate);
  }
  // tile [O, C] = every row of the int8 weight [O, K], columns [col0, col0 +
  // C), dequantised as int8_linear_backward's tiles are: code * scale / 127
  // in f32, rounded once to the tile's dtype (merging an adapter into a
  // saved INT8 base).
  void int8_dequantize(Tensor& tile, const Tensor& weight, const Tensor& weight_scales, int64_t col0) {
    checks::check_int8_dequantize(device(), tile, weight, weight_scales, col0);
    const OpTimer timer(profile_, __func__);
    int8_dequantize_impl(tile, weight, weight_scales, col0);
  }

  // ---- NF4 (QLoRA) ------------------------------------------------------
  // tile [R, C] = the NF4 weight's rows [row0, row0 + R) x columns
  // [col0, col0 + C) dequantised as bitsandbytes' dequantize_4bit does
  // (kernels/nf4.h): the block absmax recovered in f32 (map value * nested
  // absmax, then + offset, two roundings, no fma), times the code in f32,
  // rounded once to the tile's dtype.
  void nf4_dequantize(Tensor& tile, const Nf4Weight& weight, int64_t row0, int64_t col0) {
    checks::check_nf4_dequantize(device(), tile, weight, row0, col0);
    const OpTimer timer(profile_, __func__);
    nf4_dequantize_impl(tile, weight, row0, col0);
  }
  // out [N, O] = x [N, K] @ dequant(W)^T (overwritten), the weight
  // dequantised in x's dtype (the compute dtype, as bitsandbytes' matmul_4bit)
  // a block of output rows at a time (kernels/cuda/scratch.h's
  // nf4_forward_scratch), each block one matmul: every element of out is one
  // GEMM sum rounded once. Composed of ops (kernels/nf4_linear.cpp), so every
  // backend and the planner run the same steps.
  void nf4_linear_forward(Tensor& out, const Tensor& x, const Nf4Weight& weight);
  // dx [N, K] = dout [N, O] @ dequant(W) (dx += ... when accumulate), the
  // weight dequantised in dout's dtype a block of input columns at a time
  // (nf4_backward_scratch). No weight gradient: the NF4 base is frozen.
  void nf4_linear_backward(Tensor& dx, const Tensor& dout, const Nf4Weight& weight, bool accumulate);

  // ---- dropout -----------------------------------------------------------
  // out = x * keep / (1 - p), keep[i] = hash_uniform(seed, i) >= p with i the
  // flat element index (kernels/dropout_hash.h), so every backend draws the
  // same mask and backward needs no saved mask. out may alias x. With
  // row_stride, element (n, j) of x [R, C] draws index n * row_stride + j:
  // x is C columns of a wider tensor's rows (a tensor-parallel shard, with
  // seed_at moving to its first column), which draws that tensor's mask.
  void dropout_forward(Tensor& out, const Tensor& x, float p, uint64_t seed, int64_t row_stride = 0) {
    checks::check_dropout(device(), "dropout_forward", out, "out", x, "x", p, row_stride);
    const OpTimer timer(profile_, __func__);
    dropout_forward_impl(out, x, p, seed, row_stride ? row_stride : x.cols());
  }
  // dx = dout * keep / (1 - p) with the same mask; dx may alias dout.
  void dropout_backward(Tensor& dx, const Tensor& dout, float p, uint64_t seed, int64_t row_stride = 0) {
    checks::check_dropout(device(), "dropout_backward", dx, "dx", dout, "dout", p, row_stride);
    const OpTimer timer(profile_, __func__);
    dropout_backward_impl(dx, dout, p, seed, row_stride ? row_stride : dout.cols());
  }
  // x += (2 u_i - 1) * magnitude in place, u_i = hash_uniform(seed, i) with
  // i the flat element index: uniform noise in [-magnitude, magnitude), the
  // same draws as dropout's (kernels/dropout_hash.h), so every backend adds
  // the same noise; each element is x + noise rounded once to f32
  // (add_uniform_noise_value), then to x's dtype. NEFTune's embedding noise.
  void add_uniform_noise(Tensor& x, float magnitude, uint64_t seed) {
    checks::check_uniform_noise(device(), x, magnitude);
    const OpTimer timer(profile_, __func__);
    add_uniform_noise_impl(x, magnitude, seed);
  }

  // ---- optimizer ---------------------------------------------------------
  // torch.optim.AdamW (foreach=False) on f32 param, grad, m, v, with grad
  // multiplied by step.grad_scale first (global-norm clipping):
  //   param *= 1 - lr * wd; m = lerp(m, g, 1 - b1); v = b2 * v + (1 - b2) * g * g;
  //   denom = sqrt(v) / sqrt(1 - b2^t) + eps; param -= (lr / (1 - b1^t)) * m / denom.
  void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& step) {
    checks::check_adamw(device(), "adamw_update", param, grad, m, v, step);
    const OpTimer timer(profile_, __func__);
    adamw_update_impl(param, grad, m, v, step);
  }
  // Sum of squares of all elements (f32/bf16) accumulated in double and
  // returned on the host (for global-norm clipping); independent of the
  // thread or block count.
  double sum_squares(const Tensor& x) {
    checks::check_float(x, device(), "sum_squares", "x");
    const OpTimer timer(profile_, __func__);
    return sum_squares_impl(x);
  }
  // adamw_update on each tensor with tensor.step_for(step), bit-identical to
  // those calls one by one; the CUDA backend updates them all in one launch.
  void adamw_update_many(std::span<const AdamWTensors> tensors, const AdamWStep& step) {
    checks::check_adamw_many(device(), tensors, step);
    const OpTimer timer(profile_, __func__);
    adamw_update_many_impl(tensors, step);
  }
  // The sum of sum_squares(x) over the tensors, added in order in double
  // (each tensor's sum bit-identical to sum_squares on the same backend), with
  // one device->host copy.
  double sum_squares_many(std::span<const Tensor* const> tensors) {
    checks::check_sum_squares_many(device(), tensors);
    const OpTimer timer(profile_, __func__);
    return sum_squares_many_impl(tensors);
  }

 protected:
  FT_BACKEND_OP_IMPLS(virtual, = 0)

  // For a profiled run: the kernel and ISA the running op chose at run time
  // (OpProfile::note_path's parts); one branch when no profile is attached.
  template <typename... Parts>
  void note_path(const Parts&... parts) {
    if (profile_) profile_->note_path({std::string_view(parts)...});
  }

 private:
  OpProfile* profile_ = nullptr;
};

}  // namespace ft
