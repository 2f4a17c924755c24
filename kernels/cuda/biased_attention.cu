// T5's attention (kernels/backend.h, biased_attention_*): unscaled scores
// plus a [Tq, Tk, H] bias, causal or full, cut at each row's key length
// (key_lengths null: none). Same math as the CPU reference
// (kernels/cpu/biased_attention.cpp):
//   forward:  S = Q K^T + bias, O = softmax(S) V, lse = logsumexp(S)
//   backward: P = exp(S - lse), Di = rowsum(dO * O), dP = dO V^T,
//             dS = P * (dP - Di), dV = P^T dO, dK = dS^T Q, dQ = dS K,
//             dbias = sum over the batch of dS.
// One block per score row: its scores (or probabilities) sit in shared
// memory, so Tk (Tq in the dK/dV kernel) is bounded by the default 48 KiB.
// T5 runs a few hundred tokens with 64-wide heads; these are plain f32 FMA
// loops without tiling, and deterministic: each output element has one
// writer summing in a fixed order (dbias walks the batch inside one block),
// no atomics.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"

namespace ft {
namespace {

constexpr int kBlock = 128;
constexpr int64_t kMaxSharedBytes = 48 * 1024;

struct Dims {
  int batch, q_len, k_len, heads, head_dim;
  bool causal;
};

// x[b, t, h, :] of a [B, T, H, D] tensor starts here.
__device__ inline int64_t row_at(const Dims& d, int64_t len, int b, int t, int h) {
  return ((int64_t(b) * len + t) * d.heads + h) * d.head_dim;
}

// sum over e < D of a_s[e] (shared) * x[at + e].
__device__ inline float dot_shared(const float* a_s, cuda::ConstView x, int64_t at, int D) {
  float sum = 0.0f;
  for (int e = 0; e < D; ++e) sum = fmaf(a_s[e], cuda::load(x, at + e), sum);
  return sum;
}

__device__ inline float dot_global(cuda::ConstView a, int64_t a_at, cuda::ConstView x, int64_t x_at, int D) {
  float sum = 0.0f;
  for (int e = 0; e < D; ++e) sum = fmaf(cuda::load(a, a_at + e), cuda::load(x, x_at + e), sum);
  return sum;
}

// bias[i, j, h], 0 without a bias (bias.data null).
__device__ inline float bias_at(cuda::ConstView bias, const Dims& d, int i, int j, int h) {
  return bias.data ? cuda::load(bias, (int64_t(i) * d.k_len + j) * d.heads + h) : 0.0f;
}

// How many keys query i of row b sees: [0, keys).
__device__ inline int visible_keys(const Dims& d, const int32_t* key_lengths, int b, int i) {
  const int keys = d.causal ? i + 1 : d.k_len;
  return key_lengths ? min(keys, int(key_lengths[b])) : keys;
}

__device__ inline void stage(float* dst, cuda::ConstView x, int64_t at, int D) {
  for (int e = threadIdx.x; e < D; e += kBlock) dst[e] = cuda::load(x, at + e);
}

// Block (query i, head h, batch b): the score row in shared memory, then O's row.
__global__ void __launch_bounds__(kBlock)
    biased_attention_forward_kernel(cuda::View out, float* lse, cuda::ConstView q, cuda::ConstView k,
                                    cuda::ConstView v, cuda::ConstView bias, const int32_t* key_lengths, Dims d) {
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, D = d.head_dim;
  const int keys = visible_keys(d, key_lengths, b, i);
  FT_DYNAMIC_SHARED(float, smem);
  float* q_s = smem;      // [D]
  float* s_s = smem + D;  // [Tk]: scores, then exp(score - max)
  __shared__ float scratch[32];
  stage(q_s, q, row_at(d, d.q_len, b, i, h), D);
  __syncthreads();
  float row_max = -INFINITY;
  for (int j = threadIdx.x; j < keys; j += kBlock) {
    const float s = dot_shared(q_s, k, row_at(d, d.k_len, b, j, h), D) + bias_at(bias, d, i, j, h);
    s_s[j] = s;
    row_max = fmaxf(row_max, s);
  }
  row_max = cuda::block_max<kBlock>(row_max, scratch);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < keys; j += kBlock) {
    const float p = expf(s_s[j] - row_max);
    s_s[j] = p;
    sum += p;
  }
  sum = cuda::block_sum<kBlock>(sum, scratch);  // its barriers also publish s_s
  const int64_t out_at = row_at(d, d.q_len, b, i, h);
  for (int e = threadIdx.x; e < D; e += kBlock) {
    float acc = 0.0f;
    for (int j = 0; j < keys; ++j) acc = fmaf(s_s[j], cuda::load(v, row_at(d, d.k_len, b, j, h) + e), acc);
    cuda::store(out, out_at + e, acc / sum);
  }
  if (threadIdx.x == 0) lse[(int64_t(b) * d.heads + h) * d.q_len + i] = row_max + logf(sum);
}

// Block (query i, head h), walking the batch: dS's row for each b, dQ's row
// from it, and the row's dS summed over the batch into dbias (data null: none).
__global__ void __launch_bounds__(kBlock)
    biased_attention_dq_kernel(cuda::View dq, float* dbias, cuda::ConstView dout, cuda::ConstView q,
                               cuda::ConstView k, cuda::ConstView v, cuda::ConstView out, const float* lse,
                               cuda::ConstView bias, const int32_t* key_lengths, Dims d) {
  const int i = blockIdx.x, h = blockIdx.y, D = d.head_dim;
  const int keys = d.causal ? i + 1 : d.k_len;  // the most any row sees
  FT_DYNAMIC_SHARED(float, smem);
  float* q_s = smem;                   // [D]
  float* do_s = smem + D;              // [D]
  float* ds_s = smem + 2 * D;          // [Tk]: this b's dS row
  float* acc_s = ds_s + d.k_len;       // [Tk]: dS summed over b; entry j is thread j % kBlock's
  __shared__ float scratch[32];
  for (int j = threadIdx.x; j < keys; j += kBlock) acc_s[j] = 0.0f;
  for (int b = 0; b < d.batch; ++b) {
    const int64_t at = row_at(d, d.q_len, b, i, h);
    stage(q_s, q, at, D);
    stage(do_s, dout, at, D);
    __syncthreads();
    float di = 0.0f;
    for (int e = threadIdx.x; e < D; e += kBlock) di = fmaf(do_s[e], cuda::load(out, at + e), di);
    di = cuda::block_sum<kBlock>(di, scratch);
    const float row_lse = lse[(int64_t(b) * d.heads + h) * d.q_len + i];
    const int row_keys = visible_keys(d, key_lengths, b, i);
    for (int j = threadIdx.x; j < row_keys; j += kBlock) {
      const int64_t key_at = row_at(d, d.k_len, b, j, h);
      const float p = expf(dot_shared(q_s, k, key_at, D) + bias_at(bias, d, i, j, h) - row_lse);
      const float ds = p * (dot_shared(do_s, v, key_at, D) - di);
      ds_s[j] = ds;
      acc_s[j] += ds;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < D; e += kBlock) {
      float acc = 0.0f;
      for (int j = 0; j < row_keys; ++j) acc = fmaf(ds_s[j], cuda::load(k, row_at(d, d.k_len, b, j, h) + e), acc);
      cuda::store(dq, at + e, acc);
    }
    __syncthreads();  // q_s, do_s and ds_s are restaged next
  }
  if (!dbias) return;
  for (int j = threadIdx.x; j < keys; j += kBlock) dbias[(int64_t(i) * d.k_len + j) * d.heads + h] += acc_s[j];
}

// Block (key j, head h, batch b): P's and dS's column j, then dV's and dK's rows.
__global__ void __launch_bounds__(kBlock)
    biased_attention_dkdv_kernel(cuda::View dk, cuda::View dv, cuda::ConstView dout, cuda::ConstView q,
                                 cuda::ConstView k, cuda::ConstView v, cuda::ConstView out, const float* lse,
                                 cuda::ConstView bias, const int32_t* key_lengths, Dims d) {
  const int j = blockIdx.x, h = blockIdx.y, b = blockIdx.z, D = d.head_dim;
  const bool masked = key_lengths && j >= key_lengths[b];  // no query sees it: dk = dv = 0
  const int first = masked ? d.q_len : d.causal ? j : 0;  // the first query that sees key j
  FT_DYNAMIC_SHARED(float, smem);
  float* k_s = smem;                 // [D]
  float* v_s = smem + D;             // [D]
  float* p_s = smem + 2 * D;         // [Tq]
  float* ds_s = p_s + d.q_len;       // [Tq]
  const int64_t key_at = row_at(d, d.k_len, b, j, h);
  stage(k_s, k, key_at, D);
  stage(v_s, v, key_at, D);
  __syncthreads();
  for (int i = first + int(threadIdx.x); i < d.q_len; i += kBlock) {
    const int64_t at = row_at(d, d.q_len, b, i, h);
    const float row_lse = lse[(int64_t(b) * d.heads + h) * d.q_len + i];
    const float p = expf(dot_shared(k_s, q, at, D) + bias_at(bias, d, i, j, h) - row_lse);
    const float di = dot_global(dout, at, out, at, D);
    p_s[i] = p;
    ds_s[i] = p * (dot_shared(v_s, dout, at, D) - di);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < D; e += kBlock) {
    float dv_acc = 0.0f, dk_acc = 0.0f;
    for (int i = first; i < d.q_len; ++i) {
      const int64_t at = row_at(d, d.q_len, b, i, h) + e;
      dv_acc = fmaf(p_s[i], cuda::load(dout, at), dv_acc);
      dk_acc = fmaf(ds_s[i], cuda::load(q, at), dk_acc);
    }
    cuda::store(dv, key_at + e, dv_acc);
    cuda::store(dk, key_at + e, dk_acc);
  }
}

Dims dims_of(const char* op, const Tensor& q, const Tensor& k, bool causal) {
  const int64_t B = q.dim(0), Tq = q.dim(1), H = q.dim(2), D = q.dim(3), Tk = k.dim(1);
  const int64_t shared_bytes = (2 * D + 2 * std::max(Tq, Tk)) * int64_t(sizeof(float));
  FT_CHECK(shared_bytes <= kMaxSharedBytes, op, ": ", Tq, " queries, ", Tk, " keys and head_dim ", D,
           " need ", shared_bytes, " bytes of shared memory per block, over the ", kMaxSharedBytes, " supported");
  FT_CHECK(B <= 65535 && H <= 65535, op, ": batch ", B, " or heads ", H, " exceed the grid's 65535");
  return {int(B), int(Tq), int(Tk), int(H), int(D), causal};
}

cuda::ConstView optional_view(const Tensor* t) {
  return t ? cuda::const_view(*t) : cuda::ConstView{nullptr, DType::f32};
}

const int32_t* lengths_of(const Tensor* key_lengths) {
  return key_lengths ? key_lengths->ptr<const int32_t>() : nullptr;
}

}  // namespace

void CudaBackend::biased_attention_forward_impl(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k,
                                                const Tensor& v, const Tensor* bias, const Tensor* key_lengths,
                                                bool causal) {
  const Dims d = dims_of("biased_attention_forward", q, k, causal);
  if (q.numel() == 0 || k.numel() == 0) return;
  const size_t shared_bytes = size_t(d.head_dim + d.k_len) * sizeof(float);
  launch<biased_attention_forward_kernel>(dim3(unsigned(d.q_len), unsigned(d.heads), unsigned(d.batch)), kBlock,
                                          shared_bytes, stream_, cuda::view(out), lse.ptr<float>(),
                                          cuda::const_view(q), cuda::const_view(k), cuda::const_view(v),
                                          optional_view(bias), lengths_of(key_lengths), d);
  FT_CUDA_CHECK_LAUNCH();
}

void CudaBackend::biased_attention_backward_impl(Tensor& dq, Tensor& dk, Tensor& dv, Tensor* dbias,
                                                 const Tensor& dout, const Tensor& q, const Tensor& k,
                                                 const Tensor& v, const Tensor& out, const Tensor& lse,
                                                 const Tensor* bias, const Tensor* key_lengths, bool causal) {
  const Dims d = dims_of("biased_attention_backward", q, k, causal);
  if (q.numel() == 0 || k.numel() == 0) return;
  const size_t dq_shared_bytes = size_t(2 * d.head_dim + 2 * d.k_len) * sizeof(float);
  launch<biased_attention_dq_kernel>(dim3(unsigned(d.q_len), unsigned(d.heads)), kBlock, dq_shared_bytes, stream_,
                                     cuda::view(dq), dbias ? dbias->ptr<float>() : nullptr, cuda::const_view(dout),
                                     cuda::const_view(q), cuda::const_view(k), cuda::const_view(v),
                                     cuda::const_view(out), lse.ptr<const float>(), optional_view(bias),
                                     lengths_of(key_lengths), d);
  FT_CUDA_CHECK_LAUNCH();
  const size_t dkdv_shared_bytes = size_t(2 * d.head_dim + 2 * d.q_len) * sizeof(float);
  launch<biased_attention_dkdv_kernel>(dim3(unsigned(d.k_len), unsigned(d.heads), unsigned(d.batch)), kBlock,
                                       dkdv_shared_bytes, stream_, cuda::view(dk), cuda::view(dv),
                                       cuda::const_view(dout), cuda::const_view(q), cuda::const_view(k),
                                       cuda::const_view(v), cuda::const_view(out), lse.ptr<const float>(),
                                       optional_view(bias), lengths_of(key_lengths), d);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
