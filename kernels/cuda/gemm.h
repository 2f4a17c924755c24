// The one matrix product every CUDA op uses, with BLAS (column-major)
// conventions so it maps 1:1 onto cuBLASLt:
//   C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b],  b < batch,
// op(A) m x k, op(B) k x n, C m x n; X[b] starts stride elements after
// X[b - 1]. Two kinds of product:
//   - floating: inputs f32 or bf16 (A and B the same), C f32 or bf16;
//     products accumulate in f32. beta = 0 never reads C (it may hold NaN).
//   - integer (LLM.int8()'s codes): inputs i8, C i32, exact int32
//     arithmetic throughout, so alpha and beta must be integers.
//
// Two engines implement it: cuBLASLt (real GPUs) and a plain shared-memory
// tiled kernel (gemm_tiled.cu), which is what runs under the emulator and can
// be selected on a GPU to cross-check cuBLASLt.
#pragma once
#include <cstdint>
#include <memory>

#include "kernels/allocator.h"
#include "kernels/dtype.h"

// cudaStream_t is CUstream_st*; naming the struct keeps this header (and
// cuda_backend.h) free of CUDA headers, so plain C++ code can include it and
// the emulator's cuda_emu.h can still come first in the backend's sources.
struct CUstream_st;

namespace ft::cuda {

struct GemmOperand {
  const void* data;
  DType dtype;
  bool transposed;
  int64_t ld, stride;
};

struct GemmOutput {
  void* data;
  DType dtype;
  int64_t ld, stride;
};

struct GemmArgs {
  int64_t m, n, k;
  int batch;
  float alpha, beta;
  GemmOperand a, b;
  GemmOutput c;
};

// Throws ft::Error unless args' dtypes (and, for the integer product, alpha
// and beta) form one of the two products above. Both engines call it.
void check_gemm_args(const GemmArgs& args);

class Gemm {
 public:
  virtual ~Gemm() = default;
  virtual void gemm(const GemmArgs& args, CUstream_st* stream) = 0;
};

enum class GemmKind { cublaslt, tiled };

// cuBLASLt where the backend was built by nvcc, the tiled kernel under the emulator.
GemmKind default_gemm_kind();
// allocator provides cuBLASLt's workspace. Asking for cuBLASLt under the
// emulator throws ft::Error.
std::unique_ptr<Gemm> make_gemm(GemmKind kind, Allocator& allocator);

std::unique_ptr<Gemm> make_tiled_gemm();
std::unique_ptr<Gemm> make_cublaslt_gemm(Allocator& allocator);  // nvcc builds only

}  // namespace ft::cuda
