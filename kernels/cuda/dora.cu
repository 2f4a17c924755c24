// DoRA (PEFT's use_dora): y = x W^T + bias + (g - 1) xd W^T + g s h B^T
// (xd the dropped input) with g = magnitude / ||W + s B A|| per output row,
// the norm a constant in backward (DoRA paper section 4.3; PEFT detaches it). The magnitude gradient
// is a column reduction in bias_backward's fixed order (per-group partials,
// then their sum in group order), deterministic without float atomics; the
// CPU backend reduces in the same order, with the same fmas, so the two agree
// bit for bit. Row sums of squares use a block reduction (another order than
// the CPU's sequential sum).
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/scratch.h"

namespace ft {
namespace {

constexpr int kBlock = 256;

// Block b sums rows b, b + gridDim.x, ...: each thread a strided share of a
// row's columns, then a fixed-order block reduction.
__global__ void __launch_bounds__(kBlock)
    row_sum_squares_kernel(float* sums, cuda::ConstView x, int64_t rows, int64_t columns, bool accumulate) {
  __shared__ float scratch[32];
  for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < columns; j += kBlock) {
      const float value = cuda::load(x, i * columns + j);
      sum = fmaf(value, value, sum);
    }
    sum = cuda::block_sum<kBlock>(sum, scratch);
    if (threadIdx.x == 0) sums[i] = accumulate ? sums[i] + sum : sum;
  }
}

__device__ inline float bias_at(cuda::ConstView bias, int64_t j) { return bias.data ? cuda::load(bias, j) : 0.0f; }

__global__ void __launch_bounds__(kBlock)
    dora_scale_forward_kernel(cuda::View out, cuda::ConstView z, cuda::ConstView magnitude,
                              const float* weight_sum_squares, cuda::ConstView bias, int64_t columns, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(kBlock) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kBlock) {
    const int64_t j = i % columns;
    const float scale = cuda::load(magnitude, j) / sqrtf(weight_sum_squares[j]);
    const float dropped = cuda::load(z, i), value = cuda::load(out, i);  // z may be out
    cuda::store(out, i, fmaf(dropped - bias_at(bias, j), scale - 1.0f, value));
  }
}

// Grid (column tiles, row groups): each thread writes dz (and dbase, when
// set) for rows k, k + gridDim.y, ... of its column (dout read before dz
// written, so they may alias) and, when partials is set, sums dout * (z - b)
// over those rows into partials[k, c].
__global__ void __launch_bounds__(kBlock)
    dora_scale_backward_kernel(cuda::View dz, cuda::View dbase, float* partials, cuda::ConstView dout,
                               cuda::ConstView z, cuda::ConstView magnitude, const float* weight_sum_squares,
                               cuda::ConstView bias, int64_t rows, int64_t columns) {
  const int64_t c = blockIdx.x * int64_t(kBlock) + threadIdx.x;
  if (c >= columns) return;
  const float scale = cuda::load(magnitude, c) / sqrtf(weight_sum_squares[c]);
  const float b = bias_at(bias, c);
  float sum = 0.0f;
  for (int64_t n = blockIdx.y; n < rows; n += gridDim.y) {
    const int64_t i = n * columns + c;
    const float grad = cuda::load(dout, i);
    if (partials) sum = fmaf(grad, cuda::load(z, i) - b, sum);
    if (dbase.data) cuda::store(dbase, i, grad * (scale - 1.0f));
    cuda::store(dz, i, grad * scale);
  }
  if (partials) partials[blockIdx.y * columns + c] = sum;
}

// dmagnitude[c] += (the partials of column c in group order) / its row norm.
__global__ void __launch_bounds__(kBlock)
    dora_magnitude_grad_kernel(float* dmagnitude, const float* partials, const float* weight_sum_squares,
                               int64_t groups, int64_t columns) {
  const int64_t c = blockIdx.x * int64_t(kBlock) + threadIdx.x;
  if (c >= columns) return;
  float total = 0.0f;
  for (int64_t k = 0; k < groups; ++k) total += partials[k * columns + c];
  dmagnitude[c] += total / sqrtf(weight_sum_squares[c]);
}

// An optional operand: a null view when absent.
cuda::ConstView optional_view(const Tensor* t) {
  return t ? cuda::const_view(*t) : cuda::ConstView{nullptr, DType::f32};
}

}  // namespace

void CudaBackend::row_sum_squares_impl(Tensor& sums, const Tensor& x, bool accumulate) {
  const int64_t rows = x.rows();
  if (rows == 0) return;
  launch<row_sum_squares_kernel>(cuda::elementwise_blocks(rows, 1), kBlock, 0, stream_, sums.ptr<float>(),
                                 cuda::const_view(x), rows, x.cols(), accumulate);
  FT_CUDA_CHECK_LAUNCH();
}

void CudaBackend::dora_scale_forward_impl(Tensor& out, const Tensor& z, const Tensor& magnitude,
                                          const Tensor& weight_sum_squares, const Tensor* bias) {
  const int64_t n = out.numel();
  if (n == 0) return;
  launch<dora_scale_forward_kernel>(cuda::elementwise_blocks(n, kBlock), kBlock, 0, stream_, cuda::view(out),
                                    cuda::const_view(z), cuda::const_view(magnitude),
                                    weight_sum_squares.ptr<const float>(), optional_view(bias), out.cols(), n);
  FT_CUDA_CHECK_LAUNCH();
}

void CudaBackend::dora_scale_backward_impl(Tensor& dz, Tensor* dbase, Tensor* dmagnitude, const Tensor& dout,
                                           const Tensor& z, const Tensor& magnitude,
                                           const Tensor& weight_sum_squares, const Tensor* bias) {
  const int64_t rows = dout.rows(), columns = dout.cols();
  if (rows == 0 || columns == 0) return;
  const int64_t groups = cuda::partial_rows(rows);
  const unsigned tiles = unsigned((columns + kBlock - 1) / kBlock);
  Tensor partials = dmagnitude ? scratch(cuda::column_partials_scratch(rows, columns)) : Tensor{};
  launch<dora_scale_backward_kernel>(dim3(tiles, unsigned(groups)), kBlock, 0, stream_, cuda::view(dz),
                                     dbase ? cuda::view(*dbase) : cuda::View{nullptr, dz.dtype},
                                     dmagnitude ? partials.ptr<float>() : nullptr, cuda::const_view(dout),
                                     cuda::const_view(z), cuda::const_view(magnitude),
                                     weight_sum_squares.ptr<const float>(), optional_view(bias), rows, columns);
  FT_CUDA_CHECK_LAUNCH();
  if (!dmagnitude) return;
  launch<dora_magnitude_grad_kernel>(tiles, kBlock, 0, stream_, dmagnitude->ptr<float>(),
                                     partials.ptr<const float>(), weight_sum_squares.ptr<const float>(), groups,
                                     columns);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
