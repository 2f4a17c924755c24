// Argument checks of the CUDA ops, with op-named messages (the same wording as
// the CPU backend's kernels/cpu/cpu_util.h, but tensors must live on the GPU).
#pragma once
#include "kernels/error.h"
#include "kernels/tensor.h"

namespace ft::cuda {

inline void check_on_device(const Tensor& t, const char* op, const char* name) {
  FT_CHECK(t.device == Device::cuda && (t.data != nullptr || t.numel() == 0), op, ": ", name,
           " must be a CUDA tensor with data (shape ", shape_string(t.shape), ")");
}

// f32 or bf16, on the GPU: the dtypes every floating op accepts.
inline void check_float(const Tensor& t, const char* op, const char* name) {
  check_on_device(t, op, name);
  FT_CHECK(t.dtype == DType::f32 || t.dtype == DType::bf16, op, ": ", name, " must be f32 or bf16, got ",
           dtype_name(t.dtype));
}

inline void check_dtype(const Tensor& t, DType dtype, const char* op, const char* name) {
  check_on_device(t, op, name);
  FT_CHECK(t.dtype == dtype, op, ": ", name, " must be ", dtype_name(dtype), ", got ", dtype_name(t.dtype));
}

inline void check_shape(const Tensor& t, const Shape& expected, const char* op, const char* name) {
  FT_CHECK(t.shape == expected, op, ": ", name, " has shape ", shape_string(t.shape), ", expected ",
           shape_string(expected));
}

inline void check_numel(const Tensor& t, int64_t expected, const char* op, const char* name) {
  FT_CHECK(t.numel() == expected, op, ": ", name, " has shape ", shape_string(t.shape), " (", t.numel(),
           " elements), expected ", expected, " elements");
}

}  // namespace ft::cuda
