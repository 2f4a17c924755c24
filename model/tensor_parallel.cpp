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

void check_tensor_split(const ModelConfig& config, int64_t ranks, const std::string& where) {
  const int64_t heads = config.num_attention_heads, kv_heads = config.num_key_value_heads;
  FT_CHECK(heads % ranks == 0 && config.intermediate_size % ranks == 0 &&
               (kv_heads % ranks == 0 || ranks % kv_heads == 0),
           where, "the ranks must divide num_attention_heads (", heads, ") and intermediate_size (",
           config.intermediate_size, "), and divide or be a multiple of num_key_value_heads (", kv_heads, ")");
}

void TensorParallelGroup::max(Backend& backend, Tensor& t) {
  FT_CHECK(t.dtype == DType::f32, "TensorParallelGroup::max: t must be f32, got ", dtype_name(t.dtype));
  if (ranks() > 1) max_f32(backend, t);
}

}  // namespace ft
