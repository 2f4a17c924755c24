// Argument checks shared by every backend, with op-named messages: a shape
// or dtype mistake reads the same whichever backend catches it.
#pragma once
#include <initializer_list>
#include <utility>

#include "kernels/backend.h"
#include "kernels/error.h"
#include "kernels/tensor.h"

namespace ft::checks {

inline const char* device_name(Device device) {
  return device == Device::cpu ? "CPU" : device == Device::cuda ? "CUDA" : "meta";
}

// On the backend's device, with data unless empty (meta tensors never have data).
inline void check_on(const Tensor& t, Device device, const char* op, const char* name) {
  const bool has_data = t.data != nullptr || t.numel() == 0 || device == Device::meta;
  FT_CHECK(t.device == device && has_data, op, ": ", name, " must be a ", device_name(device),
           " tensor with data (shape ", shape_string(t.shape), ")");
}

// f32 or bf16: the dtypes every floating op accepts.
inline void check_float(const Tensor& t, Device device, const char* op, const char* name) {
  check_on(t, device, op, name);
  FT_CHECK(t.dtype == DType::f32 || t.dtype == DType::bf16, op, ": ", name, " must be f32 or bf16, got ",
           dtype_name(t.dtype));
}

inline void check_dtype(const Tensor& t, DType dtype, Device device, const char* op, const char* name) {
  check_on(t, device, op, name);
  FT_CHECK(t.dtype == dtype, op, ": ", name, " must be ", dtype_name(dtype), ", got ", dtype_name(t.dtype));
}

inline void check_shape(const Tensor& t, const Shape& expected, const char* op, const char* name) {
  FT_CHECK(t.shape == expected, op, ": ", name, " has shape ", shape_string(t.shape), ", expected ",
           shape_string(expected));
}

// For index/statistics vectors that may be [N] or any shape with N elements.
inline void check_numel(const Tensor& t, int64_t expected, const char* op, const char* name) {
  FT_CHECK(t.numel() == expected, op, ": ", name, " has shape ", shape_string(t.shape), " (", t.numel(),
           " elements), expected ", expected, " elements");
}

// A floating tensor shaped like `like` (an output or gradient of the same shape).
inline void check_float_like(const Tensor& t, const Tensor& like, Device device, const char* op, const char* name) {
  check_float(t, device, op, name);
  check_shape(t, like.shape, op, name);
}

// RMSNorm (mean null) and LayerNorm: x [N, C], weight [C], f32 per-row statistics.
inline void check_norm(Device device, const char* op, const Tensor& x, const Tensor& weight, const Tensor* mean,
                       const Tensor& rstd) {
  check_float(x, device, op, "x");
  check_float(weight, device, op, "weight");
  check_shape(weight, {x.cols()}, op, "weight");
  if (mean) {
    check_dtype(*mean, DType::f32, device, op, "mean");
    check_numel(*mean, x.rows(), op, "mean");
  }
  check_dtype(rstd, DType::f32, device, op, "rstd");
  check_numel(rstd, x.rows(), op, "rstd");
}

// A norm backward's gradients: dx and dout shaped as x, the optional
// parameter gradients as weight.
inline void check_norm_backward(Device device, const char* op, const Tensor& dx, const Tensor& dout, const Tensor& x,
                                const Tensor& weight, const Tensor* dweight, const Tensor* dbias) {
  check_float_like(dx, x, device, op, "dx");
  check_float_like(dout, x, device, op, "dout");
  if (dweight) check_float_like(*dweight, weight, device, op, "dweight");
  if (dbias) check_float_like(*dbias, weight, device, op, "dbias");
}

// Backend::copy_columns' contract: same rows, column ranges inside both, no aliasing.
inline void check_copy_columns(Device device, const Tensor& dst, int64_t dst_offset, const Tensor& src,
                               int64_t src_offset, int64_t width) {
  const char* op = "copy_columns";
  check_float(dst, device, op, "dst");
  check_float(src, device, op, "src");
  FT_CHECK(dst.rows() == src.rows(), op, ": dst ", shape_string(dst.shape), " and src ", shape_string(src.shape),
           " differ in rows");
  FT_CHECK(width >= 0 && dst_offset >= 0 && src_offset >= 0 && dst_offset + width <= dst.cols() &&
               src_offset + width <= src.cols(),
           op, ": columns [", dst_offset, ", ", dst_offset + width, ") of dst ", shape_string(dst.shape), " or [",
           src_offset, ", ", src_offset + width, ") of src ", shape_string(src.shape), " out of range");
  FT_CHECK(dst.data != src.data, op, ": dst and src must not alias");
}

// Backend::attention_forward's operands: q [B, T, Hq, D], k and v
// [B, T, Hkv, D] with Hq a multiple of Hkv, out like q, lse f32 [B, Hq, T].
struct AttentionShape {
  int64_t batch, seq, q_heads, kv_heads, head_dim;
};
inline AttentionShape check_attention(Device device, const char* op, const Tensor& q, const Tensor& k,
                                      const Tensor& v, const Tensor& out, const Tensor& lse) {
  check_float(q, device, op, "q");
  check_float(k, device, op, "k");
  check_float(v, device, op, "v");
  check_float(out, device, op, "out");
  check_dtype(lse, DType::f32, device, op, "lse");
  FT_CHECK(q.ndim() == 4 && k.ndim() == 4, op, ": q and k must be [B, T, H, D], got q ", shape_string(q.shape),
           " and k ", shape_string(k.shape));
  AttentionShape s{q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
  FT_CHECK(s.kv_heads > 0 && s.q_heads % s.kv_heads == 0, op, ": query heads (", s.q_heads,
           ") must be a multiple of kv heads (", s.kv_heads, ")");
  check_shape(k, {s.batch, s.seq, s.kv_heads, s.head_dim}, op, "k");
  check_shape(v, k.shape, op, "v");
  check_shape(out, q.shape, op, "out");
  check_shape(lse, {s.batch, s.q_heads, s.seq}, op, "lse");
  return s;
}

// attention_backward's gradients, shaped as their inputs.
inline void check_attention_gradients(Device device, const char* op, const Tensor& dq, const Tensor& dk,
                                      const Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k) {
  check_float_like(dq, q, device, op, "dq");
  check_float_like(dk, k, device, op, "dk");
  check_float_like(dv, k, device, op, "dv");
  check_float_like(dout, q, device, op, "dout");
}

// Embedding forward and backward: rows f32/bf16 [ids.numel(), C] for a
// table [V, C] and i32 ids (ids' range is the backend's to check: reading
// them needs the host). Returns V.
inline int64_t check_embedding(Device device, const char* op, const Tensor& rows, const char* rows_name,
                               const Tensor& ids, const Tensor& table, const char* table_name) {
  check_float(rows, device, op, rows_name);
  check_dtype(ids, DType::i32, device, op, "ids");
  check_float(table, device, op, table_name);
  FT_CHECK(table.ndim() == 2, op, ": ", table_name, " must be [V, C], got ", shape_string(table.shape));
  check_shape(rows, {ids.numel(), table.dim(1)}, op, rows_name);
  return table.dim(0);
}

// SwiGLU's operands, all shaped as the output (or its gradient).
inline void check_swiglu(Device device, const char* op,
                         std::initializer_list<std::pair<const Tensor*, const char*>> operands, const Tensor& like) {
  for (auto [t, name] : operands) check_float_like(*t, like, device, op, name);
}

inline bool overlaps(const Tensor& x, const Tensor& y) {
  const char* x0 = static_cast<const char*>(x.data);
  const char* y0 = static_cast<const char*>(y.data);
  return x0 && y0 && x0 < y0 + y.size_bytes() && y0 < x0 + x.size_bytes();
}

// Backend::matmul's contract: out [M, N] = op(a) [M, K] @ op(b) [K, N], f32 or
// bf16 operands, out aliasing neither input.
inline void check_matmul(const Tensor& out, const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b,
                         Device device) {
  check_float(out, device, "matmul", "out");
  check_float(a, device, "matmul", "a");
  check_float(b, device, "matmul", "b");
  const int64_t M = out.rows(), N = out.cols();
  const int64_t K = transpose_a ? a.rows() : a.cols();
  const int64_t a_rows = transpose_a ? a.cols() : a.rows();
  const int64_t b_rows = transpose_b ? b.cols() : b.rows(), b_cols = transpose_b ? b.rows() : b.cols();
  FT_CHECK(a_rows == M && b_rows == K && b_cols == N, "matmul: out ", shape_string(out.shape), " = op(a) ",
           shape_string(a.shape), (transpose_a ? "^T" : ""), " @ op(b) ", shape_string(b.shape),
           (transpose_b ? "^T" : ""), ": expected op(a) [", M, ", K] and op(b) [K, ", N, "], got op(a) [", a_rows,
           ", ", K, "] and op(b) [", b_rows, ", ", b_cols, "]");
  FT_CHECK(!overlaps(out, a) && !overlaps(out, b), "matmul: out must not alias a or b");
}

// Backend::int8_linear_forward's epilogue over out [N, O]: bias [O] (any
// shape with O elements), lora_h [N, r] and lora_B [O, r], h and B together.
inline void check_int8_epilogue(const Int8Epilogue& e, int64_t N, int64_t O, Device device) {
  const char* op = "int8_linear_forward";
  if (e.bias) {
    check_float(*e.bias, device, op, "bias");
    check_numel(*e.bias, O, op, "bias");
  }
  FT_CHECK(!e.lora_h == !e.lora_B, op, ": lora_h and lora_B come together");
  if (!e.lora_h) return;
  check_float(*e.lora_h, device, op, "lora_h");
  check_float(*e.lora_B, device, op, "lora_B");
  const int64_t r = e.lora_B->cols();
  FT_CHECK(e.lora_B->ndim() == 2 && e.lora_B->rows() == O, op, ": lora_B has shape ", shape_string(e.lora_B->shape),
           ", expected [", O, ", r]");
  FT_CHECK(e.lora_h->rows() == N && e.lora_h->cols() == r, op, ": lora_h has shape ", shape_string(e.lora_h->shape),
           ", expected [", N, ", ", r, "]");
}

}  // namespace ft::checks
