// CudaBackend construction; the ops live in their own .cu files beside this one.
#include "kernels/cuda/cuda_backend.h"

#include "kernels/cuda/cuda_check.h"
#include "kernels/error.h"

namespace ft {

// Checked before anything (cuBLASLt's workspace) is allocated from it.
static Allocator& device_allocator(Allocator& allocator) {
  FT_CHECK(allocator.device() == Device::cuda, "CudaBackend needs a device allocator");
  return allocator;
}

CudaBackend::CudaBackend(Allocator& allocator, cuda::GemmKind gemm, bool library_attention, bool library_int8_gemm)
    : allocator_(device_allocator(allocator)),
      gemm_(cuda::make_gemm(gemm, allocator_)),
      attention_(library_attention ? cuda::make_library_attention(allocator_) : nullptr),
      int8_gemm_(library_int8_gemm ? cuda::make_library_int8_gemm(allocator_) : nullptr) {
  FT_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
}

CudaBackend::~CudaBackend() {
  // Copies still in flight read pinned memory the caller may free next.
  cudaStreamSynchronize(copy_stream_);
  cudaStreamDestroy(copy_stream_);
}

}  // namespace ft
