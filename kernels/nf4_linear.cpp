// Backend::nf4_linear_forward / nf4_linear_backward: composed of ops
// (nf4_dequantize, matmul, copy_columns) with their scratch from
// kernels/cuda/scratch.h, so the CPU, CUDA and meta backends run the same
// steps and the planner charges exactly what a real run allocates.
#include <algorithm>

#include "kernels/backend.h"
#include "kernels/cuda/scratch.h"

namespace ft {

namespace {
Tensor scratch(Backend& backend, const cuda::ScratchTensor& t) {
  return backend.empty(t.shape, t.dtype, MemCategory::workspace);
}
}  // namespace

void Backend::nf4_linear_forward(Tensor& out, const Tensor& x, const Nf4Weight& weight) {
  checks::check_nf4_linear_forward(device(), out, x, weight);
  const OpTimer timer(profile_, __func__);  // its matmuls and dequantisations count as this op
  const int64_t N = x.rows(), K = weight.in_features, O = weight.out_features;
  if (N == 0 || O == 0) return;
  const cuda::Nf4Scratch sizes = cuda::nf4_forward_scratch(N, K, O, x.dtype, out.dtype);
  Tensor tile_buffer = scratch(*this, sizes.tile), block_buffer = scratch(*this, sizes.block);
  const int64_t tile_rows = sizes.tile.shape[0];
  const Tensor x2 = x.reshaped({N, K});
  Tensor out2 = out.reshaped({N, O});
  for (int64_t o0 = 0; o0 < O; o0 += tile_rows) {
    const int64_t rows = std::min(tile_rows, O - o0);
    Tensor tile = Tensor::view_of(tile_buffer.data, {rows, K}, x.dtype, tile_buffer.device);
    nf4_dequantize(tile, weight, o0, 0);
    if (rows == O) {
      matmul(out2, x2, tile, false, true, 1.0f, 0.0f);
      return;
    }
    Tensor block = Tensor::view_of(block_buffer.data, {N, rows}, out.dtype, block_buffer.device);
    matmul(block, x2, tile, false, true, 1.0f, 0.0f);
    copy_columns(out2, o0, block, 0, rows);
  }
}

void Backend::nf4_linear_backward(Tensor& dx, const Tensor& dout, const Nf4Weight& weight, bool accumulate) {
  checks::check_nf4_linear_backward(device(), dx, dout, weight);
  const OpTimer timer(profile_, __func__);  // its matmuls and dequantisations count as this op
  const int64_t N = dout.rows(), K = weight.in_features, O = weight.out_features;
  if (N == 0 || K == 0) return;
  const cuda::Nf4Scratch sizes = cuda::nf4_backward_scratch(N, K, O, dout.dtype, dx.dtype);
  Tensor tile_buffer = scratch(*this, sizes.tile), block_buffer = scratch(*this, sizes.block);
  const int64_t tile_columns = sizes.tile.shape[1];
  const Tensor dout2 = dout.reshaped({N, O});
  Tensor dx2 = dx.reshaped({N, K});
  const float beta = accumulate ? 1.0f : 0.0f;
  for (int64_t k0 = 0; k0 < K; k0 += tile_columns) {
    const int64_t columns = std::min(tile_columns, K - k0);
    Tensor tile = Tensor::view_of(tile_buffer.data, {O, columns}, dout.dtype, tile_buffer.device);
    nf4_dequantize(tile, weight, 0, k0);
    if (columns == K) {
      matmul(dx2, dout2, tile, false, false, 1.0f, beta);
      return;
    }
    Tensor block = Tensor::view_of(block_buffer.data, {N, columns}, dx.dtype, block_buffer.device);
    if (accumulate) copy_columns(block, 0, dx2, k0, columns);
    matmul(block, dout2, tile, false, false, 1.0f, beta);
    copy_columns(dx2, k0, block, 0, columns);
  }
}

}  // namespace ft
