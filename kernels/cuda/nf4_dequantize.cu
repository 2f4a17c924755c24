// NF4 dequantisation of a weight tile on the GPU, as the CPU's
// (kernels/cpu/nf4.cpp): one thread per tile element, the block absmax
// recovered with explicitly rounded f32 ops (__fmul_rn, __fadd_rn: nvcc would
// otherwise fuse them into an fma that bitsandbytes does not do), the value
// code * absmax rounded once to the tile's dtype (bf16 for the tensor-core
// GEMM that follows in Backend::nf4_linear_forward / backward).
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/nf4.h"

namespace ft {
namespace {

constexpr int kBlock = 256;

struct Nf4Views {
  const uint8_t* codes;
  const float* absmax;         // plain absmax, or null
  const uint8_t* absmax_codes; // double quantised, or null
  const float* nested_absmax;
  const float* nested_map;
  float offset;
  int64_t K;
};

__device__ inline float nf4_code(int index) {
  // kNf4Codes, spelled out for the device (a host constexpr array is not
  // readable there without --expt-relaxed-constexpr).
  constexpr float codes[16] = {-1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
                               -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
                               0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f,
                               0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f,
                               0.7229568362236023f, 1.0f};
  return codes[index];
}

__global__ void __launch_bounds__(kBlock) nf4_dequantize_kernel(cuda::View tile, Nf4Views w, int64_t row0,
                                                                int64_t col0, int64_t R, int64_t C) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < R * C; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = (row0 + i / C) * w.K + col0 + i % C;
    const int64_t b = e / kNf4BlockSize;
    const float absmax =
        w.absmax ? w.absmax[b]
                 : __fadd_rn(__fmul_rn(w.nested_map[w.absmax_codes[b]], w.nested_absmax[b / kNf4NestedBlockSize]),
                             w.offset);
    const uint8_t byte = w.codes[e / 2];
    cuda::store(tile, i, __fmul_rn(nf4_code(e % 2 == 0 ? byte >> 4 : byte & 0x0f), absmax));
  }
}

}  // namespace

void CudaBackend::nf4_dequantize_impl(Tensor& tile, const Nf4Weight& w, int64_t row0, int64_t col0) {
  const int64_t R = tile.rows(), C = tile.cols();
  if (R == 0 || C == 0) return;
  Nf4Views views{w.codes->ptr<const uint8_t>(), nullptr, nullptr, nullptr, nullptr, w.nested_offset, w.in_features};
  if (w.double_quant()) {
    views.absmax_codes = w.absmax->ptr<const uint8_t>();
    views.nested_absmax = w.nested_absmax->ptr<const float>();
    views.nested_map = w.nested_map->ptr<const float>();
  } else {
    views.absmax = w.absmax->ptr<const float>();
  }
  launch<nf4_dequantize_kernel>(cuda::elementwise_blocks(R * C, kBlock), kBlock, 0, stream_, cuda::view(tile), views,
                                row0, col0, R, C);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
