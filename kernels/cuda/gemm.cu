// Picks the GEMM engine: cuBLASLt exists only in nvcc builds (the emulator
// cannot run NVIDIA's closed kernels), so the emulator build uses the tiled one.
#include "kernels/cuda/gemm.h"

#include "kernels/error.h"

namespace ft::cuda {

GemmKind default_gemm_kind() {
#if defined(__CUDACC__)
  return GemmKind::cublaslt;
#else
  return GemmKind::tiled;
#endif
}

std::unique_ptr<Gemm> make_gemm(GemmKind kind, Allocator& allocator) {
  if (kind == GemmKind::tiled) return make_tiled_gemm();
#if defined(__CUDACC__)
  return make_cublaslt_gemm(allocator);
#else
  (void)allocator;
  fail("cuda: cuBLASLt is not available under the CUDA emulator; use GemmKind::tiled");
#endif
}

}  // namespace ft::cuda
