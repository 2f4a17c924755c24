// The portable GEMM engine: a classic shared-memory tiled kernel. Each 256-thread
// block computes a 64 x 64 tile of C, stepping through k in slices of 16: the
// block stages the op(A) and op(B) slices in shared memory (converted to f32,
// zero padded at the edges), then every thread accumulates a 4 x 4 grid of
// outputs with fmaf in k order. No tensor cores: it exists to run under the
// emulator and to cross-check cuBLASLt, not to be fast.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/gemm.h"

namespace ft::cuda {
namespace {

constexpr int kTile = 64;   // C tile edge
constexpr int kDepth = 16;  // k slice staged per step
constexpr int kThreads = 256;
constexpr int kSide = 16;   // threads per tile edge; each owns kTile / kSide = 4 rows and 4 columns
constexpr int kPer = kTile / kSide;

__device__ inline float to_f32(float x) { return x; }
__device__ inline float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

// Element (row, col) of op(X) for a column-major X with leading dimension ld.
template <class T>
__device__ inline float op_element(const T* x, bool transposed, int64_t ld, int64_t row, int64_t col) {
  return to_f32(transposed ? x[col + row * ld] : x[row + col * ld]);
}

template <class T>
__global__ void __launch_bounds__(kThreads) gemm_tiled_kernel(GemmArgs args) {
  // +1 column of padding: threads of a row step through different banks.
  __shared__ float a_tile[kDepth][kTile + 1];  // a_tile[p][r] = op(A)(i0 + r, p0 + p)
  __shared__ float b_tile[kDepth][kTile + 1];  // b_tile[p][c] = op(B)(p0 + p, j0 + c)
  const int64_t m = args.m, n = args.n, k = args.k;
  const int64_t i0 = int64_t(blockIdx.x) * kTile, j0 = int64_t(blockIdx.y) * kTile;
  const T* a = static_cast<const T*>(args.a.data) + int64_t(blockIdx.z) * args.a.stride;
  const T* b = static_cast<const T*>(args.b.data) + int64_t(blockIdx.z) * args.b.stride;
  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;

  float acc[kPer][kPer] = {};
  for (int64_t p0 = 0; p0 < k; p0 += kDepth) {
    for (int e = threadIdx.x; e < kTile * kDepth; e += kThreads) {
      int r = e % kTile, p = e / kTile;
      int64_t q = p0 + p, i = i0 + r, j = j0 + r;
      a_tile[p][r] = i < m && q < k ? op_element(a, args.a.transposed, args.a.ld, i, q) : 0.0f;
      b_tile[p][r] = j < n && q < k ? op_element(b, args.b.transposed, args.b.ld, q, j) : 0.0f;
    }
    __syncthreads();
    for (int p = 0; p < kDepth; ++p) {
      float a_reg[kPer], b_reg[kPer];
      for (int u = 0; u < kPer; ++u) {
        a_reg[u] = a_tile[p][tx + kSide * u];
        b_reg[u] = b_tile[p][ty + kSide * u];
      }
      for (int u = 0; u < kPer; ++u)
        for (int v = 0; v < kPer; ++v) acc[u][v] = fmaf(a_reg[u], b_reg[v], acc[u][v]);
    }
    __syncthreads();
  }

  View c{args.c.data, args.c.dtype};
  const int64_t c0 = int64_t(blockIdx.z) * args.c.stride;
  for (int u = 0; u < kPer; ++u)
    for (int v = 0; v < kPer; ++v) {
      int64_t i = i0 + tx + kSide * u, j = j0 + ty + kSide * v;
      if (i >= m || j >= n) continue;
      int64_t at = c0 + i + j * args.c.ld;
      float value = args.alpha * acc[u][v];
      if (args.beta != 0.0f) value += args.beta * load(c, at);
      store(c, at, value);
    }
}

class TiledGemm final : public Gemm {
 public:
  void gemm(const GemmArgs& args, CUstream_st* stream) override {
    FT_CHECK(args.a.dtype == args.b.dtype && (args.a.dtype == DType::f32 || args.a.dtype == DType::bf16) &&
                 (args.c.dtype == DType::f32 || args.c.dtype == DType::bf16),
             "gemm: inputs must both be f32 or both bf16 and the output f32 or bf16, got ", dtype_name(args.a.dtype),
             ", ", dtype_name(args.b.dtype), " -> ", dtype_name(args.c.dtype));
    if (args.m == 0 || args.n == 0 || args.batch == 0) return;
    int64_t tiles_m = (args.m + kTile - 1) / kTile, tiles_n = (args.n + kTile - 1) / kTile;
    FT_CHECK(tiles_m < (int64_t(1) << 31) && tiles_n <= 65535 && args.batch <= 65535, "gemm: ", args.m, " x ",
             args.n, " x ", args.batch, " batches exceeds the tiled kernel's grid");
    dim3 grid(unsigned(tiles_m), unsigned(tiles_n), unsigned(args.batch));
    if (args.a.dtype == DType::f32)
      launch<gemm_tiled_kernel<float>>(grid, kThreads, 0, stream, args);
    else
      launch<gemm_tiled_kernel<__nv_bfloat16>>(grid, kThreads, 0, stream, args);
    FT_CUDA_CHECK_LAUNCH();
  }
};

}  // namespace

std::unique_ptr<Gemm> make_tiled_gemm() { return std::make_unique<TiledGemm>(); }

}  // namespace ft::cuda
