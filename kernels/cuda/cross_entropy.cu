// Softmax cross-entropy with ignore_index -100, fused with its gradient as in
// llm.c: one block per row computes max, log-sum-exp and the loss, then
// overwrites the row with (softmax - onehot) * dloss (times the row's scale
// when row_scales are given). Every element is read
// and written by the same thread after the last reduction barrier, so dlogits
// may alias logits.
//
// A target outside [0, V) other than -100 (the CPU backend throws; checking it
// here would need a device-to-host copy per call) gives a NaN loss and a NaN
// gradient row.
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"

namespace ft {
namespace {

constexpr int kBlock = 256;
constexpr int32_t kIgnoreIndex = -100;

__global__ void __launch_bounds__(kBlock)
    cross_entropy_kernel(float* losses, cuda::View dlogits, bool write_grad, cuda::ConstView logits,
                         const int32_t* targets, float dloss, const float* row_scales, int64_t vocab) {
  __shared__ float scratch[32];
  __shared__ double sum_scratch[32];
  int64_t n = blockIdx.x, row = n * vocab;
  int32_t target = targets[n];
  if (target == kIgnoreIndex) {
    if (threadIdx.x == 0) losses[n] = 0.0f;
    if (write_grad)
      for (int64_t i = threadIdx.x; i < vocab; i += kBlock) cuda::store(dlogits, row + i, 0.0f);
    return;
  }
  bool valid = target >= 0 && target < vocab;
  float max_logit = -INFINITY;
  for (int64_t i = threadIdx.x; i < vocab; i += kBlock) max_logit = fmaxf(max_logit, cuda::load(logits, row + i));
  max_logit = cuda::block_max<kBlock>(max_logit, scratch);
  // The exponentials are summed in f64 (each thread's share, then the block's):
  // in f32 the small terms of a wide vocabulary lose their low bits against
  // the growing total and the loss comes out low. The loss is formed in f64 too.
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < vocab; i += kBlock) sum += expf(cuda::load(logits, row + i) - max_logit);
  sum = cuda::block_sum<kBlock>(sum, sum_scratch);
  // The target logit is read before the barrier below; only after it does
  // any thread overwrite the row.
  if (threadIdx.x == 0)
    losses[n] = valid ? float(double(max_logit) - double(cuda::load(logits, row + target)) + log(sum)) : NAN;
  __syncthreads();
  if (!write_grad) return;
  const double row_dloss = row_scales ? double(dloss) * double(row_scales[n]) : double(dloss);
  const float scale = float(row_dloss / sum);
  for (int64_t i = threadIdx.x; i < vocab; i += kBlock) {
    float e = expf(cuda::load(logits, row + i) - max_logit);
    // The target's (p - 1) * dloss from the sum of the other terms: p * dloss
    // - dloss in f32 would cancel when p is near 1.
    float grad = i == target ? float((double(e) - sum) / sum * row_dloss) : e * scale;
    cuda::store(dlogits, row + i, valid ? grad : NAN);
  }
}

}  // namespace

void CudaBackend::cross_entropy_impl(Tensor& losses, Tensor* dlogits, const Tensor& logits, const Tensor& targets,
                                     float dloss, const Tensor* row_scales) {
  const char* op = "cross_entropy";
  int64_t rows = logits.rows(), vocab = logits.cols();
  FT_CHECK(rows < (int64_t(1) << 31), op, ": too many rows (", rows, ")");
  if (rows == 0) return;
  cuda::View grad = dlogits ? cuda::view(*dlogits) : cuda::View{nullptr, DType::f32};
  launch<cross_entropy_kernel>(unsigned(rows), kBlock, 0, stream_, losses.ptr<float>(), grad, dlogits != nullptr,
                               cuda::const_view(logits), targets.ptr<const int32_t>(), dloss,
                               row_scales ? row_scales->ptr<const float>() : nullptr, vocab);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
