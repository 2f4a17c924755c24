// A vendor-library attention engine the CUDA backend tries before its own
// kernels (attention.cu), as cuda::Gemm puts cuBLASLt before the tiled GEMM:
// on a real GPU, in a build with the cudnn-frontend headers, cuDNN's fused
// SDPA (flash attention forward and backward, cudnn_sdpa.cu); under the
// emulator and in builds without the headers there is none, and our kernels
// run. The backend offers it plain causal attention over whole rows only: a
// sliding window, or packed sequences (Backend::attention_forward's
// cu_seqlens, which this interface does not pass), run on our kernels, as
// the memory planner's model of the backend (MetaBackend) assumes too.
// Plain C++, like gemm.h.
#pragma once
#include <memory>

#include "kernels/allocator.h"
#include "kernels/tensor.h"

struct CUstream_st;

namespace ft::cuda {

class AttentionEngine {
 public:
  virtual ~AttentionEngine() = default;
  // Backend::attention_forward / attention_backward (operands already
  // checked). Each returns false without writing anything where the library
  // has no engine for these operands (dtype, head size, GPU, workspace over
  // sdpa_workspace_budget_bytes); the backend then runs its own kernel.
  virtual bool forward(Tensor& out, Tensor& lse, const HeadsView& q, const HeadsView& k, const HeadsView& v,
                       float scale, CUstream_st* stream) = 0;
  virtual bool backward(const HeadsView& dq, const HeadsView& dk, const HeadsView& dv, const Tensor& dout,
                        const HeadsView& q, const HeadsView& k, const HeadsView& v, const Tensor& out,
                        const Tensor& lse, float scale, CUstream_st* stream) = 0;
};

// cuDNN SDPA where this build has it (nvcc with the cudnn-frontend headers)
// and the environment does not say FT_ATTENTION_ENGINE=ours, else null.
// allocator provides the engine's per-call workspace.
std::unique_ptr<AttentionEngine> make_library_attention(Allocator& allocator);
// False where FT_ATTENTION_ENGINE=ours; throws on a value other than auto or ours.
bool library_attention_wanted();
// Whether make_library_attention returns an engine in this build.
bool library_attention_built();

}  // namespace ft::cuda
