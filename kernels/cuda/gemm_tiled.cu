// The portable GEMM engine: a classic shared-memory tiled kernel. Each 256-thread
// block computes a 64 x 64 tile of C, stepping through k in slices of 16: the
// block stages the op(A) and op(B) slices in shared memory (converted to the
// accumulator type, zero padded at the edges), then every thread accumulates a
// 4 x 4 grid of outputs in k order: fmaf into f32 for floating inputs, exact
// int32 multiply-adds for i8 codes. No tensor cores: it exists to run under
// the emulator and to cross-check cuBLASLt, not to be fast.
#include <cmath>
#include <utility>

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

// An input element in the accumulator type: f32 for floating inputs, int32 for codes.
__device__ inline float widen(float x) { return x; }
__device__ inline float widen(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline int32_t widen(int8_t x) { return x; }

__device__ inline float mad(float a, float b, float acc) { return fmaf(a, b, acc); }
__device__ inline int32_t mad(int32_t a, int32_t b, int32_t acc) { return a * b + acc; }

// Element (row, col) of op(X) for a column-major X with leading dimension ld.
template <class T>
__device__ inline auto op_element(const T* x, bool transposed, int64_t ld, int64_t row, int64_t col) {
  return widen(transposed ? x[col + row * ld] : x[row + col * ld]);
}

// C[at] = alpha * acc + beta * C[at] in C's dtype (beta = 0 never reads C).
__device__ inline void store_output(const GemmArgs& args, int64_t at, float acc) {
  View c{args.c.data, args.c.dtype};
  float value = args.alpha * acc;
  if (args.beta != 0.0f) value += args.beta * load(c, at);
  store(c, at, value);
}
// The integer product stays in int32: through f32, sums past 2^24 would round.
__device__ inline void store_output(const GemmArgs& args, int64_t at, int32_t acc) {
  int32_t* c = static_cast<int32_t*>(args.c.data);
  int32_t value = int32_t(args.alpha) * acc;
  if (args.beta != 0.0f) value += int32_t(args.beta) * c[at];
  c[at] = value;
}

template <class T>
__global__ void __launch_bounds__(kThreads) gemm_tiled_kernel(GemmArgs args) {
  using Acc = decltype(widen(std::declval<T>()));
  // +1 column of padding: threads of a row step through different banks.
  __shared__ Acc a_tile[kDepth][kTile + 1];  // a_tile[p][r] = op(A)(i0 + r, p0 + p)
  __shared__ Acc b_tile[kDepth][kTile + 1];  // b_tile[p][c] = op(B)(p0 + p, j0 + c)
  const int64_t m = args.m, n = args.n, k = args.k;
  const int64_t i0 = int64_t(blockIdx.x) * kTile, j0 = int64_t(blockIdx.y) * kTile;
  const T* a = static_cast<const T*>(args.a.data) + int64_t(blockIdx.z) * args.a.stride;
  const T* b = static_cast<const T*>(args.b.data) + int64_t(blockIdx.z) * args.b.stride;
  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;

  Acc acc[kPer][kPer] = {};
  for (int64_t p0 = 0; p0 < k; p0 += kDepth) {
    for (int e = threadIdx.x; e < kTile * kDepth; e += kThreads) {
      int r = e % kTile, p = e / kTile;
      int64_t q = p0 + p, i = i0 + r, j = j0 + r;
      a_tile[p][r] = i < m && q < k ? op_element(a, args.a.transposed, args.a.ld, i, q) : Acc(0);
      b_tile[p][r] = j < n && q < k ? op_element(b, args.b.transposed, args.b.ld, q, j) : Acc(0);
    }
    __syncthreads();
    for (int p = 0; p < kDepth; ++p) {
      Acc a_reg[kPer], b_reg[kPer];
      for (int u = 0; u < kPer; ++u) {
        a_reg[u] = a_tile[p][tx + kSide * u];
        b_reg[u] = b_tile[p][ty + kSide * u];
      }
      for (int u = 0; u < kPer; ++u)
        for (int v = 0; v < kPer; ++v) acc[u][v] = mad(a_reg[u], b_reg[v], acc[u][v]);
    }
    __syncthreads();
  }

  const int64_t c0 = int64_t(blockIdx.z) * args.c.stride;
  for (int u = 0; u < kPer; ++u)
    for (int v = 0; v < kPer; ++v) {
      int64_t i = i0 + tx + kSide * u, j = j0 + ty + kSide * v;
      if (i < m && j < n) store_output(args, c0 + i + j * args.c.ld, acc[u][v]);
    }
}

bool is_integer(double x) { return std::isfinite(x) && x == std::trunc(x); }

}  // namespace

void check_gemm_args(const GemmArgs& args) {
  const DType a = args.a.dtype, b = args.b.dtype, c = args.c.dtype;
  if (a == DType::i8 || b == DType::i8) {
    FT_CHECK(a == b && c == DType::i32, "gemm: i8 inputs need i8 on both sides and an i32 output, got ",
             dtype_name(a), ", ", dtype_name(b), " -> ", dtype_name(c));
    FT_CHECK(is_integer(args.alpha) && is_integer(args.beta), "gemm: the integer product needs integer alpha and ",
             "beta, got ", args.alpha, " and ", args.beta);
    return;
  }
  FT_CHECK(a == b && (a == DType::f32 || a == DType::bf16) && (c == DType::f32 || c == DType::bf16),
           "gemm: inputs must both be f32 or both bf16 and the output f32 or bf16 (or i8 x i8 -> i32), got ",
           dtype_name(a), ", ", dtype_name(b), " -> ", dtype_name(c));
}

namespace {

class TiledGemm final : public Gemm {
 public:
  void gemm(const GemmArgs& args, CUstream_st* stream) override {
    check_gemm_args(args);
    if (args.m == 0 || args.n == 0 || args.batch == 0) return;
    int64_t tiles_m = (args.m + kTile - 1) / kTile, tiles_n = (args.n + kTile - 1) / kTile;
    FT_CHECK(tiles_m < (int64_t(1) << 31) && tiles_n <= 65535 && args.batch <= 65535, "gemm: ", args.m, " x ",
             args.n, " x ", args.batch, " batches exceeds the tiled kernel's grid");
    dim3 grid(unsigned(tiles_m), unsigned(tiles_n), unsigned(args.batch));
    if (args.a.dtype == DType::f32)
      launch<gemm_tiled_kernel<float>>(grid, kThreads, 0, stream, args);
    else if (args.a.dtype == DType::bf16)
      launch<gemm_tiled_kernel<__nv_bfloat16>>(grid, kThreads, 0, stream, args);
    else
      launch<gemm_tiled_kernel<int8_t>>(grid, kThreads, 0, stream, args);
    FT_CUDA_CHECK_LAUNCH();
  }
};

}  // namespace

std::unique_ptr<Gemm> make_tiled_gemm() { return std::make_unique<TiledGemm>(); }

}  // namespace ft::cuda
