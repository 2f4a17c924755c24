// Every op's argument contract (shapes, dtypes, devices, aliasing), checked
// by Backend's public methods (kernels/backend.h) before any backend runs the
// op, so the CPU, CUDA and meta backends accept and reject exactly the same
// calls with the same op-named messages. A backend's implementation checks
// only what needs the data (ids and targets in range, read on the host) or
// its own launch limits. Aliasing is checked by address, so it is caught
// where tensors have data (not on the meta device).
#pragma once
#include <cmath>
#include <initializer_list>
#include <span>
#include <utility>

#include "kernels/error.h"
#include "kernels/op_operands.h"
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
  FT_CHECK(!dst.data || dst.data != src.data, op, ": dst and src must not alias");
}

// A head view (kernels/tensor.h): floating rows, and a column window of
// width >= 1 inside them.
inline void check_heads(const HeadsView& x, Device device, const char* op, const char* name) {
  check_float(x.rows, device, op, name);
  FT_CHECK(x.rows.ndim() >= 1 && x.width >= 1 && x.first_column >= 0 && x.first_column + x.width <= x.pitch(), op,
           ": ", name, " must be columns [c, c + D) with D >= 1 of its rows ", shape_string(x.rows.shape),
           ", got [", x.first_column, ", ", x.first_column + x.width, ")");
}

inline void check_heads_shape(const HeadsView& x, const Shape& expected, const char* op, const char* name) {
  FT_CHECK(x.shape() == expected, op, ": ", name, " has shape ", shape_string(x.shape()), ", expected ",
           shape_string(expected));
}

// Backend::attention_forward's operands: q [B, T, Hq, D], k and v
// [B, T, Hkv, D] with Hq a multiple of Hkv, out like q, lse f32 [B, Hq, T].
struct AttentionShape {
  int64_t batch, seq, q_heads, kv_heads, head_dim;
};
inline AttentionShape attention_shape(const HeadsView& q, const HeadsView& k) {
  return {q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
}
// Attention's window and floating operands (k and v under their names: the
// cached op's are the caches).
inline void check_attention_operands(Device device, const char* op, const HeadsView& q, const HeadsView& k,
                                     const char* k_name, const HeadsView& v, const char* v_name, const Tensor& out,
                                     int64_t sliding_window) {
  FT_CHECK(sliding_window >= 0, op, ": sliding_window must be >= 0 (0: none), got ", sliding_window);
  check_heads(q, device, op, "q");
  check_heads(k, device, op, k_name);
  check_heads(v, device, op, v_name);
  check_float(out, device, op, "out");
}
// Backend::attention_forward's cu_seqlens values (host i32, count = S + 1)
// for B rows of T tokens: 0 first, B * T last, strictly increasing, and every
// row start b * T among them.
inline void check_cu_seqlens_values(const char* op, const int32_t* cu, int64_t count, int64_t B, int64_t T) {
  FT_CHECK(count >= 2 && cu[0] == 0 && cu[count - 1] == B * T, op, ": cu_seqlens must run from 0 to B * T = ",
           B * T, ", got ", count, " offsets from ", count ? cu[0] : 0, " to ", count ? cu[count - 1] : 0);
  int64_t next_row_start = T;
  for (int64_t s = 1; s < count; ++s) {
    FT_CHECK(cu[s] > cu[s - 1], op, ": cu_seqlens must increase strictly, got ", cu[s - 1], " then ", cu[s],
             " at offset ", s);
    FT_CHECK(cu[s] <= next_row_start, op, ": sequence ", s - 1, " (tokens ", cu[s - 1], " to ", cu[s],
             ") crosses the row start ", next_row_start, " (rows of ", T, " tokens)");
    if (cu[s] == next_row_start) next_row_start += T;
  }
}

inline void check_attention(Device device, const char* op, const HeadsView& q, const HeadsView& k,
                            const HeadsView& v, const Tensor& out, const Tensor& lse, int64_t sliding_window,
                            const Tensor* cu_seqlens = nullptr) {
  check_attention_operands(device, op, q, k, "k", v, "v", out, sliding_window);
  check_dtype(lse, DType::f32, device, op, "lse");
  FT_CHECK(q.ndim() == 4 && k.ndim() == 4, op, ": q and k must be [B, T, H, D], got q ", shape_string(q.shape()),
           " and k ", shape_string(k.shape()));
  const AttentionShape s = attention_shape(q, k);
  FT_CHECK(s.kv_heads > 0 && s.q_heads % s.kv_heads == 0, op, ": query heads (", s.q_heads,
           ") must be a multiple of kv heads (", s.kv_heads, ")");
  check_heads_shape(k, {s.batch, s.seq, s.kv_heads, s.head_dim}, op, "k");
  check_heads_shape(v, k.shape(), op, "v");
  check_shape(out, q.shape(), op, "out");
  check_shape(lse, {s.batch, s.q_heads, s.seq}, op, "lse");
  if (!cu_seqlens) return;
  check_dtype(*cu_seqlens, DType::i32, device, op, "cu_seqlens");
  FT_CHECK(cu_seqlens->ndim() == 1 && cu_seqlens->numel() >= s.batch + 1 &&
               cu_seqlens->numel() <= s.batch * s.seq + 1,
           op, ": cu_seqlens must be i32 [S + 1] with ", s.batch, " <= S <= ", s.batch * s.seq, ", got ",
           shape_string(cu_seqlens->shape));
}

// attention_cached: q and out [B, Tq, Hq, D], the caches [B, S, Hkv, D], one
// i32 position per query. Position values are the backend's to check
// (reading them needs the host).
inline void check_attention_cached(Device device, const Tensor& out, const Tensor& q, const Tensor& k_cache,
                                   const Tensor& v_cache, const Tensor& positions, int64_t sliding_window) {
  const char* op = "attention_cached";
  check_attention_operands(device, op, q, k_cache, "k_cache", v_cache, "v_cache", out, sliding_window);
  check_dtype(positions, DType::i32, device, op, "positions");
  FT_CHECK(q.ndim() == 4 && k_cache.ndim() == 4, op, ": q and k_cache must be [B, T, H, D], got q ",
           shape_string(q.shape), " and k_cache ", shape_string(k_cache.shape));
  const int64_t kv_heads = k_cache.dim(2);
  FT_CHECK(kv_heads > 0 && q.dim(2) % kv_heads == 0, op, ": query heads (", q.dim(2),
           ") must be a multiple of kv heads (", kv_heads, ")");
  check_shape(k_cache, {q.dim(0), k_cache.dim(1), kv_heads, q.dim(3)}, op, "k_cache");
  check_shape(v_cache, k_cache.shape, op, "v_cache");
  check_shape(out, q.shape, op, "out");
  check_shape(positions, {q.dim(0) * q.dim(1)}, op, "positions");
}

// Whether two head views share bytes: the same rows with overlapping column windows.
inline bool heads_overlap(const HeadsView& a, const HeadsView& b) {
  return a.rows.data && a.rows.data == b.rows.data && a.first_column < b.first_column + b.width &&
         b.first_column < a.first_column + a.width;
}

// attention_backward's gradients: shaped as their inputs, written without
// touching each other or an input.
inline void check_attention_gradients(Device device, const char* op, const HeadsView& dq, const HeadsView& dk,
                                      const HeadsView& dv, const Tensor& dout, const HeadsView& q,
                                      const HeadsView& k, const HeadsView& v, const Tensor& out) {
  const std::pair<const HeadsView*, const char*> grads[] = {{&dq, "dq"}, {&dk, "dk"}, {&dv, "dv"}};
  const HeadsView inputs[] = {q, k, v, dout, out};
  for (const auto& [grad, name] : grads) {
    check_heads(*grad, device, op, name);
    check_heads_shape(*grad, (grad == &dq ? q : k).shape(), op, name);
    for (const HeadsView& input : inputs)
      FT_CHECK(!input.rows.data || grad->rows.data != input.rows.data, op, ": ", name,
               " must not share memory with an input");
  }
  FT_CHECK(!heads_overlap(dq, dk) && !heads_overlap(dq, dv) && !heads_overlap(dk, dv), op,
           ": dq, dk and dv must not overlap");
  check_float_like(dout, out, device, op, "dout");
}

// Backend::biased_attention_forward's operands: q [B, Tq, H, D], k and v
// [B, Tk, H, D], out like q, lse f32 [B, H, Tq], bias [Tq, Tk, H] or null,
// key_lengths i32 [B] or null; causal needs Tq == Tk.
inline void check_biased_attention(Device device, const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& out, const Tensor& lse, const Tensor* bias,
                                   const Tensor* key_lengths, bool causal) {
  check_attention_operands(device, op, q, k, "k", v, "v", out, /*sliding_window=*/0);
  check_dtype(lse, DType::f32, device, op, "lse");
  FT_CHECK(q.ndim() == 4 && k.ndim() == 4, op, ": q and k must be [B, T, H, D], got q ", shape_string(q.shape),
           " and k ", shape_string(k.shape));
  const int64_t B = q.dim(0), Tq = q.dim(1), H = q.dim(2), D = q.dim(3), Tk = k.dim(1);
  check_shape(k, {B, Tk, H, D}, op, "k");
  check_shape(v, k.shape, op, "v");
  check_shape(out, q.shape, op, "out");
  check_shape(lse, {B, H, Tq}, op, "lse");
  FT_CHECK(!causal || Tq == Tk, op, ": causal attention needs as many keys as queries, got ", Tk, " and ", Tq);
  if (key_lengths) {
    check_dtype(*key_lengths, DType::i32, device, op, "key_lengths");
    check_shape(*key_lengths, {B}, op, "key_lengths");
  }
  if (!bias) return;
  check_float(*bias, device, op, "bias");
  check_shape(*bias, {Tq, Tk, H}, op, "bias");
}

// biased_attention_backward's gradients: dq, dk, dv and dout as their
// inputs, dbias f32 [Tq, Tk, H] when given.
inline void check_biased_attention_gradients(Device device, const char* op, const Tensor& dq, const Tensor& dk,
                                             const Tensor& dv, const Tensor* dbias, const Tensor& dout,
                                             const Tensor& q, const Tensor& k, const Tensor& lse) {
  check_float_like(dq, q, device, op, "dq");
  check_float_like(dk, k, device, op, "dk");
  check_float_like(dv, k, device, op, "dv");
  check_float_like(dout, q, device, op, "dout");
  if (!dbias) return;
  check_dtype(*dbias, DType::f32, device, op, "dbias");
  check_shape(*dbias, {lse.dim(2), k.dim(1), q.dim(2)}, op, "dbias");
}

// Backend::activation_forward/backward: every operand shaped as x.
inline void check_activation(Device device, const char* op, const Tensor& out, const char* out_name, const Tensor& x,
                             const Tensor* up, const Tensor* dout, const Tensor* dup) {
  check_float(x, device, op, "x");
  check_float_like(out, x, device, op, out_name);
  if (up) check_float_like(*up, x, device, op, "up");
  if (dout) check_float_like(*dout, x, device, op, "dout");
  if (dup) check_float_like(*dup, x, device, op, "dup");
  FT_CHECK(!dup || up, op, ": dup needs up");
}

// Embedding forward and backward: rows f32/bf16 [ids.numel(), C] for a
// table [V, C] and i32 ids (ids' range is the backend's to check: reading
// them needs the host).
inline void check_embedding(Device device, const char* op, const Tensor& rows, const char* rows_name,
                               const Tensor& ids, const Tensor& table, const char* table_name) {
  check_float(rows, device, op, rows_name);
  check_dtype(ids, DType::i32, device, op, "ids");
  check_float(table, device, op, table_name);
  FT_CHECK(table.ndim() == 2, op, ": ", table_name, " must be [V, C], got ", shape_string(table.shape));
  check_shape(rows, {ids.numel(), table.dim(1)}, op, rows_name);
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
inline void check_matmul(Device device, const Tensor& out, const Tensor& a, const Tensor& b, bool transpose_a,
                         bool transpose_b) {
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

// Backend::accumulate_outer_products: grad f32 [M, P] += a [N, M]^T b [N, P]
// (each viewed as [rows, cols], as matmul's operands), grad aliasing neither
// input.
inline void check_accumulate_outer_products(Device device, const Tensor& grad, const Tensor& a, const Tensor& b) {
  const char* op = "accumulate_outer_products";
  check_dtype(grad, DType::f32, device, op, "grad");
  check_float(a, device, op, "a");
  check_float(b, device, op, "b");
  FT_CHECK(a.rows() == b.rows() && grad.rows() == a.cols() && grad.cols() == b.cols(),
           op, ": grad ", shape_string(grad.shape), " += a ", shape_string(a.shape), "^T @ b ", shape_string(b.shape),
           ": expected a [N, ", grad.rows(), "] and b [N, ", grad.cols(), "] with the same N");
  FT_CHECK(!overlaps(grad, a) && !overlaps(grad, b), op, ": grad must not alias a or b");
}

// Backend::int8_outlier_columns's flags over K input features: i32 [K]
// (any shape with K elements).
inline void check_outlier_flags(Device device, const char* op, const Tensor& flags, int64_t K) {
  check_dtype(flags, DType::i32, device, op, "outlier_flags");
  check_numel(flags, K, op, "outlier_flags");
}

// An Int8Input for x [N, K]: codes i8 [N, K], row_absmax f32 [N] and
// outlier_columns i32 [int8_outlier_list_elements(K)] (any shapes with those
// element counts).
inline void check_int8_input(Device device, const char* op, const Int8Input& input, int64_t N, int64_t K) {
  check_dtype(input.codes, DType::i8, device, op, "input.codes");
  check_numel(input.codes, N * K, op, "input.codes");
  check_dtype(input.row_absmax, DType::f32, device, op, "input.row_absmax");
  check_numel(input.row_absmax, N, op, "input.row_absmax");
  check_dtype(input.outlier_columns, DType::i32, device, op, "input.outlier_columns");
  check_numel(input.outlier_columns, int8_outlier_list_elements(K), op, "input.outlier_columns");
}

// Backend::int8_linear_forward's epilogue over out [N, O]: bias [O] (any
// shape with O elements), lora_h [N, r] and lora_B [O, r], h and B together,
// row_absmax f32 [N] (any shape with N elements), outlier_flags i32 [K].
inline void check_int8_epilogue(Device device, const Int8Epilogue& e, int64_t N, int64_t K, int64_t O) {
  const char* op = "int8_linear_forward";
  if (e.outlier_flags) check_outlier_flags(device, op, *e.outlier_flags, K);
  if (e.row_absmax) {
    check_dtype(*e.row_absmax, DType::f32, device, op, "row_absmax");
    check_numel(*e.row_absmax, N, op, "row_absmax");
  }
  if (e.input) {
    FT_CHECK(!e.row_absmax && !e.outlier_flags, op,
             ": a quantised input excludes row_absmax and outlier_flags (they went into it)");
    check_int8_input(device, op, *e.input, N, K);
  }
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


inline bool is_floating(DType dtype) { return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16; }

// Backend::copy: each side on the backend's device or the host (with data
// unless meta), at least one on the device; equal element counts; a dtype
// change only between floating dtypes.
// On the meta device (the planner) host tensors have no data either.
inline void check_copy(Device device, const Tensor& dst, const Tensor& src) {
  for (auto [t, name] : {std::pair{&dst, "dst"}, std::pair{&src, "src"}}) {
    const bool has_data = t->data != nullptr || t->numel() == 0 || t->device == Device::meta || device == Device::meta;
    FT_CHECK((t->device == device || t->device == Device::cpu) && has_data, "copy: ", name, " must be a ",
             device_name(device), " or CPU tensor with data (shape ", shape_string(t->shape), ")");
  }
  FT_CHECK(dst.device == device || src.device == device, "copy: the ", device_name(device),
           " backend copies to or from its device; both tensors are on the CPU");
  FT_CHECK(dst.numel() == src.numel(), "copy: dst ", shape_string(dst.shape), " and src ", shape_string(src.shape),
           " have different element counts");
  FT_CHECK(dst.dtype == src.dtype || (is_floating(dst.dtype) && is_floating(src.dtype)), "copy: cannot convert ",
           dtype_name(src.dtype), " to ", dtype_name(dst.dtype));
}

// One side on the backend's device, the other a pinned host tensor (with
// data, unless the backend is the meta device, which has none).
inline void check_copy_async(Device device, const Tensor& dst, const Tensor& src) {
  const bool to_device = dst.device == device;
  const Tensor& host = to_device ? src : dst;
  check_on(to_device ? dst : src, device, "copy_async", to_device ? "dst" : "src");
  const bool has_data = host.data != nullptr || host.numel() == 0 || device == Device::meta;
  FT_CHECK(host.device == Device::cpu && has_data, "copy_async: ", to_device ? "src" : "dst",
           " must be a pinned host tensor with data (shape ", shape_string(host.shape), ")");
  FT_CHECK(dst.dtype == src.dtype && dst.numel() == src.numel(), "copy_async: dst ", dtype_name(dst.dtype), " ",
           shape_string(dst.shape), " and src ", dtype_name(src.dtype), " ", shape_string(src.shape),
           " differ (copy_async copies bytes)");
}

inline void check_fill(Device device, const Tensor& dst) { check_on(dst, device, "fill", "dst"); }

// out = a + b: all floating and shaped alike.
inline void check_add(Device device, const Tensor& out, const Tensor& a, const Tensor& b) {
  check_float(out, device, "add", "out");
  check_float_like(a, out, device, "add", "a");
  check_float_like(b, out, device, "add", "b");
}

// A bias [C] over out [N, C] (add_bias) or its gradient over dout (bias_backward).
inline void check_bias(Device device, const char* op, const Tensor& bias, const char* bias_name, const Tensor& rows,
                       const char* rows_name) {
  check_float(rows, device, op, rows_name);
  check_float(bias, device, op, bias_name);
  check_shape(bias, {rows.cols()}, op, bias_name);
}

// row_sum_squares: x [R, C] floating, sums f32 with R elements.
inline void check_row_sum_squares(Device device, const Tensor& sums, const Tensor& x) {
  const char* op = "row_sum_squares";
  check_float(x, device, op, "x");
  check_dtype(sums, DType::f32, device, op, "sums");
  check_numel(sums, x.rows(), op, "sums");
}

// DoRA's per-column vectors over rows [N, O]: magnitude and bias floating
// [O], weight_sum_squares f32 [O].
inline void check_dora_vectors(Device device, const char* op, const Tensor& rows, const Tensor& magnitude,
                               const Tensor& weight_sum_squares, const Tensor* bias) {
  const Shape columns = {rows.cols()};
  check_float(magnitude, device, op, "magnitude");
  check_shape(magnitude, columns, op, "magnitude");
  check_dtype(weight_sum_squares, DType::f32, device, op, "weight_sum_squares");
  check_shape(weight_sum_squares, columns, op, "weight_sum_squares");
  if (bias) {
    check_float(*bias, device, op, "bias");
    check_shape(*bias, columns, op, "bias");
  }
}

// dora_scale_forward: out [N, O] floating, z like out (it may be out).
inline void check_dora_scale_forward(Device device, const Tensor& out, const Tensor& z, const Tensor& magnitude,
                                     const Tensor& weight_sum_squares, const Tensor* bias) {
  const char* op = "dora_scale_forward";
  check_float(out, device, op, "out");
  check_float_like(z, out, device, op, "z");
  check_dora_vectors(device, op, out, magnitude, weight_sum_squares, bias);
}

// dora_scale_backward: dout [N, O] floating, z like dout, dz and dbase like
// dout in shape and dtype (dz may alias dout, dbase neither), dmagnitude f32
// [O] or null.
inline void check_dora_scale_backward(Device device, const Tensor& dz, const Tensor* dbase, const Tensor* dmagnitude,
                                      const Tensor& dout, const Tensor& z, const Tensor& magnitude,
                                      const Tensor& weight_sum_squares, const Tensor* bias) {
  const char* op = "dora_scale_backward";
  check_float(dout, device, op, "dout");
  check_dora_vectors(device, op, dout, magnitude, weight_sum_squares, bias);
  check_float_like(z, dout, device, op, "z");
  for (auto [t, name] : {std::pair{&dz, "dz"}, std::pair<const Tensor*, const char*>{dbase, "dbase"}}) {
    if (!t) continue;
    check_float_like(*t, dout, device, op, name);
    FT_CHECK(t->dtype == dout.dtype, op, ": ", name, " must be ", dtype_name(dout.dtype), " as dout, got ",
             dtype_name(t->dtype));
  }
  FT_CHECK(!dbase || (!overlaps(*dbase, dout) && !overlaps(*dbase, dz)), op, ": dbase must not alias dout or dz");
  if (dmagnitude) {
    check_dtype(*dmagnitude, DType::f32, device, op, "dmagnitude");
    check_shape(*dmagnitude, {dout.cols()}, op, "dmagnitude");
  }
}

inline void check_rmsnorm_forward(Device device, const char* op, const Tensor& out, const Tensor& rstd,
                                  const Tensor& x, const Tensor& weight) {
  check_norm(device, op, x, weight, nullptr, rstd);
  check_float_like(out, x, device, op, "out");
}

inline void check_layernorm_forward(Device device, const char* op, const Tensor& out, const Tensor& mean,
                                    const Tensor& rstd, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_norm(device, op, x, weight, &mean, rstd);
  check_float_like(bias, weight, device, op, "bias");
  check_float_like(out, x, device, op, "out");
}

// The fused residual norms' extra operands: b and sum shaped as a.
inline void check_residual_sum(Device device, const char* op, const Tensor& sum, const Tensor& a, const Tensor& b) {
  check_float_like(b, a, device, op, "b");
  check_float_like(sum, a, device, op, "sum");
}

// A norm backward (mean null for RMSNorm, dbias null unless LayerNorm's),
// with dresidual shaped as x for the fused forms.
inline void check_norm_backward_op(Device device, const char* op, const Tensor& dx, const Tensor* dweight,
                                   const Tensor* dbias, const Tensor& dout, const Tensor* dresidual, const Tensor& x,
                                   const Tensor& weight, const Tensor* mean, const Tensor& rstd) {
  check_norm(device, op, x, weight, mean, rstd);
  check_norm_backward(device, op, dx, dout, x, weight, dweight, dbias);
  if (dresidual) check_float_like(*dresidual, x, device, op, "dresidual");
}

// x [..., H, D] with positions i32 of one per token; rotary_dim = 2 * inv_freq.size()
// in (0, D]; inv_freq finite and positive.
inline void check_rope(Device device, const char* op, const HeadsView& x, const Tensor& positions,
                       std::span<const float> inv_freq) {
  const int64_t rotary_dim = 2 * int64_t(inv_freq.size());
  for (float f : inv_freq)
    FT_CHECK(std::isfinite(f) && f > 0.0f, op, ": inv_freq must be finite and positive, got ", f);
  check_heads(x, device, op, "x");
  check_dtype(positions, DType::i32, device, op, "positions");
  FT_CHECK(x.ndim() >= 3 && x.dim(-2) > 0, op, ": x must be [N, H, D], got ", shape_string(x.shape()));
  const int64_t head_dim = x.width;
  check_numel(positions, x.rows.rows() / x.dim(-2), op, "positions");
  FT_CHECK(rotary_dim > 0 && rotary_dim <= head_dim, op, ": rotary_dim ", rotary_dim,
           " (twice inv_freq's ", inv_freq.size(), " entries) must be in (0, head_dim = ", head_dim, "]");
}

// GELU forward (dout null) and backward: every operand floating and shaped as x.
inline void check_gelu(Device device, const char* op, const Tensor& out, const char* out_name, const Tensor* dout,
                       const Tensor& x) {
  check_float(x, device, op, "x");
  check_float_like(out, x, device, op, out_name);
  if (dout) check_float_like(*dout, x, device, op, "dout");
}

inline void check_cross_entropy(Device device, const Tensor& losses, const Tensor* dlogits, const Tensor& logits,
                                const Tensor& targets, const Tensor* row_scales) {
  const char* op = "cross_entropy";
  check_float(logits, device, op, "logits");
  check_dtype(targets, DType::i32, device, op, "targets");
  check_dtype(losses, DType::f32, device, op, "losses");
  check_numel(targets, logits.rows(), op, "targets");
  check_numel(losses, logits.rows(), op, "losses");
  if (dlogits) check_float_like(*dlogits, logits, device, op, "dlogits");
  if (row_scales) {
    check_dtype(*row_scales, DType::f32, device, op, "row_scales");
    check_numel(*row_scales, logits.rows(), op, "row_scales");
  }
}

inline void check_quantize_rows_int8(Device device, const Tensor& q, const Tensor& scales, const Tensor& x) {
  const char* op = "quantize_rows_int8";
  check_on(x, device, op, "x");
  FT_CHECK(is_floating(x.dtype), op, ": x must be f32, bf16 or f16, got ", dtype_name(x.dtype));
  check_dtype(q, DType::i8, device, op, "q");
  check_dtype(scales, DType::f32, device, op, "scales");
  check_shape(q, x.shape, op, "q");
  check_numel(scales, x.rows(), op, "scales");
}

// A frozen LLM.int8() weight: i8 [O, K] with f32 row scales [O].
inline void check_int8_weight(Device device, const char* op, const Tensor& weight, const Tensor& scales) {
  check_dtype(weight, DType::i8, device, op, "weight");
  check_dtype(scales, DType::f32, device, op, "weight_scales");
  FT_CHECK(weight.ndim() == 2, op, ": weight must be 2-D [out, in], got ", shape_string(weight.shape));
  check_numel(scales, weight.dim(0), op, "weight_scales");
}

// out [N, O] = x [N, K] times weight [O, K]^T, plus the epilogue.
inline void check_int8_linear_forward(Device device, const Tensor& out, const Tensor& x, const Tensor& weight,
                                      const Tensor& weight_scales, float threshold, const Int8Epilogue& epilogue) {
  const char* op = "int8_linear_forward";
  check_float(out, device, op, "out");
  check_float(x, device, op, "x");
  check_int8_weight(device, op, weight, weight_scales);
  FT_CHECK(threshold >= 0.0f, op, ": threshold must be >= 0 (0 disables outliers), got ", threshold);
  const int64_t N = x.rows(), O = weight.dim(0);
  FT_CHECK(weight.dim(1) == x.cols(), op, ": x ", shape_string(x.shape), " does not match weight ",
           shape_string(weight.shape));
  FT_CHECK(out.rows() == N && out.cols() == O, op, ": out has shape ", shape_string(out.shape), ", expected [", N,
           ", ", O, "]");
  check_int8_epilogue(device, epilogue, N, x.cols(), O);
  if (epilogue.input)
    FT_CHECK(epilogue.input->threshold == threshold, op, ": the quantised input was made with threshold ",
             epilogue.input->threshold, ", the call's is ", threshold);
}

// input's tensors for x [N, K], none aliasing x or another; outlier_flags i32 [K].
inline void check_int8_quantize_input(Device device, const Int8Input& input, const Tensor& x, float threshold,
                                      const Tensor* outlier_flags) {
  const char* op = "int8_quantize_input";
  check_float(x, device, op, "x");
  FT_CHECK(threshold >= 0.0f, op, ": threshold must be >= 0 (0 disables outliers), got ", threshold);
  check_int8_input(device, op, input, x.rows(), x.cols());
  const Tensor* parts[] = {&input.codes, &input.row_absmax, &input.outlier_columns, &x};
  for (int i = 0; i < 4; ++i)
    for (int j = i + 1; j < 4; ++j)
      FT_CHECK(!overlaps(*parts[i], *parts[j]), op, ": input's tensors must not alias each other or x");
  if (outlier_flags) check_outlier_flags(device, op, *outlier_flags, x.cols());
}

// absmax f32 [N] (any shape with N elements) for x [N, K].
inline void check_int8_row_absmax(Device device, const Tensor& absmax, const Tensor& x, float threshold,
                                  const Tensor* outlier_flags) {
  const char* op = "int8_row_absmax";
  check_dtype(absmax, DType::f32, device, op, "absmax");
  check_float(x, device, op, "x");
  FT_CHECK(threshold >= 0.0f, op, ": threshold must be >= 0 (0 disables outliers), got ", threshold);
  check_numel(absmax, x.rows(), op, "absmax");
  FT_CHECK(!overlaps(absmax, x), op, ": absmax must not alias x");
  if (outlier_flags) check_outlier_flags(device, op, *outlier_flags, x.cols());
}

// flags i32 [K] for x [N, K].
inline void check_int8_outlier_columns(Device device, const Tensor& flags, const Tensor& x, float threshold) {
  const char* op = "int8_outlier_columns";
  check_float(x, device, op, "x");
  FT_CHECK(threshold >= 0.0f, op, ": threshold must be >= 0 (0 disables outliers), got ", threshold);
  check_outlier_flags(device, op, flags, x.cols());
  FT_CHECK(!overlaps(flags, x), op, ": flags must not alias x");
}

// dx [N, K] from dout [N, O] and weight [O, K].
inline void check_int8_linear_backward(Device device, const Tensor& dx, const Tensor& dout, const Tensor& weight,
                                       const Tensor& weight_scales) {
  const char* op = "int8_linear_backward";
  check_float(dx, device, op, "dx");
  check_float(dout, device, op, "dout");
  check_int8_weight(device, op, weight, weight_scales);
  const int64_t N = dout.rows(), K = weight.dim(1);
  FT_CHECK(weight.dim(0) == dout.cols(), op, ": dout ", shape_string(dout.shape), " does not match weight ",
           shape_string(weight.shape));
  FT_CHECK(dx.rows() == N && dx.cols() == K, op, ": dx has shape ", shape_string(dx.shape), ", expected [", N, ", ",
           K, "]");
}

inline void check_int8_dequantize(Device device, const Tensor& tile, const Tensor& weight, const Tensor& weight_scales,
                                  int64_t col0) {
  const char* op = "int8_dequantize";
  check_float(tile, device, op, "tile");
  check_int8_weight(device, op, weight, weight_scales);
  FT_CHECK(tile.ndim() == 2 && tile.rows() == weight.dim(0) && col0 >= 0 && col0 + tile.cols() <= weight.dim(1), op,
           ": tile ", shape_string(tile.shape), " at column ", col0, " does not fit the rows of weight ",
           shape_string(weight.shape));
}

// A frozen NF4 weight (op_operands.h's Nf4Weight) with consistent sizes.
inline void check_nf4_weight(Device device, const char* op, const Nf4Weight& w) {
  FT_CHECK(w.codes && w.absmax, op, ": the NF4 weight needs codes and absmax");
  FT_CHECK(w.out_features >= 0 && w.in_features >= 0, op, ": NF4 weight shape [", w.out_features, ", ",
           w.in_features, "] must not be negative");
  const int64_t elements = w.out_features * w.in_features, blocks = (elements + 63) / 64;
  check_dtype(*w.codes, DType::u8, device, op, "codes");
  check_numel(*w.codes, (elements + 1) / 2, op, "codes");
  FT_CHECK(!w.nested_absmax == !w.nested_map, op, ": nested_absmax and nested_map come together");
  check_dtype(*w.absmax, w.double_quant() ? DType::u8 : DType::f32, device, op, "absmax");
  check_numel(*w.absmax, blocks, op, "absmax");
  if (!w.double_quant()) return;
  check_dtype(*w.nested_absmax, DType::f32, device, op, "nested_absmax");
  check_numel(*w.nested_absmax, (blocks + 255) / 256, op, "nested_absmax");
  check_dtype(*w.nested_map, DType::f32, device, op, "nested_map");
  check_numel(*w.nested_map, 256, op, "nested_map");
}

// tile [rows, cols] (floating) inside the weight from (row0, col0).
inline void check_nf4_dequantize(Device device, const Tensor& tile, const Nf4Weight& w, int64_t row0,
                                 int64_t col0) {
  const char* op = "nf4_dequantize";
  check_nf4_weight(device, op, w);
  check_float(tile, device, op, "tile");
  FT_CHECK(tile.ndim() == 2, op, ": tile must be 2-D, got ", shape_string(tile.shape));
  FT_CHECK(row0 >= 0 && col0 >= 0 && row0 + tile.rows() <= w.out_features && col0 + tile.cols() <= w.in_features,
           op, ": tile ", shape_string(tile.shape), " at (", row0, ", ", col0, ") exceeds the weight [",
           w.out_features, ", ", w.in_features, "]");
}

// out [N, O] = x [N, K] times the NF4 weight [O, K]^T.
inline void check_nf4_linear_forward(Device device, const Tensor& out, const Tensor& x, const Nf4Weight& w) {
  const char* op = "nf4_linear_forward";
  check_nf4_weight(device, op, w);
  check_float(out, device, op, "out");
  check_float(x, device, op, "x");
  FT_CHECK(x.cols() == w.in_features, op, ": x ", shape_string(x.shape), " does not match the weight's ",
           w.in_features, " input features");
  FT_CHECK(out.rows() == x.rows() && out.cols() == w.out_features, op, ": out has shape ", shape_string(out.shape),
           ", expected [", x.rows(), ", ", w.out_features, "]");
  FT_CHECK(!overlaps(out, x), op, ": out must not alias x");
}

// dx [N, K] from dout [N, O] through the NF4 weight [O, K].
inline void check_nf4_linear_backward(Device device, const Tensor& dx, const Tensor& dout, const Nf4Weight& w) {
  const char* op = "nf4_linear_backward";
  check_nf4_weight(device, op, w);
  check_float(dx, device, op, "dx");
  check_float(dout, device, op, "dout");
  FT_CHECK(dout.cols() == w.out_features, op, ": dout ", shape_string(dout.shape), " does not match the weight's ",
           w.out_features, " output features");
  FT_CHECK(dx.rows() == dout.rows() && dx.cols() == w.in_features, op, ": dx has shape ", shape_string(dx.shape),
           ", expected [", dout.rows(), ", ", w.in_features, "]");
  FT_CHECK(!overlaps(dx, dout), op, ": dx must not alias dout");
}

// Dropout forward and backward: out shaped as x, p in [0, 1] (1 drops all).
inline void check_dropout(Device device, const char* op, const Tensor& out, const char* out_name, const Tensor& x,
                          const char* x_name, float p, int64_t row_stride) {
  check_float(out, device, op, out_name);
  check_float_like(x, out, device, op, x_name);
  FT_CHECK(p >= 0.0f && p <= 1.0f, op, ": p must be in [0, 1], got ", p);
  FT_CHECK(row_stride == 0 || (x.ndim() == 2 && row_stride >= x.cols()), op, ": row_stride ", row_stride,
           " needs a 2-D ", x_name, " of at most that many columns, got ", shape_string(x.shape));
}

// Uniform noise on a float tensor: a finite magnitude >= 0.
inline void check_uniform_noise(Device device, const Tensor& x, float magnitude) {
  const char* op = "add_uniform_noise";
  check_float(x, device, op, "x");
  FT_CHECK(std::isfinite(magnitude) && magnitude >= 0.0f, op, ": magnitude must be finite and >= 0, got ",
           magnitude);
}

// AdamW's f32 param, grad, m and v of equal size; steps count from 1.
inline void check_adamw(Device device, const char* op, const Tensor& param, const Tensor& grad, const Tensor& m,
                        const Tensor& v, const AdamWStep& step) {
  for (auto [t, name] : {std::pair{&param, "param"}, std::pair{&grad, "grad"}, std::pair{&m, "m"},
                         std::pair{&v, "v"}}) {
    check_dtype(*t, DType::f32, device, op, name);
    check_numel(*t, param.numel(), op, name);
  }
  FT_CHECK(step.step >= 1, op, ": step counts from 1, got ", step.step);
}

inline void check_adamw_many(Device device, std::span<const AdamWTensors> tensors, const AdamWStep& step) {
  for (const AdamWTensors& t : tensors) check_adamw(device, "adamw_update_many", *t.param, *t.grad, *t.m, *t.v, step);
}

inline void check_sum_squares_many(Device device, std::span<const Tensor* const> tensors) {
  for (const Tensor* x : tensors) check_float(*x, device, "sum_squares_many", "x");
}

}  // namespace ft::checks
