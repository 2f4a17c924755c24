// T5's attention on the CPU: unscaled scores plus a [Tq, Tk, H] bias, a
// causal or a full mask (cut at each row's key length), the whole score row of one query at a time (T5's
// sequences are short; no tiling). Backward recomputes each row's
// probabilities from lse:
//   P = exp(S - lse), Di = rowsum(dO * O), dP = dO V^T, dS = P * (dP - Di),
//   dV = P^T dO, dQ = dS K, dK = dS^T Q, dbias = sum over the batch of dS.
// Forward runs one task per (batch, head). Backward runs one task per head
// that walks the batch in order, so dbias[:, :, h] has one writer and a
// fixed summation order.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_util.h"

namespace ft {
namespace {

// A head of a [B, T, H, D] tensor as f32 [T, D], and back.
void gather_head(float* dst, const Tensor& x, int64_t b, int64_t h) {
  const int64_t T = x.dim(1), H = x.dim(2), D = x.dim(3);
  for (int64_t t = 0; t < T; ++t) cpu::load_row(dst + t * D, x, ((b * T + t) * H + h) * D, D);
}
void scatter_head(Tensor& x, const float* src, int64_t b, int64_t h) {
  const int64_t T = x.dim(1), H = x.dim(2), D = x.dim(3);
  for (int64_t t = 0; t < T; ++t) cpu::store_row(x, ((b * T + t) * H + h) * D, src + t * D, D);
}

// bias[:, :, h] as f32 [Tq, Tk], zeros without a bias.
std::vector<float> bias_of_head(const Tensor* bias, int64_t Tq, int64_t Tk, int64_t H, int64_t h) {
  std::vector<float> out(size_t(Tq * Tk), 0.0f);
  if (!bias) return out;
  for (int64_t n = 0; n < Tq * Tk; ++n) out[size_t(n)] = load_as_f32(bias->data, bias->dtype, n * H + h);
  return out;
}

// Lane-wise partial sums (vectorised; a serial float sum is latency-bound).
float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t e = 0; e < n; ++e) sum += a[e] * b[e];
  return sum;
}

// One (batch, head)'s operands as f32 [T, D] buffers.
struct Head {
  std::vector<float> q, k, v, out, dout;
};

Head gather(const Tensor& q, const Tensor& k, const Tensor& v, int64_t b, int64_t h) {
  const int64_t Tq = q.dim(1), Tk = k.dim(1), D = q.dim(3);
  Head head;
  head.q.resize(size_t(Tq * D));
  head.k.resize(size_t(Tk * D));
  head.v.resize(size_t(Tk * D));
  gather_head(head.q.data(), q, b, h);
  gather_head(head.k.data(), k, b, h);
  gather_head(head.v.data(), v, b, h);
  return head;
}

// p[j] = exp(q_i . k_j + bias_row[j] - lse) over the visible keys [0, keys).
void probabilities(float* p, const float* q_i, const float* k, const float* bias_row, int64_t keys, int64_t D,
                   float lse) {
  for (int64_t j = 0; j < keys; ++j) p[j] = std::exp(dot(q_i, k + j * D, D) + bias_row[j] - lse);
}

// How many keys query i of row b sees: [0, keys).
int64_t visible_keys(const Tensor* key_lengths, int64_t b, int64_t i, int64_t Tk, bool causal) {
  const int64_t keys = causal ? i + 1 : Tk;
  return key_lengths ? std::min<int64_t>(keys, key_lengths->ptr<const int32_t>()[b]) : keys;
}

}  // namespace

void CpuBackend::biased_attention_forward_impl(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k,
                                               const Tensor& v, const Tensor* bias, const Tensor* key_lengths,
                                               bool causal) {
  const int64_t B = q.dim(0), Tq = q.dim(1), H = q.dim(2), D = q.dim(3), Tk = k.dim(1);
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      Head head = gather(q, k, v, b, h);
      const std::vector<float> bias_h = bias_of_head(bias, Tq, Tk, H, h);
      std::vector<float> o(size_t(Tq * D), 0.0f), s(size_t(Tk), 0.0f);
      float* lse_bh = lse.ptr<float>() + (b * H + h) * Tq;
      for (int64_t i = 0; i < Tq; ++i) {
        const int64_t keys = visible_keys(key_lengths, b, i, Tk, causal);
        for (int64_t j = 0; j < keys; ++j)
          s[size_t(j)] = dot(&head.q[size_t(i * D)], &head.k[size_t(j * D)], D) + bias_h[size_t(i * Tk + j)];
        const float row_max = *std::max_element(s.begin(), s.begin() + keys);
        float sum = 0.0f;
        float* o_i = &o[size_t(i * D)];
        for (int64_t j = 0; j < keys; ++j) {
          const float p = std::exp(s[size_t(j)] - row_max);
          sum += p;
          for (int64_t e = 0; e < D; ++e) o_i[e] += p * head.v[size_t(j * D + e)];
        }
        for (int64_t e = 0; e < D; ++e) o_i[e] /= sum;
        lse_bh[i] = row_max + std::log(sum);
      }
      scatter_head(out, o.data(), b, h);
    }
}

void CpuBackend::biased_attention_backward_impl(Tensor& dq, Tensor& dk, Tensor& dv, Tensor* dbias, const Tensor& dout,
                                                const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                                const Tensor& lse, const Tensor* bias, const Tensor* key_lengths,
                                                bool causal) {
  const int64_t B = q.dim(0), Tq = q.dim(1), H = q.dim(2), D = q.dim(3), Tk = k.dim(1);
#pragma omp parallel for schedule(dynamic)
  for (int64_t h = 0; h < H; ++h) {
    const std::vector<float> bias_h = bias_of_head(bias, Tq, Tk, H, h);
    std::vector<float> dbias_h(size_t(Tq * Tk), 0.0f), p(size_t(Tk), 0.0f);
    for (int64_t b = 0; b < B; ++b) {
      Head head = gather(q, k, v, b, h);
      head.out.resize(size_t(Tq * D));
      head.dout.resize(size_t(Tq * D));
      gather_head(head.out.data(), out, b, h);
      gather_head(head.dout.data(), dout, b, h);
      std::vector<float> dq_h(size_t(Tq * D), 0.0f), dk_h(size_t(Tk * D), 0.0f), dv_h(size_t(Tk * D), 0.0f);
      const float* lse_bh = lse.ptr<const float>() + (b * H + h) * Tq;
      for (int64_t i = 0; i < Tq; ++i) {
        const int64_t keys = visible_keys(key_lengths, b, i, Tk, causal);
        const float* q_i = &head.q[size_t(i * D)];
        const float* do_i = &head.dout[size_t(i * D)];
        const float di = dot(do_i, &head.out[size_t(i * D)], D);
        probabilities(p.data(), q_i, head.k.data(), &bias_h[size_t(i * Tk)], keys, D, lse_bh[i]);
        for (int64_t j = 0; j < keys; ++j) {
          const float ds = p[size_t(j)] * (dot(do_i, &head.v[size_t(j * D)], D) - di);
          dbias_h[size_t(i * Tk + j)] += ds;
          for (int64_t e = 0; e < D; ++e) {
            dv_h[size_t(j * D + e)] += p[size_t(j)] * do_i[e];
            dq_h[size_t(i * D + e)] += ds * head.k[size_t(j * D + e)];
            dk_h[size_t(j * D + e)] += ds * q_i[e];
          }
        }
      }
      scatter_head(dq, dq_h.data(), b, h);
      scatter_head(dk, dk_h.data(), b, h);
      scatter_head(dv, dv_h.data(), b, h);
    }
    if (!dbias) continue;
    float* dst = dbias->ptr<float>();
    for (int64_t n = 0; n < Tq * Tk; ++n) dst[n * H + h] += dbias_h[size_t(n)];
  }
}

}  // namespace ft
