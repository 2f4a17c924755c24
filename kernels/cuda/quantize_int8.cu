// LLM.int8() row-wise absmax quantisation (bitsandbytes' vector-wise scheme),
// one block per row. The int8 linear ops (int8_linear.cu) quantise x with the
// same rounding in their own kernel, which also skips the outlier columns.
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"

namespace ft {
namespace {

constexpr int kBlock = 256;

// q = round-half-even(x * 127 / absmax), computed in double as the CPU backend
// does: x * 127 is exact there and the division correctly rounded, so the code
// is the rounding of the exact quotient (f32 could land on the other side of a
// .5 boundary). Double is slow on consumer GPUs, but this runs once per weight
// at load time.
__global__ void __launch_bounds__(kBlock)
    quantize_rows_int8_kernel(int8_t* q, float* scales, cuda::ConstView x, int64_t cols) {
  __shared__ float scratch[32];
  int64_t row = int64_t(blockIdx.x) * cols;
  float absmax = 0.0f;
  for (int64_t k = threadIdx.x; k < cols; k += kBlock) absmax = fmaxf(absmax, fabsf(cuda::load(x, row + k)));
  absmax = cuda::block_max<kBlock>(absmax, scratch);
  if (threadIdx.x == 0) scales[blockIdx.x] = absmax;
  double s = absmax;
  for (int64_t k = threadIdx.x; k < cols; k += kBlock)
    q[row + k] = absmax == 0.0f ? int8_t(0) : int8_t(rint(double(cuda::load(x, row + k)) * 127.0 / s));
}

}  // namespace

void CudaBackend::quantize_rows_int8_impl(Tensor& q, Tensor& scales, const Tensor& x) {
  const char* op = "quantize_rows_int8";
  int64_t rows = x.rows(), cols = x.cols();
  FT_CHECK(rows < (int64_t(1) << 31), op, ": too many rows (", rows, ")");
  if (rows == 0) return;
  launch<quantize_rows_int8_kernel>(unsigned(rows), kBlock, 0, stream_, q.ptr<int8_t>(), scales.ptr<float>(),
                                    cuda::const_view(x), cols);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
