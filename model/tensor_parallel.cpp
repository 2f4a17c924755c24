#include "model/tensor_parallel.h"

namespace ft {

void TensorParallelGroup::sum(Backend& backend, Tensor& t) {
  if (ranks() == 1) return;
  if (t.dtype == DType::f32) return sum_f32(backend, t);
  Tensor wide = backend.empty(t.shape, DType::f32, MemCategory::activations);
  backend.copy(wide, t);
  sum_f32(backend, wide);
  backend.copy(t, wide);
}

}  // namespace ft
