#include "model/output_head.h"

#include "kernels/error.h"

namespace ft {
namespace {

// The head's input: hidden itself, or with dropout a transient dropped copy.
Tensor head_input(Backend& backend, const Tensor& hidden, const HeadDropout& dropout) {
  if (dropout.p == 0.0f) return hidden;
  Tensor dropped = backend.empty(hidden.shape, hidden.dtype, MemCategory::activations);
  backend.dropout_forward(dropped, hidden, dropout.p, dropout.seed);
  return dropped;
}

}  // namespace

std::vector<float> head_outputs(Backend& backend, const HeadParameters& head, const Tensor& hidden,
                                const HeadDropout& dropout) {
  const int64_t N = hidden.rows();
  Tensor outputs = backend.empty({N, 1}, DType::f32, MemCategory::activations);
  backend.matmul(outputs, head_input(backend, hidden, dropout), head.weight->value, false, true);
  if (head.bias) backend.add_bias(outputs, head.bias->value);
  HostAllocator host;
  Tensor host_outputs = Tensor::empty({N}, DType::f32, host, MemCategory::activations);
  backend.copy(host_outputs, outputs.reshaped({N}));
  return {host_outputs.ptr<float>(), host_outputs.ptr<float>() + N};
}

// dout goes up in hidden's dtype, as the LM head's dlogits do
// (lm_head_backward_chunk): products of one dtype, as autocast's backward.
void head_backward(Backend& backend, const HeadParameters& head, const Tensor& hidden, const std::vector<float>& dout,
                   Tensor& dhidden, const HeadDropout& dropout) {
  const int64_t N = hidden.rows();
  FT_CHECK(int64_t(dout.size()) == N, "head_backward: ", dout.size(), " output gradients for ", N, " rows");
  HostAllocator host;
  Tensor host_dout = Tensor::empty({N, 1}, DType::f32, host, MemCategory::activations);
  std::copy(dout.begin(), dout.end(), host_dout.ptr<float>());
  Tensor dout_f32 = backend.empty({N, 1}, DType::f32, MemCategory::activations);
  backend.copy(dout_f32, host_dout);
  Tensor dout_rows = dout_f32;
  if (hidden.dtype != DType::f32) {
    dout_rows = backend.empty({N, 1}, hidden.dtype, MemCategory::activations);
    backend.copy(dout_rows, dout_f32);
  }
  if (dropout.p == 0.0f) {
    backend.matmul(dhidden, dout_rows, head.weight->value, false, false, 1.0f, 1.0f);
  } else {
    Tensor dx = backend.empty(hidden.shape, hidden.dtype, MemCategory::activations);
    backend.matmul(dx, dout_rows, head.weight->value, false, false);
    backend.dropout_backward(dx, dx, dropout.p, dropout.seed);
    backend.add(dhidden, dhidden, dx);
  }
  if (head.weight->trainable())
    backend.matmul(head.weight->grad, dout_rows, head_input(backend, hidden, dropout), true, false, 1.0f, 1.0f);
  if (head.bias && head.bias->trainable()) backend.bias_backward(head.bias->grad, dout_f32);
}

}  // namespace ft
