// The memory planner's backend: tensors without data (Device::meta). Backend
// checks every op's contract exactly as for the CPU and CUDA backends
// (kernels/op_checks.h) and the ops compute nothing, so the model's real
// training-step code runs a 20B config in milliseconds, rejects what a real
// step would reject, and the allocator it is given counts every byte a real
// step would hold. The scratch the modelled backend allocates inside its ops
// is allocated here the same way:
//   cpu  - CpuBackend's int8_linear_backward tiles (kernels/int8_tiles.h).
//   cuda - what each CUDA op declares in kernels/cuda/scratch.h (the int8
//          linear's codes, scales, outlier columns and product block or
//          dequantised tile, the f32 copy of a mixed product's bf16 operand,
//          partial sums of norm/bias gradients and sum_squares, the tables of
//          adamw_update_many and sum_squares_many, attention backward's Di,
//          copy's staging buffer), and cuBLASLt's 32 MiB workspace from
//          construction on.
// Copies compute nothing either; a host destination is zeroed so host code
// that reads it back (the loss) sees defined values.
#pragma once
#include <cstddef>
#include <unordered_map>

#include "kernels/backend.h"
#include "kernels/cuda/scratch.h"

namespace ft {

enum class MemoryPolicy { cpu, cuda };

// CachingAllocator (kernels/caching_allocator.h) on the meta device,
// with its rounding (kernels/cuda/scratch.h):
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

// Host memory on the meta device: Device::cpu tensors without data, so the
// planner can count a step's pinned host memory (MetaBackend::
// pinned_host_allocator) apart from the device's.
class MetaHostAllocator final : public Allocator {
 public:
  Device device() const override { return Device::cpu; }
  void* allocate(size_t, MemCategory) override { return nullptr; }
  void deallocate(void*, size_t, MemCategory) override {}
};

class MetaBackend final : public Backend {
 public:
  // gemm_workspace_bytes: the cuda policy's GEMM workspace (cuBLASLt's; 0
  // models the tiled GEMM the emulator runs). library_attention: bf16
  // attention runs on cuDNN SDPA with its workspace budget (false models our
  // kernels alone, as under the emulator). library_int8_gemm: the INT8
  // forward runs fused on CUTLASS's int8 GEMM where it takes the operands
  // (an sm_90 GPU in a build with CUTLASS); false models the unfused forward.
  MetaBackend(Allocator& allocator, MemoryPolicy policy,
              size_t gemm_workspace_bytes = cuda::kCublasLtWorkspaceBytes, bool library_attention = true,
              bool library_int8_gemm = false);
  const char* name() const override { return "meta"; }
  Allocator& allocator() override { return allocator_; }
  // Counted pinned host memory (tensors without data).
  TrackingAllocator& pinned_host_allocator() override { return pinned_; }
  // Bytes copy_async has copied host to device since construction: the
  // modelled step's PCIe traffic.
  size_t copy_async_bytes() const { return copy_async_bytes_; }
  const MetaCursor& cursor() const { return cursor_; }
  void reset_cursor() { cursor_ = MetaCursor{}; }

 private:
  FT_BACKEND_OP_IMPLS(, override)

  void enter(const char* op, std::initializer_list<const Tensor*> operands);
  Tensor cuda_scratch(const cuda::ScratchTensor& t);
  Tensor column_partials(const Tensor* gradient, int64_t rows, int64_t channels);

  Allocator& allocator_;
  MemoryPolicy policy_;
  bool library_attention_;
  bool library_int8_gemm_;
  Tensor cublaslt_workspace_;  // cuda policy only
  MetaCursor cursor_;
  MetaHostAllocator pinned_backing_;
  TrackingAllocator pinned_{pinned_backing_};
  size_t copy_async_bytes_ = 0;
};

}  // namespace ft
