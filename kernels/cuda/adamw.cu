// AdamW, step for step as torch.optim.AdamW's single-tensor path (the CPU
// backend's kernels/cpu/adamw.cpp is the reference), and the sum of squares
// behind global-norm gradient clipping. The _many forms cover all of the
// optimizer's tensors in one launch (a LoRA run has hundreds of small ones),
// each block on one chunk of one tensor, found through a table in scratch.
#include <climits>
#include <cmath>
#include <vector>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"

namespace ft {
namespace {

constexpr int kBlock = 256;
// Elements per block of adamw_update_many: enough work per block that a
// large tensor does not need millions of blocks.
constexpr int64_t kAdamWChunk = 8 * kBlock;

// The step's scalars, computed on the host exactly as the CPU backend does;
// the decay factor is per tensor (see decay_of).
struct AdamWScalars {
  float grad_scale, lerp_weight, beta2, one_minus_beta2, step_size, bias_correction2_sqrt, eps;
};

AdamWScalars scalars_of(const AdamWStep& s) {
  double bias_correction1 = 1.0 - std::pow(double(s.beta1), double(s.step));
  double bias_correction2 = 1.0 - std::pow(double(s.beta2), double(s.step));
  return AdamWScalars{s.grad_scale,
                      float(1.0 - double(s.beta1)),
                      s.beta2,
                      float(1.0 - double(s.beta2)),
                      float(double(s.lr) / bias_correction1),
                      float(std::sqrt(bias_correction2)),
                      s.eps};
}

float decay_of(const AdamWStep& s) { return float(1.0 - double(s.lr) * double(s.weight_decay)); }

// Every product, sum and quotient below is rounded on its own (__fmul_rn and
// friends), as the CPU reference writes them: left to itself nvcc contracts
// a * b + c into one FMA where the surrounding code lets it, and did so
// differently in adamw_kernel and adamw_many_kernel on an H100, so the two
// launches gave results that differed in the last bit.
// torch.lerp: for small weights start + w * (end - start), otherwise end - (end - start) * (1 - w).
__device__ inline float torch_lerp(float start, float end, float w) {
  const float difference = __fsub_rn(end, start);
  return w < 0.5f ? __fmaf_rn(w, difference, start) : __fsub_rn(end, __fmul_rn(difference, __fsub_rn(1.0f, w)));
}

__device__ inline void adamw_element(float* param, const float* grad, float* m, float* v, const AdamWScalars& s,
                                     float decay, int64_t i) {
  float g = __fmul_rn(grad[i], s.grad_scale);
  float p = __fmul_rn(param[i], decay);
  float m1 = torch_lerp(m[i], g, s.lerp_weight);
  float m2 = __fadd_rn(__fmul_rn(v[i], s.beta2), __fmul_rn(__fmul_rn(s.one_minus_beta2, g), g));
  m[i] = m1;
  v[i] = m2;
  float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(m2), s.bias_correction2_sqrt), s.eps);
  param[i] = __fadd_rn(p, __fmul_rn(-s.step_size, __fdiv_rn(m1, denom)));
}

// The last of count entries (sorted by first_block, the first at 0) whose
// first_block <= block: the tensor that block works on.
template <class Entry>
__device__ inline const Entry& entry_of(const Entry* table, int count, int64_t block) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (table[mid].first_block <= block) lo = mid;
    else hi = mid - 1;
  }
  return table[lo];
}

__global__ void __launch_bounds__(kBlock)
    adamw_kernel(float* param, const float* grad, float* m, float* v, AdamWScalars s, float decay, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(kBlock) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kBlock)
    adamw_element(param, grad, m, v, s, decay, i);
}

__global__ void __launch_bounds__(kBlock)
    adamw_many_kernel(const cuda::AdamWEntry* table, int count, AdamWScalars s) {
  const cuda::AdamWEntry& e = entry_of(table, count, blockIdx.x);
  int64_t start = (blockIdx.x - e.first_block) * kAdamWChunk;
  int64_t end = start + kAdamWChunk < e.numel ? start + kAdamWChunk : e.numel;
  for (int64_t i = start + threadIdx.x; i < end; i += kBlock) adamw_element(e.param, e.grad, e.m, e.v, s, e.decay, i);
}

// Block `block` of `blocks` over x sums the squares of elements
// block*kBlock + t, stepping by blocks*kBlock, in double; every thread gets
// the sum. scratch is the kernel's __shared__ double[32].
__device__ inline double squares_of_block(cuda::ConstView x, int64_t n, int64_t block, int64_t blocks,
                                          double* scratch) {
  double sum = 0.0;
  for (int64_t i = block * kBlock + threadIdx.x; i < n; i += blocks * kBlock) {
    double value = cuda::load(x, i);
    sum += value * value;
  }
  return cuda::block_sum<kBlock>(sum, scratch);
}

// partials[0..count) added up in a fixed order, returned to every thread.
__device__ inline double sum_in_order(const double* partials, int64_t count, double* scratch) {
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += kBlock) sum += partials[i];
  return cuda::block_sum<kBlock>(sum, scratch);
}

// Pass 1 of sum_squares: one partial sum per block; pass 2 adds them in order.
__global__ void __launch_bounds__(kBlock) sum_squares_kernel(double* partials, cuda::ConstView x, int64_t n) {
  __shared__ double scratch[32];
  double sum = squares_of_block(x, n, blockIdx.x, gridDim.x, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

__global__ void __launch_bounds__(kBlock) sum_partials_kernel(double* total, const double* partials, int64_t count) {
  __shared__ double scratch[32];
  double sum = sum_in_order(partials, count, scratch);
  if (threadIdx.x == 0) *total = sum;
}

// Pass 1 of sum_squares_many: each tensor's blocks as sum_squares_kernel's
// grid over it, their partial sums side by side.
__global__ void __launch_bounds__(kBlock)
    sum_squares_many_kernel(double* partials, const cuda::SumSquaresEntry* table, int count) {
  __shared__ double scratch[32];
  const cuda::SumSquaresEntry& e = entry_of(table, count, blockIdx.x);
  double sum = squares_of_block({e.data, e.dtype}, e.numel, blockIdx.x - e.first_block, e.blocks, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// Pass 2: each tensor's sum as sum_partials_kernel makes it, added in tensor order.
__global__ void __launch_bounds__(kBlock)
    sum_tensors_kernel(double* total, const double* partials, const cuda::SumSquaresEntry* table, int count) {
  __shared__ double scratch[32];
  double sum = 0.0;
  for (int t = 0; t < count; ++t) sum += sum_in_order(partials + table[t].first_block, table[t].blocks, scratch);
  if (threadIdx.x == 0) *total = sum;
}

// A host table copied into device scratch. The pageable copy has been staged
// when cudaMemcpyAsync returns, so the vector may go; the scratch is released
// in stream order like any op's.
template <class Entry>
Tensor upload(Backend& backend, const std::vector<Entry>& table, cudaStream_t stream) {
  const cuda::ScratchTensor declared = cuda::table_scratch<Entry>(int64_t(table.size()));
  Tensor device_table = backend.empty(declared.shape, declared.dtype, MemCategory::workspace);
  FT_CUDA_CHECK(cudaMemcpyAsync(device_table.data, table.data(), device_table.size_bytes(), cudaMemcpyHostToDevice,
                                stream));
  return device_table;
}

// Blocks are one grid dimension.
void check_grid(int64_t blocks, const char* op) {
  FT_CHECK(blocks <= INT_MAX, op, ": ", blocks, " blocks exceed one launch");
}

}  // namespace

void CudaBackend::adamw_update_impl(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& s) {
  int64_t n = param.numel();
  if (n == 0) return;
  launch<adamw_kernel>(cuda::elementwise_blocks(n, kBlock), kBlock, 0, stream_, param.ptr<float>(),
                       grad.ptr<const float>(), m.ptr<float>(), v.ptr<float>(), scalars_of(s), decay_of(s), n);
  FT_CUDA_CHECK_LAUNCH();
}

void CudaBackend::adamw_update_many_impl(std::span<const AdamWTensors> tensors, const AdamWStep& step) {
  std::vector<cuda::AdamWEntry> table;
  int64_t blocks = 0;
  for (const AdamWTensors& t : tensors) {
    const int64_t n = t.param->numel();
    if (n == 0) continue;  // no blocks: entry_of would never reach it
    table.push_back({t.param->ptr<float>(), t.grad->ptr<const float>(), t.m->ptr<float>(), t.v->ptr<float>(), n,
                     blocks, decay_of(t.step_for(step))});
    blocks += (n + kAdamWChunk - 1) / kAdamWChunk;
  }
  if (table.empty()) return;
  check_grid(blocks, "adamw_update_many");
  Tensor device_table = upload(*this, table, stream_);
  launch<adamw_many_kernel>(unsigned(blocks), kBlock, 0, stream_, device_table.ptr<const cuda::AdamWEntry>(),
                            int(table.size()), scalars_of(step));
  FT_CUDA_CHECK_LAUNCH();
}

double CudaBackend::sum_squares_impl(const Tensor& x) {
  int64_t n = x.numel();
  if (n == 0) return 0.0;
  int64_t blocks = cuda::sum_squares_blocks(n);
  Tensor partials = scratch(cuda::sum_squares_scratch(blocks));
  double* partial = partials.ptr<double>();
  double* total = partial + blocks;
  launch<sum_squares_kernel>(unsigned(blocks), kBlock, 0, stream_, partial, cuda::const_view(x), n);
  FT_CUDA_CHECK_LAUNCH();
  launch<sum_partials_kernel>(1, kBlock, 0, stream_, total, partial, blocks);
  FT_CUDA_CHECK_LAUNCH();
  double result = 0.0;
  FT_CUDA_CHECK(cudaMemcpyAsync(&result, total, sizeof(double), cudaMemcpyDeviceToHost, stream_));
  FT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return result;
}

double CudaBackend::sum_squares_many_impl(std::span<const Tensor* const> tensors) {
  std::vector<cuda::SumSquaresEntry> table;
  int64_t blocks = 0;
  for (const Tensor* x : tensors) {
    if (x->numel() == 0) continue;
    const int64_t count = cuda::sum_squares_blocks(x->numel());
    table.push_back({x->data, x->numel(), blocks, count, x->dtype});
    blocks += count;
  }
  if (table.empty()) return 0.0;
  check_grid(blocks, "sum_squares_many");
  Tensor device_table = upload(*this, table, stream_);
  const auto* entries = device_table.ptr<const cuda::SumSquaresEntry>();
  Tensor partials = scratch(cuda::sum_squares_scratch(blocks));  // doubles, the total last
  double* partial = partials.ptr<double>();
  double* total = partial + blocks;
  launch<sum_squares_many_kernel>(unsigned(blocks), kBlock, 0, stream_, partial, entries, int(table.size()));
  FT_CUDA_CHECK_LAUNCH();
  launch<sum_tensors_kernel>(1, kBlock, 0, stream_, total, partial, entries, int(table.size()));
  FT_CUDA_CHECK_LAUNCH();
  double result = 0.0;
  FT_CUDA_CHECK(cudaMemcpyAsync(&result, total, sizeof(double), cudaMemcpyDeviceToHost, stream_));
  FT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return result;
}

}  // namespace ft
