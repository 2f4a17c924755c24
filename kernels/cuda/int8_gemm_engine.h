// A library int8 GEMM with LLM.int8()'s dequantisation and the bias in its
// epilogue, which the CUDA backend's int8 forward uses where it has one
// (int8_linear.cu: the product is written once, in bf16, with no int32
// round trip through memory), as attention_engine.h puts cuDNN SDPA before
// our attention kernels: CUTLASS's Hopper kernel (kernels/cutlass/) on an
// sm_90 GPU in a build with CUTLASS's headers. The emulator cannot run
// CUTLASS, so it gets a substitute of ours with the same arithmetic (the
// int32 product through cuda::Gemm, then a scaling kernel), which tests use
// to run everything around the GEMM, and a GPU test compares with CUTLASS.
// Plain C++, like gemm.h.
#pragma once
#include <memory>

#include "kernels/allocator.h"
#include "kernels/cuda/gemm.h"
#include "kernels/tensor.h"

struct CUstream_st;

namespace ft::cuda {

class Int8GemmEngine {
 public:
  virtual ~Int8GemmEngine() = default;
  // Whether scaled_product takes K and O (int8_scaled_gemm_takes for the
  // library's, whose sizes the memory planner sees too; ours takes any).
  virtual bool takes(int64_t in_features, int64_t out_features) const = 0;
  // out [N, O] bf16 = bf16(fma(1 / 127^2, s_x[n] * (s_w[o] * float(acc[n, o])), bias[o]))
  // with acc = codes [N, K] i8 @ weight [O, K]^T in exact int32, row_scales
  // f32 [N], weight_scales f32 [O], bias f32 [O] or null (0); sizes it
  // takes, every tensor packed and 16-byte aligned (throws otherwise).
  virtual void scaled_product(Tensor& out, const Tensor& codes, const Tensor& weight, const Tensor& row_scales,
                              const Tensor& weight_scales, const Tensor* bias, CUstream_st* stream) = 0;
};

// CUTLASS's kernel where this build has it (nvcc with CUTLASS's headers and
// sm_90 among its architectures), the GPU is sm_90 (the kernel is built for
// sm_90a alone) and the environment does not say FT_INT8_GEMM_ENGINE=ours;
// else null. allocator provides the kernel's workspace, if any.
std::unique_ptr<Int8GemmEngine> make_library_int8_gemm(Allocator& allocator);
// False where FT_INT8_GEMM_ENGINE=ours; throws on a value other than auto or ours.
bool library_int8_gemm_wanted();
// Whether make_library_int8_gemm returns an engine here (build, GPU, environment).
bool library_int8_gemm_available();

// Ours: the int32 product through gemm (scratch from allocator), then the
// epilogue's arithmetic in a kernel of its own, bit for bit the engine's
// formula above.
std::unique_ptr<Int8GemmEngine> make_substitute_int8_gemm(Gemm& gemm, Allocator& allocator);

}  // namespace ft::cuda
