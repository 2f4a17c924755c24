// Argument checks shared by every backend, with op-named messages: a shape
// or dtype mistake reads the same whichever backend catches it.
#pragma once
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
