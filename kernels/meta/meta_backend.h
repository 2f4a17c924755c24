// The memory planner's backend: tensors without data (Device::meta). Every op
// checks its shape/dtype contract and computes nothing, so the model's real
// training-step code runs a 20B config in milliseconds while the allocator it
// is given counts every byte a real step would hold. The scratch the modelled
// backend allocates inside its ops is allocated here the same way:
//   cpu  - CpuBackend's int8_linear_backward tiles (kernels/int8_tiles.h).
//   cuda - the int8 linear's scratch (codes, scales, outlier columns, one
//          block of the int32 product; a dequantised tile in backward),
//          cuBLASLt's 32 MiB workspace from construction on, the f32 copy
//          of a bf16 operand that CudaBackend::matmul makes for mixed-dtype
//          products, the partial sums of norm/bias gradients and
//          sum_squares, the tensor tables of adamw_update_many and
//          sum_squares_many, attention backward's Di, and copy's staging
//          buffer when it converts between host and device.
// Copies compute nothing either; a host destination is zeroed so host code
// that reads it back (the loss) sees defined values.
#pragma once
#include <cstddef>
#include <unordered_map>

#include "kernels/backend.h"
#include "kernels/cuda/gemm.h"

namespace ft {

enum class MemoryPolicy { cpu, cuda };

// CachingAllocator (kernels/cuda/device_allocator.h) on the meta device:
// requests are rounded to its size classes and a freed block is reused by the
// next request of the same class, so in_use and reserved are what the CUDA
// path holds. Wrap it in a TrackingAllocator for per-category counts.
class CachingModelAllocator final : public Allocator {
 public:
  Device device() const override { return Device::meta; }
  void* allocate(size_t bytes, MemCategory category) override;
  void deallocate(void* ptr, size_t bytes, MemCategory category) override;

  size_t in_use_bytes() const { return in_use_; }      // handed out now, rounded
  size_t peak_in_use_bytes() const { return peak_; }
  size_t reserved_bytes() const { return reserved_; }  // handed out + cached: cudaMalloc'd

 private:
  std::unordered_map<size_t, size_t> free_blocks_;  // size class -> cached block count
  size_t in_use_ = 0, peak_ = 0, reserved_ = 0;
};

// The op the step last ran and the parameter it used (the first weight or
// adapter operand), so the planner can say where a peak happens.
struct MetaCursor {
  const char* op = "none";
  const Storage* parameter = nullptr;
  bool backward = false;  // sticky: set by the first *_backward op
};

class MetaBackend final : public Backend {
 public:
  // gemm_workspace_bytes: the cuda policy's GEMM workspace (cuBLASLt's; 0
  // models the tiled GEMM the emulator runs).
  MetaBackend(Allocator& allocator, MemoryPolicy policy,
              size_t gemm_workspace_bytes = cuda::kCublasLtWorkspaceBytes);
  const char* name() const override { return "meta"; }
  Allocator& allocator() override { return allocator_; }
  const MetaCursor& cursor() const { return cursor_; }
  void reset_cursor() { cursor_ = MetaCursor{}; }

  void copy(Tensor& dst, const Tensor& src) override;
  void fill(Tensor& dst, float value) override;
  void copy_columns(Tensor& dst, int64_t dst_offset, const Tensor& src, int64_t src_offset,
                    int64_t width) override;
  void matmul(Tensor& out, const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b, float alpha,
              float beta) override;
  void add(Tensor& out, const Tensor& a, const Tensor& b) override;
  void add_bias(Tensor& out, const Tensor& bias) override;
  void bias_backward(Tensor& dbias, const Tensor& dout) override;
  void embedding_forward(Tensor& out, const Tensor& ids, const Tensor& table) override;
  void embedding_backward(Tensor& dtable, const Tensor& ids, const Tensor& dout) override;
  void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& x, const Tensor& weight, float eps) override;
  void rmsnorm_backward(Tensor& dx, Tensor* dweight, const Tensor& dout, const Tensor& x, const Tensor& weight,
                        const Tensor& rstd) override;
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
  void rope_forward(Tensor& x, const Tensor& positions, int rotary_dim, float theta) override;
  void rope_backward(Tensor& dx, const Tensor& positions, int rotary_dim, float theta) override;
  void swiglu_forward(Tensor& out, const Tensor& gate, const Tensor& up) override;
  void swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                       const Tensor& up) override;
  void gelu_forward(Tensor& out, const Tensor& x, GeluKind kind) override;
  void gelu_backward(Tensor& dx, const Tensor& dout, const Tensor& x, GeluKind kind) override;
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

 private:
  void enter(const char* op, std::initializer_list<const Tensor*> operands);
  Tensor column_partials(int64_t rows, int64_t channels);

  Allocator& allocator_;
  MemoryPolicy policy_;
  Tensor cublaslt_workspace_;  // cuda policy only
  MetaCursor cursor_;
};

}  // namespace ft
