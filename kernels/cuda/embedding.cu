// Token embedding lookup and its gradient.
//
// Ids are not validated on the host (that would need a device-to-host copy and
// a sync per call); a kernel that meets an id outside the table writes NaN
// (forward) or skips the token (backward) instead of touching memory outside
// the table, so a bad id shows up as a NaN loss rather than a crash.
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"

namespace ft {
namespace {

constexpr int kBlock = 256;

// One block per token (grid.x), threads across channels.
__global__ void __launch_bounds__(kBlock) embedding_forward_kernel(cuda::View out, const int32_t* ids,
                                                                   cuda::ConstView table, int64_t vocab,
                                                                   int64_t channels) {
  int64_t n = blockIdx.x;
  int32_t id = ids[n];
  bool valid = id >= 0 && id < vocab;
  for (int64_t c = threadIdx.x; c < channels; c += kBlock)
    cuda::store(out, n * channels + c, valid ? cuda::load(table, int64_t(id) * channels + c) : NAN);
}

// Deterministic without atomics: each thread owns one channel and walks the
// tokens in order, as the CPU backend does, so tokens sharing an id add up in
// the same order on every run (and dtable is rounded after every add, like the
// CPU's load/add/store). Parallelism is the channel count only; fine for an
// op that runs once per step and only when the embedding is trained.
__global__ void __launch_bounds__(kBlock) embedding_backward_kernel(cuda::View dtable, const int32_t* ids,
                                                                    cuda::ConstView dout, int64_t tokens,
                                                                    int64_t vocab, int64_t channels) {
  int64_t c = blockIdx.x * int64_t(kBlock) + threadIdx.x;
  if (c >= channels) return;
  for (int64_t n = 0; n < tokens; ++n) {
    int32_t id = ids[n];
    if (id < 0 || id >= vocab) continue;
    int64_t at = int64_t(id) * channels + c;
    cuda::store(dtable, at, cuda::load(dtable, at) + cuda::load(dout, n * channels + c));
  }
}

}  // namespace

void CudaBackend::embedding_forward_impl(Tensor& out, const Tensor& ids, const Tensor& table) {
  const char* op = "embedding_forward";
  int64_t tokens = ids.numel(), channels = table.dim(1);
  FT_CHECK(tokens < (int64_t(1) << 31), op, ": too many tokens (", tokens, ")");
  if (tokens == 0 || channels == 0) return;
  launch<embedding_forward_kernel>(unsigned(tokens), kBlock, 0, stream_, cuda::view(out), ids.ptr<const int32_t>(),
                                   cuda::const_view(table), table.dim(0), channels);
  FT_CUDA_CHECK_LAUNCH();
}

void CudaBackend::embedding_backward_impl(Tensor& dtable, const Tensor& ids, const Tensor& dout) {
  int64_t tokens = ids.numel(), channels = dtable.dim(1);
  if (tokens == 0 || channels == 0) return;
  unsigned blocks = unsigned((channels + kBlock - 1) / kBlock);
  launch<embedding_backward_kernel>(blocks, kBlock, 0, stream_, cuda::view(dtable), ids.ptr<const int32_t>(),
                                    cuda::const_view(dout), tokens, dtable.dim(0), channels);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
