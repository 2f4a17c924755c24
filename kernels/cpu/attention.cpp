// Causal grouped-query attention. Forward keeps one score row at a time and
// saves lse, the log-sum-exp of each row; backward recomputes the
// probabilities from lse (FlashAttention's math, without the tiling):
//   P = exp(S - lse), dV += P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dO * O)),
//   dQ = scale * dS K, dK = scale * dS^T Q.
// With a sliding window w > 0, query t sees keys max(0, t - w + 1) .. t.
// Every (batch, head) task first gathers its heads into contiguous f32 [T, D]
// buffers, so the inner loops are plain dot products and axpys.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_util.h"

namespace ft {
namespace {

using checks::AttentionShape;

// Element offset of x[b, t, h, 0] in a [B, T, H, D] tensor.
int64_t head_offset(const AttentionShape& d, int64_t heads, int64_t b, int64_t t, int64_t h) {
  return ((b * d.seq + t) * heads + h) * d.head_dim;
}

// dst[T, D] = x[b, :, h, :] as f32.
void gather_head(float* dst, const Tensor& x, const AttentionShape& d, int64_t b, int64_t h) {
  int64_t heads = x.dim(2);
  for (int64_t t = 0; t < d.seq; ++t)
    cpu::load_row(dst + t * d.head_dim, x, head_offset(d, heads, b, t, h), d.head_dim);
}

void scatter_head(Tensor& x, const float* src, const AttentionShape& d, int64_t b, int64_t h) {
  int64_t heads = x.dim(2);
  for (int64_t t = 0; t < d.seq; ++t)
    cpu::store_row(x, head_offset(d, heads, b, t, h), src + t * d.head_dim, d.head_dim);
}

float dot(const float* x, const float* y, int64_t n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += x[i] * y[i];
  return sum;
}

// y += alpha * x
void axpy(float* y, float alpha, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// The first key query t sees.
int64_t first_key(int64_t t, int64_t sliding_window) {
  return sliding_window > 0 ? std::max<int64_t>(0, t - sliding_window + 1) : 0;
}

}  // namespace

void CpuBackend::attention_forward_impl(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                                        float scale, int64_t sliding_window) {
  AttentionShape d = checks::attention_shape(q, k);
  int64_t T = d.seq, D = d.head_dim, group = d.q_heads / d.kv_heads;
  float* lse_out = lse.ptr<float>();
#pragma omp parallel
  {
    std::vector<float> qh(T * D), kh(T * D), vh(T * D), oh(T * D), p(T);
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < d.batch; ++b)
      for (int64_t h = 0; h < d.q_heads; ++h) {
        gather_head(qh.data(), q, d, b, h);
        gather_head(kh.data(), k, d, b, h / group);
        gather_head(vh.data(), v, d, b, h / group);
        for (int64_t t = 0; t < T; ++t) {
          const int64_t first = first_key(t, sliding_window);
          float max_score = -INFINITY;
          for (int64_t j = first; j <= t; ++j) {
            p[j] = scale * dot(&qh[t * D], &kh[j * D], D);
            max_score = std::max(max_score, p[j]);
          }
          float sum = 0.0f;
          for (int64_t j = first; j <= t; ++j) {
            p[j] = std::exp(p[j] - max_score);
            sum += p[j];
          }
          float* o = &oh[t * D];
          std::fill(o, o + D, 0.0f);
          for (int64_t j = first; j <= t; ++j) axpy(o, p[j] / sum, &vh[j * D], D);
          lse_out[(b * d.q_heads + h) * T + t] = max_score + std::log(sum);
        }
        scatter_head(out, oh.data(), d, b, h);
      }
  }
}

// One task per (batch, kv head): it owns dk and dv for that kv head and loops
// over the query heads that share it, so no two threads add into the same row.
void CpuBackend::attention_backward_impl(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                                         const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                                         float scale, int64_t sliding_window) {
  AttentionShape d = checks::attention_shape(q, k);
  int64_t T = d.seq, D = d.head_dim, group = d.q_heads / d.kv_heads;
  const float* lse_in = lse.ptr<const float>();
#pragma omp parallel
  {
    std::vector<float> kh(T * D), vh(T * D), dkh(T * D), dvh(T * D), qh(T * D), doh(T * D), oh(T * D), dqh(T * D);
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < d.batch; ++b)
      for (int64_t hk = 0; hk < d.kv_heads; ++hk) {
        gather_head(kh.data(), k, d, b, hk);
        gather_head(vh.data(), v, d, b, hk);
        std::fill(dkh.begin(), dkh.end(), 0.0f);
        std::fill(dvh.begin(), dvh.end(), 0.0f);
        for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
          gather_head(qh.data(), q, d, b, h);
          gather_head(doh.data(), dout, d, b, h);
          gather_head(oh.data(), out, d, b, h);
          std::fill(dqh.begin(), dqh.end(), 0.0f);
          for (int64_t t = 0; t < T; ++t) {
            const float* q_t = &qh[t * D];
            const float* do_t = &doh[t * D];
            float row_lse = lse_in[(b * d.q_heads + h) * T + t];
            float do_dot_o = dot(do_t, &oh[t * D], D);
            for (int64_t j = first_key(t, sliding_window); j <= t; ++j) {
              float p = std::exp(scale * dot(q_t, &kh[j * D], D) - row_lse);
              float ds = p * (dot(do_t, &vh[j * D], D) - do_dot_o);
              axpy(&dvh[j * D], p, do_t, D);
              axpy(&dqh[t * D], scale * ds, &kh[j * D], D);
              axpy(&dkh[j * D], scale * ds, q_t, D);
            }
          }
          scatter_head(dq, dqh.data(), d, b, h);
        }
        scatter_head(dk, dkh.data(), d, b, hk);
        scatter_head(dv, dvh.data(), d, b, hk);
      }
  }
}

}  // namespace ft
