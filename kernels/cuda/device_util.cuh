// Device-side helpers shared by the CUDA ops: typed views of floating tensors
// that load and store through f32, and deterministic block reductions.
//
// A tensor's dtype travels into the kernel as a value and is switched on per
// element rather than being a template parameter: ops accept mixed f32/bf16
// operands (e.g. an f32 residual plus a bf16 projection), and templates over
// every operand's dtype would multiply the instantiations nvcc compiles for
// each architecture. The switch is uniform across a warp, so it costs a few
// instructions, not divergence.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/launch.h"
#include "kernels/tensor.h"

namespace ft::cuda {

// A read-only floating (or integer, for copy) tensor as a kernel argument.
struct ConstView {
  const void* data;
  DType dtype;
};
// A writable one.
struct View {
  void* data;
  DType dtype;
};

inline ConstView const_view(const Tensor& t) { return {t.data, t.dtype}; }
inline View view(Tensor& t) { return {t.data, t.dtype}; }
// A head view's elements from its first column (head rows pitch() apart).
inline ConstView const_view(const HeadsView& x) { return {x.data(), x.dtype()}; }
inline View view(const HeadsView& x) { return {x.data(), x.dtype()}; }

__device__ inline float load(ConstView x, int64_t i) {
  switch (x.dtype) {
    case DType::f32: return static_cast<const float*>(x.data)[i];
    case DType::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(x.data)[i]);
    case DType::f16: return __half2float(static_cast<const __half*>(x.data)[i]);
    case DType::i8: return float(static_cast<const int8_t*>(x.data)[i]);
    case DType::i32: return float(static_cast<const int32_t*>(x.data)[i]);
    case DType::u8: return float(static_cast<const uint8_t*>(x.data)[i]);
  }
  return 0.0f;
}
__device__ inline float load(View x, int64_t i) { return load(ConstView{x.data, x.dtype}, i); }

// Rounds to nearest even for bf16/f16, as the CPU backend's store_from_f32;
// integers truncate as its int8_t(value) / int32_t(value) casts do.
__device__ inline void store(View x, int64_t i, float value) {
  switch (x.dtype) {
    case DType::f32: static_cast<float*>(x.data)[i] = value; break;
    case DType::bf16: static_cast<__nv_bfloat16*>(x.data)[i] = __float2bfloat16(value); break;
    case DType::f16: static_cast<__half*>(x.data)[i] = __float2half(value); break;
    case DType::i8: static_cast<int8_t*>(x.data)[i] = int8_t(value); break;
    case DType::i32: static_cast<int32_t*>(x.data)[i] = int32_t(value); break;
    case DType::u8: static_cast<uint8_t*>(x.data)[i] = uint8_t(value); break;
  }
}

// A value as stored in bf16 and read back (HF rounds the normalised
// activation to the input dtype before scaling by the weight).
__device__ inline float round_to_bf16(float x) { return __bfloat162float(__float2bfloat16(x)); }

// A value as a tensor of the floating dtype would store it and read it back.
__device__ inline float round_to(DType dtype, float x) {
  switch (dtype) {
    case DType::bf16: return round_to_bf16(x);
    case DType::f16: return __half2float(__float2half(x));
    default: return x;
  }
}

// The fused residual norms (add_rmsnorm_forward, add_layernorm_forward):
// element i of a norm's input in the first pass over a row. Unfused (no
// b.data) it is a[i]; fused it is a[i] + b[i], stored to sum and returned as
// rounded to sum's dtype, so the statistics see what add followed by the norm
// would. Later passes read sum back: the same thread stored those elements.
__device__ inline float load_norm_input(View sum, ConstView a, ConstView b, int64_t i) {
  if (!b.data) return load(a, i);
  float value = round_to(sum.dtype, load(a, i) + load(b, i));
  store(sum, i, value);
  return value;
}
// The input later passes read: a, or sum when fused.
__device__ inline ConstView norm_input(View sum, ConstView a, ConstView b) {
  return b.data ? ConstView{sum.data, sum.dtype} : a;
}

// The fused norms' backward (*norm_backward_add): dx[i] = grad rounded to
// dx's dtype + dresidual[i] when dresidual.data is set (the norm's backward
// into a dx-typed tensor followed by add), else grad. dresidual[i] is read
// before dx[i] is written, so dx may alias dresidual. __fadd_rn keeps nvcc
// from contracting the gradient's last multiply and this add into an FMA
// (for f32 dx the rounding is a no-op), which the separate add cannot do.
__device__ inline void store_norm_grad(View dx, ConstView dresidual, int64_t i, float grad) {
  if (dresidual.data) grad = __fadd_rn(round_to(dx.dtype, grad), load(dresidual, i));
  store(dx, i, grad);
}

// Butterfly reductions over the 32 lanes of a warp: every lane gets the
// result, and the summation order is fixed, so results are reproducible.
template <class T>
__device__ inline T warp_sum(T v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Block-wide sum (or max) of one value per thread, returned to every thread.
// scratch is a __shared__ T[32] declared by the kernel (the emulator poisons
// only shared memory declared in kernels themselves). Block is a multiple of
// 32. Ends with a barrier, so scratch may be reused straight away.
template <int Block, class T>
__device__ inline T block_sum(T v, T* scratch) {
  static_assert(Block % 32 == 0 && Block <= 1024);
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = warp_sum(lane < Block / 32 ? scratch[lane] : T(0));
  __syncthreads();
  return v;
}
template <int Block>
__device__ inline float block_max(float v, float* scratch) {
  static_assert(Block % 32 == 0 && Block <= 1024);
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_max(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = warp_max(lane < Block / 32 ? scratch[lane] : -INFINITY);
  __syncthreads();
  return v;
}

// grad[c] += sum over b < count of partials[b, c], in b order: the second
// half of a deterministic column reduction (kMaxPartialRows), one thread per
// column. A template, so each .cu file that launches it may define it.
template <int Block>
__global__ void __launch_bounds__(Block)
    add_column_sums_kernel(View grad, const float* partials, int64_t count, int64_t channels) {
  int64_t c = blockIdx.x * int64_t(Block) + threadIdx.x;
  if (c >= channels) return;
  float sum = 0.0f;
  for (int64_t b = 0; b < count; ++b) sum += partials[b * channels + c];
  store(grad, c, load(grad, c) + sum);
}

// Blocks for a grid-stride elementwise kernel over n elements: enough to fill
// a large GPU several times over, then each thread loops.
inline unsigned elementwise_blocks(int64_t n, int block) {
  constexpr int64_t kMaxBlocks = 4096;
  int64_t blocks = (n + block - 1) / block;
  return unsigned(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

// dst = src element by element in dst's dtype, both on the device, same
// numel (copy_fill.cu).
void convert(Tensor& dst, const Tensor& src, cudaStream_t stream);

}  // namespace ft::cuda
