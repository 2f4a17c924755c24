// Bias of a linear layer: added to every row of its output; its gradient is
// the column sum of the output gradient, reduced in a fixed order (per-group
// partials, then their sum) so it is deterministic without float atomics.
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"

namespace ft {
namespace {

constexpr int kBlock = 256;

__global__ void __launch_bounds__(kBlock)
    add_bias_kernel(cuda::View out, cuda::ConstView bias, int64_t channels, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(kBlock) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kBlock)
    cuda::store(out, i, cuda::load(out, i) + cuda::load(bias, i % channels));
}

// Grid (column tiles, row groups): group g sums rows g, g + gridDim.y, ... of
// its column into partials[g, c]; coalesced across the threads of a block.
__global__ void __launch_bounds__(kBlock)
    bias_partials_kernel(float* partials, cuda::ConstView dout, int64_t rows, int64_t channels) {
  int64_t c = blockIdx.x * int64_t(kBlock) + threadIdx.x;
  if (c >= channels) return;
  float sum = 0.0f;
  for (int64_t n = blockIdx.y; n < rows; n += gridDim.y) sum += cuda::load(dout, n * channels + c);
  partials[blockIdx.y * channels + c] = sum;
}

}  // namespace

void CudaBackend::add_bias_impl(Tensor& out, const Tensor& bias) {
  int64_t n = out.numel();
  if (n == 0) return;
  launch<add_bias_kernel>(cuda::elementwise_blocks(n, kBlock), kBlock, 0, stream_, cuda::view(out),
                          cuda::const_view(bias), out.cols(), n);
  FT_CUDA_CHECK_LAUNCH();
}

void CudaBackend::bias_backward_impl(Tensor& dbias, const Tensor& dout) {
  int64_t rows = dout.rows(), channels = dout.cols();
  if (rows == 0 || channels == 0) return;
  const int64_t groups = cuda::partial_rows(rows);
  unsigned tiles = unsigned((channels + kBlock - 1) / kBlock);
  Tensor partials = scratch(cuda::column_partials_scratch(rows, channels));
  launch<bias_partials_kernel>(dim3(tiles, unsigned(groups)), kBlock, 0, stream_, partials.ptr<float>(),
                               cuda::const_view(dout), rows, channels);
  FT_CUDA_CHECK_LAUNCH();
  launch<cuda::add_column_sums_kernel<kBlock>>(tiles, kBlock, 0, stream_, cuda::view(dbias),
                                               partials.ptr<const float>(), groups, channels);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
