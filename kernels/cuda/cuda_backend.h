// The CUDA backend: every Backend op as our own CUDA kernels (f32
// accumulation, f32 or bf16 storage per kernels/backend.h), matmuls through
// cuda::Gemm (cuBLASLt on a GPU). Device memory comes from the allocator given
// to the constructor (kernels/cuda/device_allocator.h: a CachingAllocator for
// training, a plain DeviceAllocator in tests). All work is issued on the
// legacy default stream, which also orders it with cudaMemcpy.
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
#include "kernels/cuda/gemm.h"

namespace ft {

namespace cuda {
// Deterministic reductions without float atomics (parameter gradients of
// norms and biases, sum_squares): at most this many blocks each reduce a fixed
// strided subset of rows into their own row of f32 partials, which a second
// kernel adds up in block order. Public so the memory planner charges the
// same scratch.
constexpr int64_t kMaxPartialRows = 256;

// sum_squares's blocks of 256 threads over n elements: a fixed function of n,
// so the same partition, and the same sum, on every GPU and run.
inline int64_t sum_squares_blocks(int64_t n) {
  int64_t blocks = (n + 255) / 256;
  return blocks < kMaxPartialRows ? blocks : kMaxPartialRows;
}

// The device tables of adamw_update_many and sum_squares_many (adamw.cu), one
// entry per non-empty tensor, built per call in scratch; block b of the launch
// works on the last entry whose first_block <= b. Here so that the memory
// planner charges their exact size.
struct AdamWEntry {
  float* param;
  const float* grad;
  float* m;
  float* v;
  int64_t numel, first_block;
  float decay;  // 1 - lr * weight_decay, the tensor's own
};
struct SumSquaresEntry {
  const void* data;
  int64_t numel, first_block, blocks;
  DType dtype;
};
}  // namespace cuda

class CudaBackend final : public Backend {
 public:
  // allocator must hand out device memory (Device::cuda) and outlive the backend.
  explicit CudaBackend(Allocator& allocator, cuda::GemmKind gemm = cuda::default_gemm_kind());
  const char* name() const override { return "cuda"; }
  Allocator& allocator() override { return allocator_; }

  void copy(Tensor& dst, const Tensor& src) override;
  void fill(Tensor& dst, float value) override;
  void matmul(Tensor& out, const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b, float alpha,
              float beta) override;
  void add(Tensor& out, const Tensor& a, const Tensor& b) override;
  void embedding_forward(Tensor& out, const Tensor& ids, const Tensor& table) override;
  void embedding_backward(Tensor& dtable, const Tensor& ids, const Tensor& dout) override;
  void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& x, const Tensor& weight, float eps) override;
  void rmsnorm_backward(Tensor& dx, Tensor* dweight, const Tensor& dout, const Tensor& x, const Tensor& weight,
                        const Tensor& rstd) override;
  void rope_forward(Tensor& x, const Tensor& positions, int rotary_dim, float theta) override;
  void rope_backward(Tensor& dx, const Tensor& positions, int rotary_dim, float theta) override;
  void swiglu_forward(Tensor& out, const Tensor& gate, const Tensor& up) override;
  void swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                       const Tensor& up) override;
  void attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                         float scale) override;
  void attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                          const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                          float scale) override;
  void cross_entropy(Tensor& losses, Tensor* dlogits, const Tensor& logits, const Tensor& targets,
                     float dloss) override;
  void quantize_rows_int8(Tensor& q, Tensor& scales, const Tensor& x) override;
  void int8_linear_forward(Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& weight_scales,
                           float threshold, const Int8Epilogue& epilogue = {}) override;
  void int8_linear_backward(Tensor& dx, const Tensor& dout, const Tensor& weight, const Tensor& weight_scales,
                            bool accumulate) override;
  void dropout_forward(Tensor& out, const Tensor& x, float p, uint64_t seed) override;
  void dropout_backward(Tensor& dx, const Tensor& dout, float p, uint64_t seed) override;
  void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& step) override;
  double sum_squares(const Tensor& x) override;
  void adamw_update_many(std::span<const AdamWTensors> tensors, const AdamWStep& step) override;
  double sum_squares_many(std::span<const Tensor* const> tensors) override;
  void copy_columns(Tensor& dst, int64_t dst_offset, const Tensor& src, int64_t src_offset,
                    int64_t width) override;
  void add_bias(Tensor& out, const Tensor& bias) override;
  void bias_backward(Tensor& dbias, const Tensor& dout) override;
  void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& weight,
                         const Tensor& bias, float eps) override;
  void layernorm_backward(Tensor& dx, Tensor* dweight, Tensor* dbias, const Tensor& dout, const Tensor& x,
                          const Tensor& weight, const Tensor& mean, const Tensor& rstd) override;
  void add_rmsnorm_forward(Tensor& sum, Tensor& out, Tensor& rstd, const Tensor& a, const Tensor& b,
                           const Tensor& weight, float eps) override;
  void add_layernorm_forward(Tensor& sum, Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& a, const Tensor& b,
                             const Tensor& weight, const Tensor& bias, float eps) override;
  void rmsnorm_backward_add(Tensor& dx, Tensor* dweight, const Tensor& dout, const Tensor& dresidual,
                            const Tensor& x, const Tensor& weight, const Tensor& rstd) override;
  void layernorm_backward_add(Tensor& dx, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                              const Tensor& dresidual, const Tensor& x, const Tensor& weight, const Tensor& mean,
                              const Tensor& rstd) override;
  void gelu_forward(Tensor& out, const Tensor& x, GeluKind kind) override;
  void gelu_backward(Tensor& dx, const Tensor& dout, const Tensor& x, GeluKind kind) override;

 private:
  // Temporary device memory for one op (freed when the op returns; with the
  // caching allocator that costs no cudaMalloc after the first step).
  Tensor scratch(const Shape& shape, DType dtype) { return empty(shape, dtype, MemCategory::workspace); }
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

  Allocator& allocator_;
  std::unique_ptr<cuda::Gemm> gemm_;
  CUstream_st* stream_ = nullptr;  // cudaStream_t: the legacy default stream
};

}  // namespace ft
