// Argument checks of the CUDA ops: tensors must live on the GPU.
#pragma once
#include "kernels/error.h"
#include "kernels/op_checks.h"
#include "kernels/tensor.h"

namespace ft::cuda {

// The shared checks (kernels/op_checks.h) with the device fixed to CUDA.
inline void check_on_device(const Tensor& t, const char* op, const char* name) {
  checks::check_on(t, Device::cuda, op, name);
}
inline void check_float(const Tensor& t, const char* op, const char* name) {
  checks::check_float(t, Device::cuda, op, name);
}
inline void check_dtype(const Tensor& t, DType dtype, const char* op, const char* name) {
  checks::check_dtype(t, dtype, Device::cuda, op, name);
}
using checks::check_numel;
using checks::check_shape;
// t is floating and shaped as like.
inline void check_float_like(const Tensor& t, const Tensor& like, const char* op, const char* name) {
  checks::check_float_like(t, like, Device::cuda, op, name);
}

}  // namespace ft::cuda
