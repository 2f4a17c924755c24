// The CPU backend: the reference every other backend is checked against, and
// a real way to fine-tune small models. OpenMP across rows/heads; f32
// accumulation everywhere. One file per op family in this folder.
#pragma once
#include <memory>

#include "kernels/backend.h"

namespace ft {

class OnednnGemm;

// What runs CpuBackend's matmul and int8_linear_forward's int8 product:
// reference = our BLIS-style kernels (matmul.cpp, int8.cpp), always built;
// onednn = oneDNN's matmul primitives (onednn_gemm.h) where the build has
// oneDNN, falling back to the reference for what oneDNN does not cover.
enum class CpuGemm { reference, onednn };
// FT_CPU_GEMM=reference|onednn when set, else onednn when built with it.
CpuGemm default_cpu_gemm();

class CpuBackend final : public Backend {
 public:
  // CpuGemm::onednn in a build without oneDNN is an error.
  explicit CpuBackend(Allocator& allocator, CpuGemm gemm = default_cpu_gemm());
  ~CpuBackend() override;
  CpuGemm gemm() const;
  const char* name() const override { return "cpu"; }
  Allocator& allocator() override { return allocator_; }
  // Plain host memory, outside allocator()'s accounting: the CPU's device
  // memory is host memory already.
  Allocator& pinned_host_allocator() override { return pinned_; }

 private:
  FT_BACKEND_OP_IMPLS(, override)

  Allocator& allocator_;
  HostAllocator pinned_;
  std::unique_ptr<OnednnGemm> onednn_;  // null: the reference GEMMs
};

}  // namespace ft
