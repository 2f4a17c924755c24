// CudaBackend construction, and the ops a later part of issue 5 implements.
#include "kernels/cuda/cuda_backend.h"

#include "kernels/error.h"

namespace ft {

// Checked before anything (cuBLASLt's workspace) is allocated from it.
static Allocator& device_allocator(Allocator& allocator) {
  FT_CHECK(allocator.device() == Device::cuda, "CudaBackend needs a device allocator");
  return allocator;
}

CudaBackend::CudaBackend(Allocator& allocator, cuda::GemmKind gemm)
    : allocator_(device_allocator(allocator)), gemm_(cuda::make_gemm(gemm, allocator_)) {}

void CudaBackend::attention_forward(Tensor&, Tensor&, const Tensor&, const Tensor&, const Tensor&, float) {
  fail("cuda: attention_forward not implemented yet");
}

void CudaBackend::attention_backward(Tensor&, Tensor&, Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                     const Tensor&, const Tensor&, const Tensor&, float) {
  fail("cuda: attention_backward not implemented yet");
}

void CudaBackend::int8_linear_forward(Tensor&, const Tensor&, const Tensor&, const Tensor&, float) {
  fail("cuda: int8_linear_forward not implemented yet");
}

void CudaBackend::int8_linear_backward(Tensor&, const Tensor&, const Tensor&, const Tensor&, bool) {
  fail("cuda: int8_linear_backward not implemented yet");
}

// GPT-NeoX's ops (LayerNorm, GELU, biases, fused-qkv columns).
void CudaBackend::copy_columns(Tensor&, int64_t, const Tensor&, int64_t, int64_t) {
  fail("cuda: copy_columns not implemented yet");
}

void CudaBackend::add_bias(Tensor&, const Tensor&) { fail("cuda: add_bias not implemented yet"); }

void CudaBackend::bias_backward(Tensor&, const Tensor&) { fail("cuda: bias_backward not implemented yet"); }

void CudaBackend::layernorm_forward(Tensor&, Tensor&, Tensor&, const Tensor&, const Tensor&, const Tensor&, float) {
  fail("cuda: layernorm_forward not implemented yet");
}

void CudaBackend::layernorm_backward(Tensor&, Tensor*, Tensor*, const Tensor&, const Tensor&, const Tensor&,
                                     const Tensor&, const Tensor&) {
  fail("cuda: layernorm_backward not implemented yet");
}

void CudaBackend::gelu_forward(Tensor&, const Tensor&, GeluKind) { fail("cuda: gelu_forward not implemented yet"); }

void CudaBackend::gelu_backward(Tensor&, const Tensor&, const Tensor&, GeluKind) {
  fail("cuda: gelu_backward not implemented yet");
}

}  // namespace ft
