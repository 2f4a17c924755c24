// The CUDA backend: every Backend op as our own CUDA kernels (f32
// accumulation, f32 or bf16 storage per kernels/backend.h), matmuls through
// cuda::Gemm (cuBLASLt on a GPU). Device memory comes from the allocator given
// to the constructor (kernels/cuda/device_allocator.h: a CachingAllocator for
// training, a plain DeviceAllocator in tests). All work is issued on the
// legacy default stream, which also orders it with cudaMemcpy; copy_async
// runs on a non-blocking copy stream of its own, ordered by events only.
//
// Build scheme: one .cu file per op family in this folder, written in the
// kernels/launch.h dialect (ft::launch<kernel>(...) instead of <<<>>>,
// FT_DYNAMIC_SHARED), so each file compiles two ways:
//   - nvcc compiles kernels/cuda/*.cu into `kernels_cuda` (real GPUs,
//     sm_80/86/89/90, warnings are errors);
//   - g++ compiles the same files against the CUDA emulator (kernels/emu/)
//     into `kernels_cuda_emu`, through one-line wrappers CMake generates
//     (build/kernels/cuda_emu/<name>.cpp: #include "kernels/cuda/<name>.cu").
//     That library is built wherever the emulator is (CI), and
//     tests/emu/test_cuda_ops.cpp checks every op against CpuBackend with it.
// Code that only makes sense on a GPU is fenced with `#if defined(__CUDACC__)`
// (the choice of cuBLASLt) or lives in files the emulator build skips
// (cublaslt_gemm.cu). This header is plain C++ with identical layout in both
// builds, so g++-compiled code (the trainer, tests) can include it.
#pragma once
#include <memory>

#include "kernels/backend.h"
#include "kernels/cuda/attention_engine.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/int8_gemm_engine.h"
#include "kernels/cuda/scratch.h"

namespace ft {

class CudaBackend final : public Backend {
 public:
  // allocator must hand out device memory (Device::cuda) and outlive the backend.
  // library_attention: try cuDNN SDPA (cuda::make_library_attention) before
  // our attention kernels where the build has it (plain causal attention over
  // whole rows: a sliding window or packed sequences run on ours); false runs
  // ours alone. library_int8_gemm: run the INT8 forward fused on CUTLASS's
  // int8 GEMM (cuda::make_library_int8_gemm) where the build and the GPU have
  // it; false: the int32 product and our epilogue alone.
  explicit CudaBackend(Allocator& allocator, cuda::GemmKind gemm = cuda::default_gemm_kind(),
                       bool library_attention = true, bool library_int8_gemm = true);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;
  const char* name() const override { return "cuda"; }
  Allocator& allocator() override { return allocator_; }
  Allocator& pinned_host_allocator() override { return pinned_; }

 private:
  FT_BACKEND_OP_IMPLS(, override)

  // Temporary device memory for one op (freed when the op returns; with the
  // caching allocator that costs no cudaMalloc after the first step).
  // The ops' own scratch is declared in kernels/cuda/scratch.h.
  Tensor scratch(const cuda::ScratchTensor& t) { return empty(t.shape, t.dtype, MemCategory::workspace); }
  // The norms' shared launches: plain when sum / dresidual is null, fused
  // with the residual add otherwise (arguments checked by the callers).
  void rmsnorm_rows(Tensor& out, Tensor& rstd, Tensor* sum, const Tensor& x, const Tensor* b, const Tensor& weight,
                    float eps);
  void rmsnorm_backward_rows(Tensor& dx, Tensor* dweight, const Tensor& dout, const Tensor* dresidual,
                             const Tensor& x, const Tensor& weight, const Tensor& rstd);
  void layernorm_rows(Tensor& out, Tensor& mean, Tensor& rstd, Tensor* sum, const Tensor& x, const Tensor* b,
                      const Tensor& weight, const Tensor& bias, float eps);
  void layernorm_backward_rows(Tensor& dx, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                               const Tensor* dresidual, const Tensor& x, const Tensor& weight, const Tensor& mean,
                               const Tensor& rstd);

  CUstream_st* stream_of(Stream stream) const { return stream == Stream::copy ? copy_stream_ : stream_; }

  Allocator& allocator_;
  PinnedHostAllocator pinned_;
  std::unique_ptr<cuda::Gemm> gemm_;
  std::unique_ptr<cuda::AttentionEngine> attention_;  // null: our attention kernels only
  std::unique_ptr<cuda::Int8GemmEngine> int8_gemm_;   // null: the INT8 forward unfused
  CUstream_st* stream_ = nullptr;  // cudaStream_t: the legacy default stream
  // copy_async's: non-blocking, so the legacy stream does not serialise with it.
  CUstream_st* copy_stream_ = nullptr;
};

}  // namespace ft
