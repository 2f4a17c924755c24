// Rotary position embedding, in place, in HF's rotate_half layout. inv_freq
// comes from the caller (host f32) and is passed by value, so both backends
// rotate by the same f32 angles float(pos) * inv_freq[i]; only cosf/sinf may
// differ in the last ulp.
#include <cmath>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"

namespace ft {
namespace {

constexpr int kBlock = 256;
constexpr int kMaxHalf = 256;  // rotary_dim up to 512; a 1 KiB kernel parameter

struct InvFreq {
  float value[kMaxHalf];
};

// One thread per rotated pair (token n, head h, i < half); sign is +1 to
// rotate by +angle (forward) and -1 for the transpose (backward). x points
// at the view's first column; head rows are pitch elements apart.
__global__ void __launch_bounds__(kBlock) rope_kernel(cuda::View x, const int32_t* positions, InvFreq inv_freq,
                                                      float sign, int64_t heads, int64_t pitch, int half,
                                                      int64_t pairs) {
  for (int64_t t = blockIdx.x * int64_t(kBlock) + threadIdx.x; t < pairs; t += int64_t(gridDim.x) * kBlock) {
    int i = int(t % half);
    int64_t head = t / half, n = head / heads;
    float angle = float(positions[n]) * inv_freq.value[i];
    float cos_a = cosf(angle), sin_a = sign * sinf(angle);
    int64_t at = head * pitch + i;
    float x1 = cuda::load(x, at), x2 = cuda::load(x, at + half);
    cuda::store(x, at, x1 * cos_a - x2 * sin_a);
    cuda::store(x, at + half, x2 * cos_a + x1 * sin_a);
  }
}

void rope_rotate(const char* op, const HeadsView& x, const Tensor& positions, std::span<const float> host_inv_freq,
                 float sign, cudaStream_t stream) {
  int64_t heads = x.dim(-2), tokens = x.rows.rows() / heads;
  int half = int(host_inv_freq.size());
  FT_CHECK(half <= kMaxHalf, op, ": rotary_dim ", 2 * half, " exceeds the supported ", 2 * kMaxHalf);
  InvFreq inv_freq{};
  for (int i = 0; i < half; ++i) inv_freq.value[i] = host_inv_freq[size_t(i)];
  int64_t pairs = tokens * heads * half;
  if (pairs == 0) return;
  launch<rope_kernel>(cuda::elementwise_blocks(pairs, kBlock), kBlock, 0, stream, cuda::view(x),
                      positions.ptr<const int32_t>(), inv_freq, sign, heads, x.pitch(), half, pairs);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void CudaBackend::rope_forward_impl(const HeadsView& x, const Tensor& positions, std::span<const float> inv_freq) {
  rope_rotate("rope_forward", x, positions, inv_freq, 1.0f, stream_);
}

void CudaBackend::rope_backward_impl(const HeadsView& dx, const Tensor& positions, std::span<const float> inv_freq) {
  rope_rotate("rope_backward", dx, positions, inv_freq, -1.0f, stream_);
}

}  // namespace ft
