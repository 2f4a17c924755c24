#include "model/tensor_parallel.h"

#include "kernels/error.h"

namespace ft {

void TensorParallelGroup::sum(Backend& backend, Tensor& t) {
  if (ranks() == 1) return;
  if (t.dtype == DType::f32) return sum_f32(backend, t);
  Tensor wide = backend.empty(t.shape, DType::f32, MemCategory::activations);
  backend.copy(wide, t);
  sum_f32(backend, wide);
  backend.copy(t, wide);
}

void TensorParallelGroup::max(Backend& backend, Tensor& t) {
  FT_CHECK(t.dtype == DType::f32, "TensorParallelGroup::max: t must be f32, got ", dtype_name(t.dtype));
  if (ranks() > 1) max_f32(backend, t);
}

}  // namespace ft
