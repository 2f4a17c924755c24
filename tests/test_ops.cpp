// CPU backend ops against float64 references written out plainly in this file.
// Forwards run on random inputs of odd sizes and are compared with the
// reference; backwards are compared with central finite differences (in
// double) of the reference forward under a probe loss sum(out * probe), so a
// wrong reference cannot hide a wrong kernel.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/amx_tile.h"
#include "kernels/cpu/bf16_tile.h"
#include "kernels/cpu/vec_exp.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/onednn_gemm.h"
#include "kernels/dropout_hash.h"
#include "kernels/error.h"
#include "kernels/op_profile.h"
#include "model/rope.h"
#include "tests/host_tensors.h"
#include "tests/wide_cross_entropy.h"

using namespace ft;
using Vec = std::vector<double>;

namespace {

// Every comparison passes when |got - want| <= tol * (1 + |want|): absolute
// near zero, relative for large values.
// f32 kernels on O(1) inputs, reductions of at most a few hundred terms: f32
// rounding (2^-24 = 6e-8 per operation) stays well below 2e-5 (worst seen:
// 5e-6, the 301-deep matmul).
constexpr double kF32Tol = 2e-5;
// f32 backwards chain two or three reductions (softmax, then weighted sums);
// worst seen 3e-7, so this leaves room for other thread counts and compilers.
constexpr double kGradTol = 5e-5;
// bf16 results carry one final rounding to 8 significant bits: half an ulp is
// 2^-8 = 3.9e-3 relative, plus f32 noise.
constexpr double kBf16Tol = 4e-3;
// Central-difference step in double: truncation error ~h^2 = 1e-10 and
// cancellation error ~1e-16 / h = 1e-11, both far below kGradTol.
constexpr double kFdStep = 1e-5;

HostAllocator host;
CpuBackend cpu_backend(host);
Backend& backend = cpu_backend;  // through the interface, as model code calls it (default alpha/beta)

Tensor make(const Shape& shape, DType dtype) { return backend.empty(shape, dtype, MemCategory::activations); }

// A tensor holding `values` rounded to dtype.
Tensor make(const Shape& shape, DType dtype, const Vec& values) {
  Tensor t = make(shape, dtype);
  REQUIRE(int64_t(values.size()) == t.numel());
  for (size_t i = 0; i < values.size(); ++i) store_from_f32(t.data, dtype, int64_t(i), float(values[i]));
  return t;
}

Tensor make_i32(const std::vector<int32_t>& values) {
  Tensor t = make({int64_t(values.size())}, DType::i32);
  for (size_t i = 0; i < values.size(); ++i) t.ptr<int32_t>()[i] = values[i];
  return t;
}

Vec values_of(const Tensor& t) {
  Vec out(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[size_t(i)] = load_as_f32(t.data, t.dtype, i);
  return out;
}

// What a kernel actually reads after `values` are stored as dtype.
Vec rounded(const Vec& values, DType dtype) {
  Vec out(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    uint32_t slot = 0;
    store_from_f32(&slot, dtype, 0, float(values[i]));
    out[i] = load_as_f32(&slot, dtype, 0);
  }
  return out;
}

Vec random_vec(size_t n, std::mt19937& rng, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec out(n);
  for (double& x : out) x = dist(rng);
  return out;
}

double dot(const Vec& a, const Vec& b) {
  double sum = 0.0;
  for (size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

void check_close(const Vec& got, const Vec& want, double tol, const char* what) {
  REQUIRE(got.size() == want.size());
  double worst = 0.0;
  size_t worst_at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double excess = std::abs(got[i] - want[i]) / (1.0 + std::abs(want[i]));
    if (!(excess <= worst)) {  // also catches NaN
      worst = excess;
      worst_at = i;
    }
  }
  INFO(std::string(what), ": worst relative error ", worst, " at ", worst_at, " (got ", got[worst_at], ", want ",
       want[worst_at], ")");
  CHECK(worst <= tol);
}

// Gradient of a scalar function by central differences, one coordinate at a time.
Vec numeric_grad(const std::function<double(const Vec&)>& f, Vec x) {
  Vec grad(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double saved = x[i];
    x[i] = saved + kFdStep;
    double up = f(x);
    x[i] = saved - kFdStep;
    double down = f(x);
    x[i] = saved;
    grad[i] = (up - down) / (2.0 * kFdStep);
  }
  return grad;
}

// ---- references ---------------------------------------------------------

// op(a)[M,K] @ op(b)[K,N]; a is stored [M,K] ([K,M] if ta), b [K,N] ([N,K] if tb).
Vec matmul_ref(const Vec& a, const Vec& b, int M, int N, int K, bool ta, bool tb) {
  Vec out(size_t(M) * N, 0.0);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j)
      for (int p = 0; p < K; ++p)
        out[size_t(i) * N + j] += (ta ? a[size_t(p) * M + i] : a[size_t(i) * K + p]) *
                                  (tb ? b[size_t(j) * K + p] : b[size_t(p) * N + j]);
  return out;
}

Vec rmsnorm_rstd_ref(const Vec& x, int N, int C, double eps) {
  Vec rstd(N);
  for (int n = 0; n < N; ++n) {
    double sum_sq = 0.0;
    for (int c = 0; c < C; ++c) sum_sq += x[size_t(n) * C + c] * x[size_t(n) * C + c];
    rstd[n] = 1.0 / std::sqrt(sum_sq / C + eps);
  }
  return rstd;
}

Vec rmsnorm_ref(const Vec& x, const Vec& w, int N, int C, double eps) {
  Vec rstd = rmsnorm_rstd_ref(x, N, C, eps), out(x.size());
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) out[size_t(n) * C + c] = w[c] * x[size_t(n) * C + c] * rstd[n];
  return out;
}

// HF rotate_half RoPE on x [N, H, D]. inv_freq and the angle are f32, exactly
// as HF LlamaRotaryEmbedding computes them; the rotation itself in double.
// The angle is the contract's f32 float(pos) * inv_freq[i]; the rotation is float64.
Vec rope_ref(const Vec& x, const std::vector<int32_t>& pos, int H, int D, const std::vector<float>& inv_freq) {
  Vec out = x;
  int half = int(inv_freq.size());
  for (size_t n = 0; n < pos.size(); ++n)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < half; ++i) {
        double angle = double(float(pos[n]) * inv_freq[size_t(i)]);
        size_t at = (n * H + h) * D + i;
        double x1 = x[at], x2 = x[at + half];
        out[at] = x1 * std::cos(angle) - x2 * std::sin(angle);
        out[at + half] = x2 * std::cos(angle) + x1 * std::sin(angle);
      }
  return out;
}

struct AttnShape {
  int B, T, Hq, Hkv, D;
  int window = 0;  // sliding window, 0: plain causal
};

size_t attn_at(const AttnShape& s, int heads, int b, int t, int h) {
  return ((size_t(b) * s.T + t) * heads + h) * s.D;
}

// Causal GQA attention: out [B,T,Hq,D], lse [B,Hq,T]. With window W > 0 query
// t sees keys j in (t - W, t] only (the sliding-window contract).
void attention_ref(const Vec& q, const Vec& k, const Vec& v, const AttnShape& s, double scale, Vec& out,
                   Vec& lse) {
  out.assign(size_t(s.B) * s.T * s.Hq * s.D, 0.0);
  lse.assign(size_t(s.B) * s.Hq * s.T, 0.0);
  int group = s.Hq / s.Hkv;
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.Hq; ++h)
      for (int t = 0; t < s.T; ++t) {
        Vec score(t + 1);
        double max_score = -INFINITY;
        const int j0 = s.window > 0 ? std::max(0, t - s.window + 1) : 0;
        for (int j = j0; j <= t; ++j) {
          double sum = 0.0;
          for (int d = 0; d < s.D; ++d)
            sum += q[attn_at(s, s.Hq, b, t, h) + d] * k[attn_at(s, s.Hkv, b, j, h / group) + d];
          score[j] = scale * sum;
          max_score = std::max(max_score, score[j]);
        }
        double denom = 0.0;
        for (int j = j0; j <= t; ++j) denom += std::exp(score[j] - max_score);
        for (int j = j0; j <= t; ++j)
          for (int d = 0; d < s.D; ++d)
            out[attn_at(s, s.Hq, b, t, h) + d] +=
                std::exp(score[j] - max_score) / denom * v[attn_at(s, s.Hkv, b, j, h / group) + d];
        lse[(size_t(b) * s.Hq + h) * s.T + t] = max_score + std::log(denom);
      }
}

// Per-row softmax cross-entropy, 0 for rows whose target is -100.
Vec cross_entropy_ref(const Vec& logits, const std::vector<int32_t>& targets, int V) {
  Vec losses(targets.size(), 0.0);
  for (size_t n = 0; n < targets.size(); ++n) {
    if (targets[n] == -100) continue;
    double max_logit = -INFINITY, sum = 0.0;
    for (int i = 0; i < V; ++i) max_logit = std::max(max_logit, logits[n * V + i]);
    for (int i = 0; i < V; ++i) sum += std::exp(logits[n * V + i] - max_logit);
    losses[n] = max_logit + std::log(sum) - logits[n * V + size_t(targets[n])];
  }
  return losses;
}

double silu(double x) { return x / (1.0 + std::exp(-x)); }

}  // namespace

// ---- copy / fill --------------------------------------------------------

TEST_CASE("copy converts f32 <-> bf16 <-> f16 with round-to-nearest-even") {
  std::mt19937 rng(1);
  const int n = 2051;  // crosses the kernels' 1024-element chunks
  Vec values = random_vec(n, rng, -300.0, 300.0);
  Tensor f32 = make({n}, DType::f32, values);
  Tensor bf16 = make({n}, DType::bf16), f16 = make({n}, DType::f16), f16_direct = make({n}, DType::f16);
  Tensor bf16_from_f16 = make({n}, DType::bf16), f32_from_bf16 = make({n}, DType::f32);
  Tensor f32_from_f16 = make({n}, DType::f32);
  backend.copy(bf16, f32);
  backend.copy(f16, bf16);
  backend.copy(f16_direct, f32);
  backend.copy(bf16_from_f16, f16_direct);
  backend.copy(f32_from_bf16, bf16);
  backend.copy(f32_from_f16, f16_direct);
  for (int i = 0; i < n; ++i) {
    float x = f32.ptr<float>()[i];
    uint16_t want_bf16 = f32_to_bf16(x), want_f16 = f32_to_f16(x);
    REQUIRE(bf16.ptr<uint16_t>()[i] == want_bf16);
    REQUIRE(f16.ptr<uint16_t>()[i] == f32_to_f16(bf16_to_f32(want_bf16)));
    REQUIRE(f16_direct.ptr<uint16_t>()[i] == want_f16);
    REQUIRE(bf16_from_f16.ptr<uint16_t>()[i] == f32_to_bf16(f16_to_f32(want_f16)));
    REQUIRE(f32_from_bf16.ptr<float>()[i] == bf16_to_f32(want_bf16));
    REQUIRE(f32_from_f16.ptr<float>()[i] == f16_to_f32(want_f16));
  }
  Tensor same = make({n}, DType::f32);
  backend.copy(same, f32.reshaped({7, 293}));  // any shape with the same element count
  CHECK(values_of(same) == values_of(f32));
  Tensor short_dst = make({n - 1}, DType::f32);
  CHECK_THROWS_AS(backend.copy(short_dst, f32), Error);
  Tensor ints = make_i32({1, 2, 3});
  Tensor three = make({3}, DType::f32);
  CHECK_THROWS_AS(backend.copy(three, ints), Error);
}

TEST_CASE("fill writes the value rounded to the tensor's dtype") {
  Tensor f32 = make({13}, DType::f32), bf16 = make({13}, DType::bf16);
  backend.fill(f32, 0.1f);
  backend.fill(bf16, 0.1f);
  CHECK(values_of(f32) == Vec(13, double(0.1f)));
  CHECK(values_of(bf16) == Vec(13, double(bf16_to_f32(f32_to_bf16(0.1f)))));
}

// ---- matmul -------------------------------------------------------------

TEST_CASE("matmul: all four transpose combinations, beta = 0 ignores NaN in out") {
  std::mt19937 rng(2);
  const int M = 13, N = 7, K = 37;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      CAPTURE(ta);
      CAPTURE(tb);
      Vec a = random_vec(size_t(M) * K, rng), b = random_vec(size_t(K) * N, rng);
      Tensor ta_t = make(ta ? Shape{K, M} : Shape{M, K}, DType::f32, a);
      Tensor tb_t = make(tb ? Shape{N, K} : Shape{K, N}, DType::f32, b);
      Tensor out = make({M, N}, DType::f32);
      backend.fill(out, NAN);
      backend.matmul(out, ta_t, tb_t, ta, tb);
      check_close(values_of(out), matmul_ref(a, b, M, N, K, ta, tb), kF32Tol, "matmul");
    }
}

TEST_CASE("matmul: alpha and beta across every blocking boundary") {
  // M > 2 row blocks (72), N > one packed slice (1024) and not a multiple of
  // the 16-wide tile, K > one 256-deep slice: beta must apply exactly once.
  std::mt19937 rng(3);
  const int M = 151, N = 1043, K = 301;
  const float alpha = 0.75f, beta = -1.5f;
  Vec a = random_vec(size_t(K) * M, rng), b = random_vec(size_t(K) * N, rng), old = random_vec(size_t(M) * N, rng);
  Tensor ta = make({K, M}, DType::f32, a), tb = make({K, N}, DType::f32, b), out = make({M, N}, DType::f32, old);
  backend.matmul(out, ta, tb, true, false, alpha, beta);
  Vec want = matmul_ref(a, b, M, N, K, true, false);
  for (size_t i = 0; i < want.size(); ++i) want[i] = alpha * want[i] + beta * old[i];
  check_close(values_of(out), want, kF32Tol, "matmul alpha/beta");
}

TEST_CASE("matmul: bf16 and mixed inputs, bf16 output") {
  std::mt19937 rng(4);
  const int M = 263, N = 19, K = 21;  // M > the 256-row f32 band used for bf16 out
  Vec a = random_vec(size_t(M) * K, rng), b = random_vec(size_t(N) * K, rng), old = random_vec(size_t(M) * N, rng);
  Tensor a_bf16 = make({M, K}, DType::bf16, a), b_f32 = make({N, K}, DType::f32, b);
  Tensor b_bf16 = make({N, K}, DType::bf16, b);
  // The reference multiplies the bf16-rounded inputs, so f32 accumulation is all that differs.
  Vec want = matmul_ref(rounded(a, DType::bf16), rounded(b, DType::f32), M, N, K, false, true);
  Tensor out = make({M, N}, DType::f32);
  backend.matmul(out, a_bf16, b_f32, false, true);
  check_close(values_of(out), want, kF32Tol, "bf16 @ f32 -> f32");

  want = matmul_ref(rounded(a, DType::bf16), rounded(b, DType::bf16), M, N, K, false, true);
  Vec old_bf16 = rounded(old, DType::bf16);
  for (size_t i = 0; i < want.size(); ++i) want[i] = 2.0 * want[i] + 0.5 * old_bf16[i];
  Tensor out_bf16 = make({M, N}, DType::bf16, old);
  backend.matmul(out_bf16, a_bf16, b_bf16, false, true, 2.0f, 0.5f);
  check_close(values_of(out_bf16), want, kBf16Tol, "bf16 @ bf16 -> bf16 with beta");
}

// grad += alpha a^T b over tile and row-block boundaries (128 columns, 64
// rows, 1024 sums per tile): a LoRA A-like shape (17 x 150) and a B-like one
// (300 x 8), bf16 and f32 operands. Against the float64 product (kF32Tol),
// and bit for bit against the contract's own order computed here one element
// at a time; the rows split into blocks and added block after block give
// the same bits as all rows at once (what a GEMM with beta = 1 cannot
// promise: it sums each block on its own first).
TEST_CASE("accumulate_outer_products: row order, so blocks of rows add up to all rows bit for bit") {
  std::mt19937 rng(5);
  struct Size {
    int N, M, P;
  };
  for (const Size& s : {Size{203, 17, 150}, Size{203, 300, 8}})
    for (DType dtype : {DType::f32, DType::bf16}) {
      CAPTURE(s.M);
      CAPTURE(dtype_name(dtype));
      const float alpha = 0.375f;
      Vec a = rounded(random_vec(size_t(s.N) * s.M, rng), dtype), b = random_vec(size_t(s.N) * s.P, rng);
      const Vec old = random_vec(size_t(s.M) * s.P, rng);
      Tensor ta = make({s.N, s.M}, dtype, a), tb = make({s.N, s.P}, DType::f32, b);
      Tensor whole = make({s.M, s.P}, DType::f32, old);
      backend.accumulate_outer_products(whole, ta, tb, alpha);
      Vec want = matmul_ref(a, rounded(b, DType::f32), s.M, s.P, s.N, true, false), in_order(want.size());
      for (size_t e = 0; e < want.size(); ++e) {
        const size_t i = e / size_t(s.P), j = e % size_t(s.P);
        float v = float(old[e]);
        for (size_t n = 0; n < size_t(s.N); ++n)
          v = std::fma(alpha * float(a[n * size_t(s.M) + i]), float(b[n * size_t(s.P) + j]), v);
        in_order[e] = v;
        want[e] = old[e] + alpha * want[e];
      }
      check_close(values_of(whole), want, kF32Tol, "accumulate_outer_products");
      CHECK(values_of(whole) == in_order);
      Tensor blocks = make({s.M, s.P}, DType::f32, old);
      const int bounds[] = {0, 5, 70, s.N};
      for (int k = 0; k < 3; ++k) {
        const int first = bounds[k], rows = bounds[k + 1] - bounds[k];
        backend.accumulate_outer_products(blocks, ta.slice_rows(first, rows), tb.slice_rows(first, rows), alpha);
      }
      CHECK(values_of(blocks) == values_of(whole));
    }
}

// ---- matmul on each CPU GEMM implementation ------------------------------
// The cases above run the default (oneDNN where the build has it); these run
// the reference kernels and oneDNN by name, at a training step's shapes
// (K = 768, several oneDNN blocks), against the same float64 reference with
// the same tolerances: bf16 inputs and their products are exact in f32, so
// bf16 x bf16 with f32 accumulation differs from the reference only in
// summation order (kF32Tol), plus one final rounding for bf16 out (kBf16Tol).

std::vector<CpuGemm> built_gemms() {
  std::vector<CpuGemm> gemms{CpuGemm::reference};
  if (onednn_built()) gemms.push_back(CpuGemm::onednn);
  return gemms;
}

TEST_CASE("matmul: reference and oneDNN GEMMs, f32 and bf16, every transpose, alpha and beta") {
  std::mt19937 rng(21);
  const int M = 131, N = 67, K = 768;
  for (CpuGemm gemm : built_gemms()) {
    CpuBackend chosen(host, gemm);
    REQUIRE(chosen.gemm() == gemm);
    CAPTURE(int(gemm));
    for (DType in : {DType::f32, DType::bf16})
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          CAPTURE(dtype_name(in));
          CAPTURE(ta);
          CAPTURE(tb);
          Vec a = random_vec(size_t(M) * K, rng), b = random_vec(size_t(K) * N, rng);
          Vec old = random_vec(size_t(M) * N, rng);
          Tensor a_t = make(ta ? Shape{K, M} : Shape{M, K}, in, a), b_t = make(tb ? Shape{N, K} : Shape{K, N}, in, b);
          Vec product = matmul_ref(rounded(a, in), rounded(b, in), M, N, K, ta, tb);
          Tensor out = make({M, N}, DType::f32);
          chosen.fill(out, NAN);
          chosen.matmul(out, a_t, b_t, ta, tb, 1.0f, 0.0f);
          check_close(values_of(out), product, kF32Tol, "f32 out, beta = 0");
          for (DType out_dtype : {DType::f32, DType::bf16}) {
            Vec old_rounded = rounded(old, out_dtype), want(product.size());
            for (size_t i = 0; i < want.size(); ++i) want[i] = -0.5 * product[i] + 2.0 * old_rounded[i];
            Tensor acc = make({M, N}, out_dtype, old);
            chosen.matmul(acc, a_t, b_t, ta, tb, -0.5f, 2.0f);
            check_close(values_of(acc), want, out_dtype == DType::f32 ? kF32Tol : kBf16Tol, "alpha and beta");
          }
        }
  }
}

TEST_CASE("FT_CPU_GEMM picks the CPU GEMM and rejects unknown names") {
  setenv("FT_CPU_GEMM", "reference", 1);
  CHECK(default_cpu_gemm() == CpuGemm::reference);
  CHECK(CpuBackend(host).gemm() == CpuGemm::reference);
  setenv("FT_CPU_GEMM", "onednn", 1);
  if (onednn_built())
    CHECK(default_cpu_gemm() == CpuGemm::onednn);
  else
    CHECK_THROWS_AS(CpuBackend{host}, Error);
  setenv("FT_CPU_GEMM", "mkl", 1);
  CHECK_THROWS_WITH_AS(default_cpu_gemm(), doctest::Contains("FT_CPU_GEMM"), Error);
  unsetenv("FT_CPU_GEMM");
}

// ---- elementwise --------------------------------------------------------

TEST_CASE("add, in place") {
  std::mt19937 rng(5);
  Vec a = random_vec(37 * 13, rng), b = random_vec(37 * 13, rng);
  Tensor ta = make({37, 13}, DType::f32, a), tb = make({37, 13}, DType::bf16, b);
  backend.add(ta, ta, tb);
  Vec b_bf16 = rounded(b, DType::bf16), want(a.size());
  for (size_t i = 0; i < a.size(); ++i) want[i] = a[i] + b_bf16[i];
  check_close(values_of(ta), want, kF32Tol, "add");
}

// The contract's draws (kernels/dropout_hash.h) in double: x + (2u - 1) m,
// then statistics of the noise alone, which no hash detail can fake.
TEST_CASE("add_uniform_noise: x + (2u - 1) m in place, uniform in [-m, m), f32 and bf16") {
  const int64_t R = 37, C = 301;
  const float m = 0.0125f;
  std::mt19937 rng(17);
  const Vec x = random_vec(size_t(R * C), rng);
  for (DType dtype : {DType::f32, DType::bf16}) {
    CAPTURE(dtype_name(dtype));
    Tensor t = make({R, C}, dtype, x);
    const Vec before = values_of(t);
    backend.add_uniform_noise(t, m, 99);
    Vec want(before.size()), noise(before.size());
    for (size_t i = 0; i < before.size(); ++i) want[i] = before[i] + (2.0 * hash_uniform(99, i) - 1.0) * m;
    check_close(values_of(t), rounded(want, dtype), dtype == DType::f32 ? 1e-7 : kBf16Tol, "add_uniform_noise");
    if (dtype == DType::bf16) continue;
    const Vec got = values_of(t);
    double max_abs = 0.0, sum = 0.0, inner_half = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
      noise[i] = got[i] - before[i];
      max_abs = std::max(max_abs, std::abs(noise[i]));
      sum += noise[i];
      inner_half += std::abs(noise[i]) < m / 2;
    }
    const double n = double(noise.size());
    CHECK(max_abs <= m * (1 + 1e-6));  // f32 rounding of x + noise at |x| <= 1
    CHECK(max_abs >= 0.999 * m);       // 11137 draws: P(all inside 0.999 m) = 0.999^11137 < 2e-5
    CHECK(std::abs(sum / n) < 4 * m / std::sqrt(3 * n));  // the mean: 0 within 4 standard errors
    CHECK(std::abs(inner_half / n - 0.5) < 0.02);         // half the draws in [-m/2, m/2]
  }
  // Magnitude 0 changes nothing; another seed draws other noise.
  Tensor t = make({R, C}, DType::f32, x), other = make({R, C}, DType::f32, x);
  backend.add_uniform_noise(t, 0.0f, 99);
  CHECK(values_of(t) == rounded(x, DType::f32));
  backend.add_uniform_noise(t, m, 99);
  backend.add_uniform_noise(other, m, 100);
  CHECK(values_of(t) != values_of(other));
  Tensor negative = make({2}, DType::f32);
  CHECK_THROWS_WITH_AS(backend.add_uniform_noise(negative, -1.0f, 1),
                       "add_uniform_noise: magnitude must be finite and >= 0, got -1", Error);
}

TEST_CASE("swiglu forward and backward") {
  std::mt19937 rng(6);
  const int n = 7 * 13;
  Vec gate = random_vec(n, rng, -4.0, 4.0), up = random_vec(n, rng), probe = random_vec(n, rng);
  Tensor tg = make({7, 13}, DType::f32, gate), tu = make({7, 13}, DType::f32, up), out = make({7, 13}, DType::f32);
  backend.swiglu_forward(out, tg, tu);
  Vec want(n);
  for (int i = 0; i < n; ++i) want[i] = silu(gate[i]) * up[i];
  check_close(values_of(out), want, kF32Tol, "swiglu forward");

  Tensor dout = make({7, 13}, DType::f32, probe), dgate = make({7, 13}, DType::f32), dup = make({7, 13}, DType::f32);
  backend.swiglu_backward(dgate, dup, dout, tg, tu);
  auto loss_of_gate = [&](const Vec& g) {
    double sum = 0.0;
    for (int i = 0; i < n; ++i) sum += silu(g[i]) * up[i] * probe[i];
    return sum;
  };
  auto loss_of_up = [&](const Vec& u) {
    double sum = 0.0;
    for (int i = 0; i < n; ++i) sum += silu(gate[i]) * u[i] * probe[i];
    return sum;
  };
  check_close(values_of(dgate), numeric_grad(loss_of_gate, gate), kGradTol, "dgate");
  check_close(values_of(dup), numeric_grad(loss_of_up, up), kGradTol, "dup");
}

// ---- embedding ----------------------------------------------------------

TEST_CASE("embedding forward gathers rows; backward accumulates repeated ids") {
  std::mt19937 rng(7);
  const int V = 11, C = 71;  // C crosses the backward's 64-channel blocks
  std::vector<int32_t> ids = {3, 0, 3, 10, 3, 5, 0, 7, 3};
  const int N = int(ids.size());
  Vec table = random_vec(size_t(V) * C, rng);
  Tensor t_table = make({V, C}, DType::bf16, table), t_ids = make_i32(ids), out = make({N, C}, DType::f32);
  backend.embedding_forward(out, t_ids, t_table);
  Vec table_bf16 = rounded(table, DType::bf16), want(size_t(N) * C);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) want[size_t(n) * C + c] = table_bf16[size_t(ids[n]) * C + c];
  CHECK(values_of(out) == want);  // a gather is exact

  Vec probe = random_vec(size_t(N) * C, rng), prior = random_vec(size_t(V) * C, rng);
  Tensor dout = make({N, C}, DType::f32, probe), dtable = make({V, C}, DType::f32, prior);
  backend.embedding_backward(dtable, t_ids, dout);
  auto loss = [&](const Vec& tab) {
    double sum = 0.0;
    for (int n = 0; n < N; ++n)
      for (int c = 0; c < C; ++c) sum += tab[size_t(ids[n]) * C + c] * probe[size_t(n) * C + c];
    return sum;
  };
  Vec grad = numeric_grad(loss, table_bf16);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] += prior[i];
  check_close(values_of(dtable), grad, kF32Tol, "dtable (+= prior)");

  Tensor bad_ids = make_i32({0, V});
  Tensor out2 = make({2, C}, DType::f32);
  CHECK_THROWS_AS(backend.embedding_forward(out2, bad_ids, t_table), Error);
}

// ---- rmsnorm ------------------------------------------------------------

TEST_CASE("rmsnorm forward matches HF and saves rstd") {
  std::mt19937 rng(8);
  const int N = 7, C = 37;
  const float eps = 1e-5f;
  Vec x = random_vec(size_t(N) * C, rng, -2.0, 2.0), w = random_vec(C, rng, 0.5, 1.5);
  Tensor tx = make({N, C}, DType::f32, x), tw = make({C}, DType::f32, w);
  Tensor out = make({N, C}, DType::f32), rstd = make({N}, DType::f32);
  backend.rmsnorm_forward(out, rstd, tx, tw, eps);
  check_close(values_of(out), rmsnorm_ref(x, w, N, C, eps), kF32Tol, "rmsnorm");
  check_close(values_of(rstd), rmsnorm_rstd_ref(x, N, C, eps), kF32Tol, "rstd");

  // bf16 in and out: HF rounds x * rstd to bf16 before the weight multiply,
  // whose product is rounded again.
  Tensor x_bf16 = make({N, C}, DType::bf16, x), w_bf16 = make({C}, DType::bf16, w);
  Tensor out_bf16 = make({N, C}, DType::bf16);
  backend.rmsnorm_forward(out_bf16, rstd, x_bf16, w_bf16, eps);
  Vec x_rounded = rounded(x, DType::bf16), w_rounded = rounded(w, DType::bf16);
  Vec want_rstd = rmsnorm_rstd_ref(x_rounded, N, C, eps), want(x.size());
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) {
      size_t at = size_t(n) * C + c;
      want[at] = w_rounded[c] * rounded({x_rounded[at] * want_rstd[n]}, DType::bf16)[0];
    }
  check_close(values_of(out_bf16), rounded(want, DType::bf16), kBf16Tol, "rmsnorm bf16");
}

TEST_CASE("rmsnorm backward: finite differences, dweight accumulates") {
  std::mt19937 rng(9);
  const int N = 7, C = 37;
  const float eps = 1e-5f;
  Vec x = random_vec(size_t(N) * C, rng, -2.0, 2.0), w = random_vec(C, rng, 0.5, 1.5);
  Vec probe = random_vec(size_t(N) * C, rng), prior = random_vec(C, rng);
  Tensor tx = make({N, C}, DType::f32, x), tw = make({C}, DType::f32, w);
  Tensor out = make({N, C}, DType::f32), rstd = make({N}, DType::f32);
  backend.rmsnorm_forward(out, rstd, tx, tw, eps);
  Tensor dout = make({N, C}, DType::f32, probe), dx = make({N, C}, DType::f32), dw = make({C}, DType::f32, prior);
  backend.rmsnorm_backward(dx, &dw, dout, tx, tw, rstd);

  Vec want_dx = numeric_grad([&](const Vec& xs) { return dot(rmsnorm_ref(xs, w, N, C, eps), probe); }, x);
  Vec want_dw = numeric_grad([&](const Vec& ws) { return dot(rmsnorm_ref(x, ws, N, C, eps), probe); }, w);
  for (int c = 0; c < C; ++c) want_dw[c] += prior[c];
  check_close(values_of(dx), want_dx, kGradTol, "dx");
  check_close(values_of(dw), want_dw, kGradTol, "dweight (+= prior)");

  Tensor dx_only = make({N, C}, DType::f32);
  backend.rmsnorm_backward(dx_only, nullptr, dout, tx, tw, rstd);
  CHECK(values_of(dx_only) == values_of(dx));
}

// ---- rope ---------------------------------------------------------------

TEST_CASE("rope forward: partial and full rotary_dim, large positions, scaled frequencies") {
  std::mt19937 rng(10);
  const int H = 3, D = 10;
  std::vector<int32_t> pos = {0, 1, 7, 4095, 131071};
  const int N = int(pos.size());
  for (int rotary_dim : {6, 10})
    for (float theta : {10000.0f, 500000.0f, 0.0f}) {
      CAPTURE(rotary_dim);
      CAPTURE(theta);
      // theta 0: frequencies of no single base, as a rope scaling makes them.
      std::vector<float> inv_freq = ft::default_rope_inv_freq(theta > 0 ? theta : 10000.0f, rotary_dim);
      if (theta == 0.0f)
        for (size_t i = 0; i < inv_freq.size(); ++i) inv_freq[i] /= float(1 + 3 * (i % 2));
      Vec x = random_vec(size_t(N) * H * D, rng);
      Tensor tx = make({N, H, D}, DType::f32, x), tpos = make_i32(pos);
      backend.rope_forward(tx, tpos, inv_freq);
      Vec got = values_of(tx);
      check_close(got, rope_ref(x, pos, H, D, inv_freq), kF32Tol, "rope");
      for (int i = 0; i < N * H * D; ++i) {
        bool untouched = i % D >= rotary_dim || i < H * D;  // features past rotary_dim, and position 0
        if (untouched) REQUIRE(got[i] == float(x[i]));
      }
    }
}

TEST_CASE("rope backward is the transpose rotation (finite differences)") {
  std::mt19937 rng(11);
  const int H = 2, D = 12, rotary_dim = 8;
  const std::vector<float> inv_freq = ft::default_rope_inv_freq(10000.0f, rotary_dim);
  std::vector<int32_t> pos = {0, 3, 17, 1000, 29};
  const int N = int(pos.size());
  Vec x = random_vec(size_t(N) * H * D, rng), probe = random_vec(size_t(N) * H * D, rng);
  Tensor grad = make({N, H, D}, DType::f32, probe), tpos = make_i32(pos);
  backend.rope_backward(grad, tpos, inv_freq);
  Vec want = numeric_grad([&](const Vec& xs) { return dot(rope_ref(xs, pos, H, D, inv_freq), probe); }, x);
  check_close(values_of(grad), want, kGradTol, "rope dx");

  Tensor tx = make({N, H, D}, DType::f32, x);
  backend.rope_forward(tx, tpos, inv_freq);
  backend.rope_backward(tx, tpos, inv_freq);
  check_close(values_of(tx), x, kF32Tol, "rope backward(forward(x))");
}

// ---- attention ----------------------------------------------------------

// The attention's bf16 tile GEMM (kernels/cpu/bf16_tile.h), as dispatched
// (AMX or vdpbf16ps where the CPU has them), as its portable loop and as the
// AMX kernel on its modelled instructions (kernels/cpu/amx_tile.h), against
// float64 sums of the same bf16 values: products of two bf16 are exact in
// f32, so only the f32 sums of at most 70 O(1) terms round, well within
// kF32Tol. The shapes take AMX's 16 x 16 blocks whole (loaded in place) and
// cut at each edge (padded copies).
TEST_CASE("bf16 tile GEMM, dispatched, portable and on emulated AMX, against float64") {
  std::mt19937 rng(21);
  struct GemmShape {
    int64_t M, N, pairs;
  };
  enum class Kernel { dispatched, portable, amx_emulated };
  for (GemmShape g : {GemmShape{1, 1, 1}, GemmShape{5, 37, 3}, GemmShape{33, 64, 19}, GemmShape{4, 16, 32},
                      GemmShape{32, 48, 35}, GemmShape{16, 16, 16}, GemmShape{17, 15, 16}})
    for (Kernel kernel : {Kernel::dispatched, Kernel::portable, Kernel::amx_emulated}) {
      CAPTURE(g.M);
      CAPTURE(g.N);
      CAPTURE(g.pairs);
      CAPTURE(int(kernel));
      const int64_t K = 2 * g.pairs, lda = g.pairs + 1, ldb = g.N + 3, ldc = g.N + 2;  // padded rows
      const Vec a = rounded(random_vec(size_t(g.M * K), rng), DType::bf16);
      const Vec b = rounded(random_vec(size_t(K * g.N), rng), DType::bf16);
      const Vec c0 = random_vec(size_t(g.M * ldc), rng);
      std::vector<uint32_t> a_pairs(size_t(g.M * lda)), b_pairs(size_t(g.pairs * ldb));
      auto bits = [](double x) { return uint32_t(f32_to_bf16(float(x))); };
      for (int64_t m = 0; m < g.M; ++m)
        for (int64_t p = 0; p < g.pairs; ++p)
          a_pairs[size_t(m * lda + p)] = bits(a[size_t(m * K + 2 * p)]) | bits(a[size_t(m * K + 2 * p + 1)]) << 16;
      for (int64_t p = 0; p < g.pairs; ++p)
        for (int64_t n = 0; n < g.N; ++n)
          b_pairs[size_t(p * ldb + n)] = bits(b[size_t(2 * p * g.N + n)]) | bits(b[size_t((2 * p + 1) * g.N + n)]) << 16;
      std::vector<float> c(c0.begin(), c0.end());
      Vec want = c0;
      for (int64_t m = 0; m < g.M; ++m)
        for (int64_t n = 0; n < g.N; ++n)
          for (int64_t k = 0; k < K; ++k) want[size_t(m * ldc + n)] += a[size_t(m * K + k)] * b[size_t(k * g.N + n)];
      if (kernel == Kernel::portable) {
        cpu::bf16_tile_gemm_portable(c.data(), ldc, a_pairs.data(), lda, b_pairs.data(), ldb, g.M, g.N, g.pairs);
      } else if (kernel == Kernel::amx_emulated) {
        cpu::amx_configure(cpu::AmxTiles::emulated);
        cpu::amx_tile_gemm(cpu::AmxTiles::emulated, c.data(), ldc, a_pairs.data(), lda, b_pairs.data(), ldb, g.M,
                           g.N, g.pairs);
        cpu::amx_release(cpu::AmxTiles::emulated);
      } else {
        const cpu::Bf16TileScope tiles;
        cpu::bf16_tile_gemm(c.data(), ldc, a_pairs.data(), lda, b_pairs.data(), ldb, g.M, g.N, g.pairs);
      }
      check_close(Vec(c.begin(), c.end()), want, kF32Tol, "bf16 tile GEMM");  // columns past N untouched too
    }
}

// The CPU kernels' vector exp (kernels/cpu/vec_exp.h) against exp in
// float64: within 2 ulp over the range it computes, 0 below it (a softmax's
// -inf), +inf above, NaN kept; an element's value the same in a vector lane
// and in the scalar tail (a row's softmax must not depend on its alignment).
TEST_CASE("cpu vector exp: within 2 ulp of exp in float64, its limits, the same in every lane") {
  std::vector<float> x;
  for (double v = -87.3; v <= 88.7; v += 0.0037) x.push_back(float(v));
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 0.34657359f, -0.34657359f, 1.0f, -1.0f, -87.33f, 88.72f})
    x.push_back(v);
  std::vector<float> y = x;
  cpu::exp_inplace(y.data(), int64_t(y.size()));
  double worst_ulp = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp(double(x[i]));
    const double ulp = double(std::nextafter(float(want), INFINITY)) - double(float(want));
    worst_ulp = std::max(worst_ulp, std::abs(double(y[i]) - want) / ulp);
  }
  MESSAGE("cpu vector exp: worst ", worst_ulp, " ulp over ", x.size(), " values in [-87.3, 88.7]");
  CHECK(worst_ulp <= 2.0);
  std::vector<float> limits = {-87.4f, -100.0f, -INFINITY, 88.8f, INFINITY, NAN, -1.0f, 2.0f, 0.5f};
  cpu::exp_inplace(limits.data(), int64_t(limits.size()));
  CHECK(limits[0] == 0.0f);
  CHECK(limits[1] == 0.0f);
  CHECK(limits[2] == 0.0f);
  CHECK(limits[3] == INFINITY);
  CHECK(limits[4] == INFINITY);
  CHECK(std::isnan(limits[5]));
  // The same values starting at every lane, through 16-lane vectors (where
  // the CPU has AVX-512), 8-lane ones and the scalar tail: 45 = 32 + 8 + 5.
  for (size_t offset = 1; offset < 17; ++offset) {
    CAPTURE(offset);
    std::vector<float> shifted(x.begin() + int64_t(offset), x.begin() + int64_t(offset) + 45);
    cpu::exp_inplace(shifted.data(), int64_t(shifted.size()));
    CHECK(std::equal(shifted.begin(), shifted.end(), y.begin() + int64_t(offset)));
    CHECK(cpu::exp1(x[offset]) == y[offset]);
  }
}

// Every op with an AVX-512 version (kernels/cpu/isa.h) gives the baseline
// version's bits, so a run's numbers do not depend on the machine's vector
// width: 301 columns are whole 16- and 8-lane vectors and a tail; f32 and
// bf16; the INT8 linear with an outlier column, bias and LoRA; attention
// over 137 tokens (partial query and key tiles) of 40-wide heads (partial
// column blocks).
TEST_CASE("AVX-512 and baseline versions of the CPU kernels give the same bits" *
          doctest::skip(!cpu::avx512_enabled())) {
  const int64_t N = 37, K = 301, O = 67, r = 5;
  std::mt19937 rng(40);
  Vec xs = random_vec(size_t(N * K), rng, -3.0, 3.0), ys = random_vec(size_t(N * K), rng, -3.0, 3.0);
  xs[size_t(5 * K + 17)] = 7.5;  // an outlier column at threshold 6
  const Vec w = random_vec(size_t(O * K), rng, -0.1, 0.1), dout_values = random_vec(size_t(N * O), rng);
  const Vec h_values = random_vec(size_t(N * r), rng), B_values = random_vec(size_t(O * r), rng, -0.1, 0.1);
  const Vec bias_values = random_vec(size_t(O), rng), outer_b = random_vec(size_t(N * O), rng);
  const int64_t T = 137, Hq = 4, Hkv = 2, D = 40;
  const Vec aq = random_vec(size_t(T * Hq * D), rng, -2.0, 2.0), ado = random_vec(size_t(T * Hq * D), rng);
  const Vec ak = random_vec(size_t(T * Hkv * D), rng, -2.0, 2.0), av = random_vec(size_t(T * Hkv * D), rng);
  CpuBackend reference_gemm(host, CpuGemm::reference);
  auto outputs = [&](bool baseline) {
    cpu::set_baseline_versions_only(baseline);
    std::vector<Vec> all;
    for (DType dtype : {DType::f32, DType::bf16}) {
      Tensor x = make({N, K}, dtype, xs), y = make({N, K}, dtype, ys), out = make({N, K}, dtype);
      Tensor dx = make({N, K}, dtype), dy = make({N, K}, dtype);
      backend.add(out, x, y);
      all.push_back(values_of(out));
      backend.swiglu_forward(out, x, y);
      all.push_back(values_of(out));
      backend.swiglu_backward(dx, dy, out, x, y);
      all.push_back(values_of(dx));
      all.push_back(values_of(dy));
      backend.dropout_forward(out, x, 0.1f, 99);
      all.push_back(values_of(out));
      backend.dropout_backward(dx, y, 0.1f, 99);
      all.push_back(values_of(dx));
      backend.add_uniform_noise(dx, 0.25f, 7);
      all.push_back(values_of(dx));
      Tensor sums = make({K, O}, DType::f32, Vec(size_t(K * O), 0.5));
      backend.accumulate_outer_products(sums, x, make({N, O}, DType::f32, outer_b), 0.375f);
      all.push_back(values_of(sums));
      Tensor q = make({O, K}, DType::i8), scales = make({O}, DType::f32), absmax = make({N}, DType::f32);
      backend.quantize_rows_int8(q, scales, make({O, K}, dtype, w));
      all.push_back(values_of(q));
      all.push_back(values_of(scales));
      backend.int8_row_absmax(absmax, x, 6.0f);
      all.push_back(values_of(absmax));
      Tensor bias = make({O}, dtype, bias_values), h = make({N, r}, dtype, h_values), B = make({O, r}, dtype, B_values);
      Tensor linear = make({N, O}, dtype);
      backend.int8_linear_forward(linear, x, q, scales, 6.0f, Int8Epilogue{&bias, &h, &B, 3.2f});
      all.push_back(values_of(linear));
      reference_gemm.int8_linear_forward(linear, x, q, scales, 6.0f, Int8Epilogue{&bias, &h, &B, 3.2f});
      all.push_back(values_of(linear));  // the int16 dot tiles
      backend.int8_linear_backward(dx, make({N, O}, dtype, dout_values), q, scales, true);
      all.push_back(values_of(dx));
      Tensor tq = make({1, T, Hq, D}, dtype, aq), tk = make({1, T, Hkv, D}, dtype, ak);
      Tensor tv = make({1, T, Hkv, D}, dtype, av), attn = make({1, T, Hq, D}, dtype), lse = make({1, Hq, T}, DType::f32);
      backend.attention_forward(attn, lse, tq, tk, tv, 0.158f, 0);
      all.push_back(values_of(attn));
      all.push_back(values_of(lse));
      Tensor dq = make({1, T, Hq, D}, dtype), dk = make({1, T, Hkv, D}, dtype), dv = make({1, T, Hkv, D}, dtype);
      backend.attention_backward(dq, dk, dv, make({1, T, Hq, D}, dtype, ado), tq, tk, tv, attn, lse, 0.158f, 0);
      all.push_back(values_of(dq));
      all.push_back(values_of(dk));
      all.push_back(values_of(dv));
    }
    std::vector<float> e(xs.begin(), xs.end());
    cpu::exp_inplace(e.data(), int64_t(e.size()));
    all.push_back(Vec(e.begin(), e.end()));
    cpu::set_baseline_versions_only(false);
    return all;
  };
  const std::vector<Vec> avx512 = outputs(false), baseline = outputs(true);
  REQUIRE(avx512.size() == baseline.size());
  for (size_t i = 0; i < avx512.size(); ++i) {
    CAPTURE(i);
    CHECK(avx512[i] == baseline[i]);
  }
}

// tests/CMakeLists.txt runs this file again under ONEDNN_MAX_CPU_ISA=AVX2
// and =AVX512_CORE: the versions picked must follow the cap (with oneDNN in
// the build, which reads it) and the CPU.
TEST_CASE("ONEDNN_MAX_CPU_ISA caps the CPU kernels' versions as it caps oneDNN's") {
  const bool v4 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
                  __builtin_cpu_supports("avx512vl");
  const bool bf16 = v4 && __builtin_cpu_supports("avx512bf16");
  const char* env = std::getenv("ONEDNN_MAX_CPU_ISA");
  const std::string cap = env && onednn_built() ? env : "";
  CAPTURE(cap);
  if (cap == "AVX2") {
    CHECK_FALSE(cpu::avx512_enabled());
    CHECK_FALSE(cpu::avx512_bf16_enabled());
    CHECK_FALSE(cpu::amx_bf16_enabled());
  } else if (cap == "AVX512_CORE") {
    CHECK(cpu::avx512_enabled() == v4);
    CHECK_FALSE(cpu::avx512_bf16_enabled());
    CHECK_FALSE(cpu::amx_bf16_enabled());
  } else {
    REQUIRE(cap.empty());  // a cap this test does not know
    CHECK(cpu::avx512_enabled() == v4);
    CHECK(cpu::avx512_bf16_enabled() == bf16);
    if (!bf16) CHECK_FALSE(cpu::amx_bf16_enabled());  // every AMX CPU has AVX512-BF16
  }
  // FT_BF16_TILES=amx-emulated (tests/CMakeLists.txt's _amx_emulated runs)
  // puts the bf16 tiles on the modelled AMX whatever the CPU and the cap.
  const char* tiles = std::getenv("FT_BF16_TILES");
  CHECK(cpu::amx_emulated() == (tiles != nullptr));
  const std::string tiles_isa = cpu::bf16_tiles_isa();
  if (tiles)
    CHECK(tiles_isa == "AMX (emulated)");
  else
    CHECK(tiles_isa == (cpu::amx_bf16_enabled() ? "AMX" : cpu::avx512_bf16_enabled() ? "AVX512-BF16" : build_isa()));
}

// The modelled TDPBF16PS keeps the two rules of Intel's definition that
// make AMX's sums differ from plain f32 arithmetic near zero: a denormal bf16
// input reads as zero, and a sum that lands below the smallest normal f32 is
// flushed to zero (the f32 results here are exact otherwise). And like the
// hardware it refuses tile instructions before LDTILECFG or after
// TILERELEASE, which the kernel leaves to its caller.
TEST_CASE("emulated AMX: denormal inputs read as zero, denormal sums flushed, no product unconfigured") {
  const cpu::AmxTiles emulated = cpu::AmxTiles::emulated;
  const float min_normal = std::ldexp(1.0f, -126);
  const uint32_t denormal_pair = 0x0001u;  // (the smallest denormal bf16, 0)
  const uint32_t big = cpu::bf16_pair(std::ldexp(1.0f, 100), 0.0f);
  const uint32_t minus_min = cpu::bf16_pair(-min_normal, 0.0f), one = cpu::bf16_pair(1.0f, 0.0f);
  float c = 0.0f;
  cpu::amx_configure(emulated);
  cpu::amx_tile_gemm(emulated, &c, 1, &denormal_pair, 1, &big, 1, 1, 1, 1);
  CHECK(c == 0.0f);  // 2^-133 x 2^100 = 2^-33 without the rule
  c = 1.5f * min_normal;
  cpu::amx_tile_gemm(emulated, &c, 1, &minus_min, 1, &one, 1, 1, 1, 1);
  CHECK(c == 0.0f);  // 0.5 x 2^-126 without the rule
  c = 2.0f * min_normal;
  cpu::amx_tile_gemm(emulated, &c, 1, &minus_min, 1, &one, 1, 1, 1, 1);
  CHECK(c == min_normal);  // a normal sum is kept
  cpu::amx_release(emulated);
  CHECK_THROWS_AS(cpu::amx_tile_gemm(emulated, &c, 1, &one, 1, &one, 1, 1, 1, 1), Error);
}

// T = 70 spans three query tiles and two key tiles of the CPU kernel.
TEST_CASE("attention forward: GQA and MHA, T not a multiple of 8, sliding windows") {
  std::mt19937 rng(12);
  for (AttnShape s : {AttnShape{2, 13, 6, 2, 8}, AttnShape{1, 11, 3, 3, 5}, AttnShape{2, 13, 6, 2, 8, 4},
                      AttnShape{1, 11, 3, 3, 5, 1}, AttnShape{1, 11, 3, 3, 5, 11}, AttnShape{1, 70, 2, 1, 4},
                      AttnShape{1, 70, 2, 1, 4, 40}})
    for (DType dtype : {DType::f32, DType::bf16}) {
      CAPTURE(s.Hq);
      CAPTURE(s.Hkv);
      CAPTURE(s.window);
      CAPTURE(dtype_name(dtype));
      Vec q = random_vec(size_t(s.B) * s.T * s.Hq * s.D, rng, -2.0, 2.0);
      Vec k = random_vec(size_t(s.B) * s.T * s.Hkv * s.D, rng, -2.0, 2.0);
      Vec v = random_vec(size_t(s.B) * s.T * s.Hkv * s.D, rng);
      Tensor tq = make({s.B, s.T, s.Hq, s.D}, dtype, q), tk = make({s.B, s.T, s.Hkv, s.D}, dtype, k);
      Tensor tv = make({s.B, s.T, s.Hkv, s.D}, dtype, v);
      Tensor out = make({s.B, s.T, s.Hq, s.D}, dtype), lse = make({s.B, s.Hq, s.T}, DType::f32);
      double scale = 1.0 / std::sqrt(double(s.D));
      backend.attention_forward(out, lse, tq, tk, tv, float(scale), s.window);
      Vec want_out, want_lse;
      attention_ref(rounded(q, dtype), rounded(k, dtype), rounded(v, dtype), s, scale, want_out, want_lse);
      double tol = dtype == DType::f32 ? kF32Tol : kBf16Tol;
      check_close(values_of(out), want_out, tol, "attention out");
      check_close(values_of(lse), want_lse, kF32Tol, "attention lse");
    }
}

// bf16 attention gradients: the kernel rounds P and dS to bf16 (2^-9
// relative each) as operands of dV = P^T dO, dQ = dS K and dK = dS^T Q, and
// the results once more when stored. Each gradient element is a sum of
// terms whose absolute values add up to a few times the element's own size
// here (inputs in [-2, 2], softmax weights summing to 1), so 2^-9 of that sum
// plus 2^-9 of the result stays under 1.5e-2 relative: worst seen 4.4e-3.
constexpr double kBf16GradTol = 1.5e-2;

TEST_CASE("attention backward: finite differences for dq, dk, dv, f32 and bf16") {
  std::mt19937 rng(13);
  for (AttnShape s : {AttnShape{2, 13, 6, 2, 8}, AttnShape{1, 11, 3, 3, 5}, AttnShape{2, 13, 6, 2, 8, 3},
                      AttnShape{1, 70, 2, 1, 3}, AttnShape{1, 70, 2, 1, 3, 5}})
    for (DType dtype : {DType::f32, DType::bf16}) {
      CAPTURE(s.Hq);
      CAPTURE(s.Hkv);
      CAPTURE(s.window);
      CAPTURE(dtype_name(dtype));
      // What the kernel reads: the values rounded to dtype.
      Vec q = rounded(random_vec(size_t(s.B) * s.T * s.Hq * s.D, rng, -2.0, 2.0), dtype);
      Vec k = rounded(random_vec(size_t(s.B) * s.T * s.Hkv * s.D, rng, -2.0, 2.0), dtype);
      Vec v = rounded(random_vec(size_t(s.B) * s.T * s.Hkv * s.D, rng), dtype);
      Vec probe = rounded(random_vec(q.size(), rng), dtype);
      Shape q_shape = {s.B, s.T, s.Hq, s.D}, kv_shape = {s.B, s.T, s.Hkv, s.D};
      Tensor tq = make(q_shape, dtype, q), tk = make(kv_shape, dtype, k), tv = make(kv_shape, dtype, v);
      Tensor out = make(q_shape, dtype), lse = make({s.B, s.Hq, s.T}, DType::f32);
      double scale = 1.0 / std::sqrt(double(s.D));
      backend.attention_forward(out, lse, tq, tk, tv, float(scale), s.window);
      Tensor dout = make(q_shape, dtype, probe);
      Tensor dq = make(q_shape, dtype), dk = make(kv_shape, dtype), dv = make(kv_shape, dtype);
      backend.fill(dk, NAN);  // overwritten, never accumulated into
      backend.attention_backward(dq, dk, dv, dout, tq, tk, tv, out, lse, float(scale), s.window);

      auto loss = [&](const Vec& qs, const Vec& ks, const Vec& vs) {
        Vec o, l;
        attention_ref(qs, ks, vs, s, scale, o, l);
        return dot(o, probe);
      };
      const double tol = dtype == DType::f32 ? kGradTol : kBf16GradTol;
      check_close(values_of(dq), numeric_grad([&](const Vec& x) { return loss(x, k, v); }, q), tol, "dq");
      check_close(values_of(dk), numeric_grad([&](const Vec& x) { return loss(q, x, v); }, k), tol, "dk");
      check_close(values_of(dv), numeric_grad([&](const Vec& x) { return loss(q, k, x); }, v), tol, "dv");
    }
}

// Columns [first, first + D) of each head row of rows [B, T, H, P], as [B, T, H, D] values.
Vec view_values(const HeadsView& x) {
  Vec all = values_of(x.rows), out;
  for (int64_t r = 0; r < x.rows.rows(); ++r)
    for (int64_t d = 0; d < x.width; ++d) out.push_back(all[size_t(x.offset(r) + d)]);
  return out;
}

// GPT-NeoX's layout: q, k and v read in place as column windows of one
// [B, T, H, 3D] tensor, dq, dk and dv written into one. Only the addressing
// differs from contiguous operands, so every value must be equal bit for bit,
// and no column outside the views may change. The grouped-query case reads q
// at an odd column of a wider row and k and v from separate tensors.
TEST_CASE("attention and rope on head views equal contiguous operands bit for bit") {
  std::mt19937 rng(14);
  struct ViewCase {
    AttnShape s;
    bool fused;  // q, k, v (and dq, dk, dv) in one [B, T, H, 3D] tensor
  };
  for (ViewCase c : {ViewCase{{2, 13, 3, 3, 8}, true}, ViewCase{{1, 70, 2, 2, 6, 9}, true},
                     ViewCase{{2, 13, 6, 2, 8}, false}})
    for (DType dtype : {DType::f32, DType::bf16}) {
      const AttnShape& s = c.s;
      CAPTURE(s.Hq);
      CAPTURE(s.window);
      CAPTURE(dtype_name(dtype));
      const int64_t B = s.B, T = s.T, D = s.D;
      auto random_rows = [&](int64_t heads, int64_t pitch) {
        return make({B, T, heads, pitch}, dtype, random_vec(size_t(B * T * heads * pitch), rng, -2.0, 2.0));
      };
      HeadsView q, k, v, dq, dk, dv;
      if (c.fused) {
        Tensor qkv = random_rows(s.Hq, 3 * D), dqkv = make(qkv.shape, dtype);
        q = {qkv, 0, D}, k = {qkv, D, D}, v = {qkv, 2 * D, D};
        dq = {dqkv, 0, D}, dk = {dqkv, D, D}, dv = {dqkv, 2 * D, D};
      } else {
        q = {random_rows(s.Hq, 2 * D + 3), D + 1, D}, k = random_rows(s.Hkv, D), v = {random_rows(s.Hkv, 2 * D), D, D};
        dq = {make({B, T, s.Hq, 2 * D + 3}, dtype), D + 1, D}, dk = make({B, T, s.Hkv, D}, dtype);
        dv = {make({B, T, s.Hkv, 2 * D}, dtype), 0, D};
      }
      for (HeadsView* grad : {&dq, &dk, &dv}) backend.fill(grad->rows, NAN);
      const Vec q_fused_before = values_of(q.rows);
      Tensor tq = make({B, T, s.Hq, D}, dtype, view_values(q)), tk = make({B, T, s.Hkv, D}, dtype, view_values(k));
      Tensor tv = make({B, T, s.Hkv, D}, dtype, view_values(v));

      const std::vector<int32_t> pos_values = [&] {
        std::vector<int32_t> p(size_t(B * T));
        for (size_t i = 0; i < p.size(); ++i) p[i] = int32_t(i % size_t(T)) * 7;
        return p;
      }();
      const Tensor pos = make_i32(pos_values);
      const std::vector<float> inv_freq = ft::default_rope_inv_freq(10000.0f, 4);  // partial rotary
      for (auto [view, contiguous] : {std::pair{&q, &tq}, std::pair{&k, &tk}}) {
        backend.rope_forward(*view, pos, inv_freq);
        backend.rope_forward(*contiguous, pos, inv_freq);
        CHECK(view_values(*view) == values_of(*contiguous));
      }
      if (!c.fused) {  // q's row outside its columns is untouched
        const Vec after = values_of(q.rows);
        for (int64_t r = 0; r < q.rows.rows(); ++r)
          for (int64_t col = 0; col < q.pitch(); ++col)
            if (col < q.first_column || col >= q.first_column + D)
              REQUIRE(after[size_t(r * q.pitch() + col)] == q_fused_before[size_t(r * q.pitch() + col)]);
      }

      const float scale = 1.0f / std::sqrt(float(D));
      Tensor out = make({B, T, s.Hq, D}, dtype), lse = make({B, s.Hq, T}, DType::f32);
      Tensor want_out = make(out.shape, dtype), want_lse = make(lse.shape, DType::f32);
      backend.attention_forward(out, lse, q, k, v, scale, s.window);
      backend.attention_forward(want_out, want_lse, tq, tk, tv, scale, s.window);
      CHECK(values_of(out) == values_of(want_out));
      CHECK(values_of(lse) == values_of(want_lse));

      Tensor dout = make(out.shape, dtype, random_vec(size_t(out.numel()), rng));
      Tensor want_dq = make(tq.shape, dtype), want_dk = make(tk.shape, dtype), want_dv = make(tv.shape, dtype);
      backend.attention_backward(dq, dk, dv, dout, q, k, v, out, lse, scale, s.window);
      backend.attention_backward(want_dq, want_dk, want_dv, dout, tq, tk, tv, out, lse, scale, s.window);
      backend.rope_backward(dq, pos, inv_freq);
      backend.rope_backward(want_dq, pos, inv_freq);
      CHECK(view_values(dq) == values_of(want_dq));
      CHECK(view_values(dk) == values_of(want_dk));
      CHECK(view_values(dv) == values_of(want_dv));
      // The views wrote their columns and nothing else: NaN exactly outside them.
      for (const HeadsView* grad : {&dq, &dk, &dv}) {
        const Vec all = values_of(grad->rows);
        size_t written = 0;
        for (double x : all) written += std::isnan(x) ? 0 : 1;
        const size_t views_here = c.fused ? 3 : 1;
        CHECK(written == views_here * size_t(grad->rows.rows() * D));
      }
    }
}

// Padding-free packing: rows of several sequences (cu_seqlens) must give each
// sequence exactly what it gets alone in a row of its own length -- the
// kernel runs each one from its first token with the same tiles -- so the
// comparison is bit for bit, forward and backward, GQA and windows included.
// Lengths cross the CPU kernel's 32-query and 64-key tiles.
TEST_CASE("attention over packed sequences equals each sequence alone, bit for bit") {
  std::mt19937 rng(16);
  struct PackedCase {
    int64_t Hq, Hkv, D, window;
    std::vector<std::vector<int64_t>> rows;  // each row's sequence lengths
  };
  for (const PackedCase& c : {PackedCase{6, 2, 8, 0, {{5, 1, 7}, {13}}}, PackedCase{2, 1, 4, 0, {{33, 70, 1}}},
                              PackedCase{3, 3, 5, 4, {{9, 2, 11}, {1, 21}}}, PackedCase{4, 2, 6, 40, {{100, 35}}}})
    for (DType dtype : {DType::f32, DType::bf16}) {
      CAPTURE(c.window);
      CAPTURE(dtype_name(dtype));
      const int64_t B = int64_t(c.rows.size()), D = c.D;
      int64_t T = 0;
      for (const auto& row : c.rows) {
        int64_t sum = 0;
        for (int64_t len : row) sum += len;
        T = std::max(T, sum);
      }
      std::vector<int32_t> cu = {0};
      for (int64_t b = 0; b < B; ++b) {  // a short row ends in one more sequence: its padding
        int64_t t = 0;
        for (int64_t len : c.rows[size_t(b)]) cu.push_back(int32_t(b * T + (t += len)));
        if (t < T) cu.push_back(int32_t((b + 1) * T));
      }
      const Shape q_shape = {B, T, c.Hq, D}, kv_shape = {B, T, c.Hkv, D};
      Tensor q = make(q_shape, dtype, random_vec(size_t(B * T * c.Hq * D), rng, -2.0, 2.0));
      Tensor k = make(kv_shape, dtype, random_vec(size_t(B * T * c.Hkv * D), rng, -2.0, 2.0));
      Tensor v = make(kv_shape, dtype, random_vec(size_t(B * T * c.Hkv * D), rng));
      Tensor dout = make(q_shape, dtype, random_vec(size_t(B * T * c.Hq * D), rng));
      Tensor cu_seqlens = make_i32(cu);
      const float scale = 1.0f / std::sqrt(float(D));
      Tensor out = make(q_shape, dtype), lse = make({B, c.Hq, T}, DType::f32);
      Tensor dq = make(q_shape, dtype), dk = make(kv_shape, dtype), dv = make(kv_shape, dtype);
      backend.attention_forward(out, lse, q, k, v, scale, c.window, &cu_seqlens);
      backend.attention_backward(dq, dk, dv, dout, q, k, v, out, lse, scale, c.window, &cu_seqlens);
      const Vec packed[] = {values_of(out), values_of(lse), values_of(dq), values_of(dk), values_of(dv)};
      for (size_t s = 0; s + 1 < cu.size(); ++s) {
        const int64_t b = cu[s] / T, t0 = cu[s] - b * T, L = cu[s + 1] - cu[s];
        auto alone = [&](const Tensor& x) {  // rows [t0, t0 + L) of batch row b, as [1, L, H, D]
          Tensor row = x.slice_rows(b, 1).reshaped({T, x.dim(2), D}).slice_rows(t0, L);
          return make({1, L, x.dim(2), D}, dtype, values_of(row));
        };
        Tensor aq = alone(q), ak = alone(k), av = alone(v), adout = alone(dout);
        Tensor aout = make(aq.shape, dtype), alse = make({1, c.Hq, L}, DType::f32);
        Tensor adq = make(aq.shape, dtype), adk = make(ak.shape, dtype), adv = make(av.shape, dtype);
        backend.attention_forward(aout, alse, aq, ak, av, scale, c.window);
        backend.attention_backward(adq, adk, adv, adout, aq, ak, av, aout, alse, scale, c.window);
        // The packed results at the sequence's tokens ([B, T, H, D] element offsets; lse [B, H, T]).
        auto rows_of = [&](const Vec& all, int64_t heads) {
          return Vec(all.begin() + (b * T + t0) * heads * D, all.begin() + (b * T + t0 + L) * heads * D);
        };
        CAPTURE(s);
        CHECK(rows_of(packed[0], c.Hq) == values_of(aout));
        CHECK(rows_of(packed[2], c.Hq) == values_of(adq));
        CHECK(rows_of(packed[3], c.Hkv) == values_of(adk));
        CHECK(rows_of(packed[4], c.Hkv) == values_of(adv));
        const Vec alone_lse = values_of(alse);
        for (int64_t h = 0; h < c.Hq; ++h)
          for (int64_t t = 0; t < L; ++t)
            REQUIRE(packed[1][size_t((b * c.Hq + h) * T + t0 + t)] == alone_lse[size_t(h * L + t)]);
      }
    }
}

TEST_CASE("attention refuses cu_seqlens that do not tile its rows") {
  Tensor q = make({2, 4, 1, 4}, DType::f32), out = make({2, 4, 1, 4}, DType::f32), lse = make({2, 1, 4}, DType::f32);
  backend.fill(q, 0.5f);
  auto refuse = [&](const std::vector<int32_t>& cu, const char* says) {
    Tensor cu_seqlens = make_i32(cu);
    CHECK_THROWS_WITH_AS(backend.attention_forward(out, lse, q, q, q, 1.0f, 0, &cu_seqlens), doctest::Contains(says),
                         Error);
  };
  refuse({0, 2, 6, 8}, "crosses the row start 4");
  refuse({0, 4, 4, 8}, "must increase strictly");
  refuse({0, 4, 7}, "must run from 0 to B * T = 8");
  refuse({1, 4, 8}, "must run from 0 to B * T = 8");
  refuse({0, 8}, "i32 [S + 1] with 2 <= S <= 8");
  Tensor f32_offsets = make({3}, DType::f32);
  CHECK_THROWS_WITH_AS(backend.attention_forward(out, lse, q, q, q, 1.0f, 0, &f32_offsets),
                       doctest::Contains("cu_seqlens"), Error);
  Tensor fine = make_i32({0, 1, 4, 6, 8});
  backend.attention_forward(out, lse, q, q, q, 1.0f, 0, &fine);
}

TEST_CASE("attention refuses head views out of their rows and gradients that overlap") {
  Tensor qkv = make({1, 3, 2, 24}, DType::f32), dqkv = make({1, 3, 2, 24}, DType::f32);
  Tensor out = make({1, 3, 2, 8}, DType::f32), lse = make({1, 2, 3}, DType::f32);
  const HeadsView q(qkv, 0, 8), k(qkv, 8, 8), v(qkv, 16, 8);
  backend.fill(qkv, 0.5f);
  CHECK_THROWS_WITH_AS(backend.attention_forward(out, lse, q, k, HeadsView(qkv, 17, 8), 1.0f, 0),
                       doctest::Contains("v must be columns [c, c + D)"), Error);
  CHECK_THROWS_AS(backend.attention_forward(out, lse, q, k, HeadsView(qkv, -1, 8), 1.0f, 0), Error);
  CHECK_THROWS_AS(backend.attention_forward(out, lse, q, k, HeadsView(qkv, 16, 0), 1.0f, 0), Error);
  backend.attention_forward(out, lse, q, k, v, 1.0f, 0);
  CHECK_THROWS_WITH_AS(backend.attention_backward(HeadsView(dqkv, 0, 8), HeadsView(dqkv, 4, 8), HeadsView(dqkv, 16, 8),
                                                  out, q, k, v, out, lse, 1.0f, 0),
                       doctest::Contains("dq, dk and dv must not overlap"), Error);
  CHECK_THROWS_WITH_AS(backend.attention_backward(HeadsView(qkv, 0, 8), HeadsView(dqkv, 8, 8), HeadsView(dqkv, 16, 8),
                                                  out, q, k, v, out, lse, 1.0f, 0),
                       doctest::Contains("dq must not share memory with an input"), Error);
}

// ---- cross entropy ------------------------------------------------------

TEST_CASE("cross entropy: ignored rows, gradient, dlogits aliasing logits") {
  std::mt19937 rng(14);
  const int V = 37;
  std::vector<int32_t> targets = {5, -100, 0, 36, -100, 12, 12};
  const int N = int(targets.size()), counted = 5;
  const float dloss = 1.0f / counted;
  Vec logits = random_vec(size_t(N) * V, rng, -4.0, 4.0);
  logits[2 * V] = 40.0;  // a dominant logit: stability needs the max subtracted
  Tensor tl = make({N, V}, DType::f32, logits), tt = make_i32(targets);
  Tensor losses = make({N}, DType::f32), dlogits = make({N, V}, DType::f32);
  backend.cross_entropy(losses, &dlogits, tl, tt, dloss);
  check_close(values_of(losses), cross_entropy_ref(logits, targets, V), kF32Tol, "losses");
  CHECK(losses.ptr<float>()[1] == 0.0f);
  Vec want = numeric_grad(
      [&](const Vec& l) {
        Vec per_row = cross_entropy_ref(l, targets, V);
        double sum = 0.0;
        for (double x : per_row) sum += x;
        return dloss * sum;
      },
      logits);
  Vec got = values_of(dlogits);
  check_close(got, want, kGradTol, "dlogits");
  for (int i = 0; i < V; ++i) REQUIRE(got[size_t(V) + i] == 0.0);  // ignored row

  Tensor aliased = make({N, V}, DType::f32, logits), losses2 = make({N}, DType::f32);
  backend.cross_entropy(losses2, &aliased, aliased, tt, dloss);
  CHECK(values_of(aliased) == got);
  CHECK(values_of(losses2) == values_of(losses));

  // Per-row scales: row n's gradient is the unscaled one times row_scales[n]
  // (zero, negative and fractional scales), the losses unchanged.
  const std::vector<float> scales = {0.5f, 3.0f, -2.0f, 0.0f, 1.0f, -0.25f, 7.0f};
  Tensor row_scales = make({N}, DType::f32, Vec(scales.begin(), scales.end()));
  Tensor scaled = make({N, V}, DType::f32), losses3 = make({N}, DType::f32);
  backend.cross_entropy(losses3, &scaled, tl, tt, dloss, &row_scales);
  check_close(values_of(scaled),
              [&] {
                Vec w = got;
                for (size_t i = 0; i < w.size(); ++i) w[i] *= scales[i / V];
                return w;
              }(),
              kF32Tol, "scaled dlogits");
  CHECK(values_of(losses3) == values_of(losses));
  Tensor short_scales = make({N - 1}, DType::f32);
  CHECK_THROWS_AS(backend.cross_entropy(losses3, &scaled, tl, tt, dloss, &short_scales), Error);

  Tensor bad_targets = make_i32({0, 1, 2, 3, 4, 5, V});
  CHECK_THROWS_AS(backend.cross_entropy(losses, nullptr, tl, bad_targets, dloss), Error);
}

TEST_CASE("cross entropy on 50k and 128k vocabularies: within 1e-6 of float64") {
  for (int64_t vocab : {50257, 128256}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      CAPTURE(vocab);
      CAPTURE(std::string(dtype_name(dtype)));
      testing::WideRows w = testing::wide_rows(6, vocab, uint32_t(vocab));
      Tensor tl = make({w.rows, vocab}, dtype), tt = make_i32(w.targets);
      for (size_t i = 0; i < w.logits.size(); ++i) store_from_f32(tl.data, dtype, int64_t(i), w.logits[i]);
      std::vector<float> read(w.logits.size());  // what the kernel reads: bf16 rounds
      for (size_t i = 0; i < read.size(); ++i) read[i] = load_as_f32(tl.data, dtype, int64_t(i));
      const float dloss = 1.0f / 4.0f;
      testing::CrossEntropyF64 want = testing::cross_entropy_f64(read, w.targets, vocab, dloss);
      Tensor losses = make({w.rows}, DType::f32), dlogits = make({w.rows, vocab}, DType::f32);
      backend.cross_entropy(losses, dtype == DType::f32 ? &dlogits : nullptr, tl, tt, dloss);
      CHECK(testing::worst_relative_error(testing::read(losses), want.losses) <= 1e-6);
      // Each gradient is exp(x - max) / sum with x - max rounded to f32:
      // 2^-24 * |x - max| relative, < 2^-19 = 1.9e-6 while |x - max| < 64 as here.
      if (dtype == DType::f32) CHECK(testing::worst_relative_error(testing::read(dlogits), want.dlogits) <= 4e-6);
    }
  }
}

// ---- argument checks ----------------------------------------------------

TEST_CASE("shape and dtype mismatches throw ft::Error") {
  Tensor a = make({5, 7}, DType::f32), b = make({6, 3}, DType::f32), out = make({5, 3}, DType::f32);
  CHECK_THROWS_AS(backend.matmul(out, a, b, false, false), Error);  // inner dims 7 vs 6
  Tensor b_ok = make({7, 3}, DType::f32), out_bad = make({5, 4}, DType::f32);
  CHECK_THROWS_AS(backend.matmul(out_bad, a, b_ok, false, false), Error);
  CHECK_THROWS_AS(backend.matmul(a, a, a, false, true), Error);  // out aliases inputs
  Tensor ints = make({5, 7}, DType::i32);
  CHECK_THROWS_AS(backend.matmul(out, ints, b_ok, false, false), Error);

  Tensor c = make({7, 5}, DType::f32);
  CHECK_THROWS_AS(backend.add(a, a, c), Error);

  Tensor x = make({3, 8}, DType::f32), w = make({7}, DType::f32), rstd = make({3}, DType::f32);
  Tensor y = make({3, 8}, DType::f32);
  CHECK_THROWS_AS(backend.rmsnorm_forward(y, rstd, x, w, 1e-5f), Error);

  Tensor q = make({1, 5, 3, 4}, DType::f32), kv = make({1, 5, 2, 4}, DType::f32);
  Tensor attn_out = make({1, 5, 3, 4}, DType::f32), lse = make({1, 3, 5}, DType::f32);
  CHECK_THROWS_AS(backend.attention_forward(attn_out, lse, q, kv, kv, 0.5f, 0), Error);  // 3 % 2 != 0
  Tensor kv3 = make({1, 5, 3, 4}, DType::f32), lse_bad = make({1, 5, 3}, DType::f32);
  CHECK_THROWS_AS(backend.attention_forward(attn_out, lse_bad, q, kv3, kv3, 0.5f, 0), Error);
  Tensor lse3 = make({1, 3, 5}, DType::f32);
  CHECK_THROWS_AS(backend.attention_forward(attn_out, lse3, q, kv3, kv3, 0.5f, -2), Error);  // negative window

  Tensor heads = make({5, 3, 4}, DType::f32), pos = make_i32({0, 1, 2, 3, 4});
  CHECK_THROWS_AS(backend.rope_forward(heads, pos, std::vector<float>{}), Error);  // no rotary features
  CHECK_THROWS_AS(backend.rope_forward(heads, pos, std::vector<float>{1.0f, 0.5f, 0.25f}), Error);  // > head_dim
  CHECK_THROWS_AS(backend.rope_forward(heads, pos, std::vector<float>{1.0f, NAN}), Error);
  CHECK_THROWS_AS(backend.rope_forward(heads, pos, std::vector<float>{1.0f, 0.0f}), Error);
  Tensor pos_short = make_i32({0, 1});
  CHECK_THROWS_AS(backend.rope_forward(heads, pos_short, std::vector<float>{1.0f, 0.5f}), Error);

  Tensor ids_f32 = make({5}, DType::f32), emb = make({5, 7}, DType::f32);
  CHECK_THROWS_AS(backend.embedding_forward(emb, ids_f32, a), Error);
}

// ---- GPT-NeoX ops: layernorm, gelu, bias, copy_columns ----------------------

namespace {

// torch.nn.LayerNorm in double: biased variance, eps inside the sqrt.
Vec layernorm_ref(const Vec& x, const Vec& w, const Vec& b, int N, int C, double eps, Vec* mean = nullptr,
                  Vec* rstd = nullptr) {
  Vec out(x.size());
  if (mean) mean->assign(N, 0.0);
  if (rstd) rstd->assign(N, 0.0);
  for (int n = 0; n < N; ++n) {
    double m = 0.0, var = 0.0;
    for (int c = 0; c < C; ++c) m += x[size_t(n) * C + c] / C;
    for (int c = 0; c < C; ++c) var += (x[size_t(n) * C + c] - m) * (x[size_t(n) * C + c] - m) / C;
    double r = 1.0 / std::sqrt(var + eps);
    for (int c = 0; c < C; ++c) out[size_t(n) * C + c] = (x[size_t(n) * C + c] - m) * r * w[c] + b[c];
    if (mean) (*mean)[n] = m;
    if (rstd) (*rstd)[n] = r;
  }
  return out;
}

double gelu_ref(double x, GeluKind kind) {
  if (kind == GeluKind::erf) return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

}  // namespace

TEST_CASE("layernorm forward matches torch.nn.LayerNorm and saves mean and rstd") {
  std::mt19937 rng(15);
  const int N = 7, C = 37;
  const float eps = 1e-5f;
  // An offset row mean: the variance must not come from E[x^2] - E[x]^2.
  Vec x = random_vec(size_t(N) * C, rng, 8.0, 12.0), w = random_vec(C, rng, 0.5, 1.5), b = random_vec(C, rng);
  Tensor tx = make({N, C}, DType::f32, x), tw = make({C}, DType::f32, w), tb = make({C}, DType::f32, b);
  Tensor out = make({N, C}, DType::f32), mean = make({N}, DType::f32), rstd = make({N}, DType::f32);
  backend.layernorm_forward(out, mean, rstd, tx, tw, tb, eps);
  Vec want_mean, want_rstd;
  Vec want = layernorm_ref(x, w, b, N, C, eps, &want_mean, &want_rstd);
  check_close(values_of(out), want, kF32Tol, "layernorm");
  check_close(values_of(mean), want_mean, kF32Tol, "mean");
  check_close(values_of(rstd), want_rstd, kF32Tol, "rstd");

  // bf16 in and out: statistics and the affine part in f32, one rounding at the end.
  Tensor x_bf16 = make({N, C}, DType::bf16, x), w_bf16 = make({C}, DType::bf16, w);
  Tensor b_bf16 = make({C}, DType::bf16, b), out_bf16 = make({N, C}, DType::bf16);
  backend.layernorm_forward(out_bf16, mean, rstd, x_bf16, w_bf16, b_bf16, eps);
  want = layernorm_ref(rounded(x, DType::bf16), rounded(w, DType::bf16), rounded(b, DType::bf16), N, C, eps);
  check_close(values_of(out_bf16), rounded(want, DType::bf16), kBf16Tol, "layernorm bf16");
}

TEST_CASE("layernorm backward: finite differences, dweight and dbias accumulate") {
  std::mt19937 rng(16);
  const int N = 7, C = 37;
  const float eps = 1e-5f;
  Vec x = random_vec(size_t(N) * C, rng, -2.0, 2.0), w = random_vec(C, rng, 0.5, 1.5), b = random_vec(C, rng);
  Vec probe = random_vec(size_t(N) * C, rng), prior_w = random_vec(C, rng), prior_b = random_vec(C, rng);
  Tensor tx = make({N, C}, DType::f32, x), tw = make({C}, DType::f32, w), tb = make({C}, DType::f32, b);
  Tensor out = make({N, C}, DType::f32), mean = make({N}, DType::f32), rstd = make({N}, DType::f32);
  backend.layernorm_forward(out, mean, rstd, tx, tw, tb, eps);
  Tensor dout = make({N, C}, DType::f32, probe), dx = make({N, C}, DType::f32);
  Tensor dw = make({C}, DType::f32, prior_w), db = make({C}, DType::f32, prior_b);
  backend.fill(dx, NAN);  // overwritten, never accumulated into
  backend.layernorm_backward(dx, &dw, &db, dout, tx, tw, mean, rstd);

  auto loss = [&](const Vec& xs, const Vec& ws, const Vec& bs) {
    return dot(layernorm_ref(xs, ws, bs, N, C, eps), probe);
  };
  Vec want_dx = numeric_grad([&](const Vec& v) { return loss(v, w, b); }, x);
  Vec want_dw = numeric_grad([&](const Vec& v) { return loss(x, v, b); }, w);
  Vec want_db = numeric_grad([&](const Vec& v) { return loss(x, w, v); }, b);
  for (int c = 0; c < C; ++c) {
    want_dw[c] += prior_w[c];
    want_db[c] += prior_b[c];
  }
  check_close(values_of(dx), want_dx, kGradTol, "dx");
  check_close(values_of(dw), want_dw, kGradTol, "dweight (+= prior)");
  check_close(values_of(db), want_db, kGradTol, "dbias (+= prior)");

  Tensor dx_only = make({N, C}, DType::f32);
  backend.layernorm_backward(dx_only, nullptr, nullptr, dout, tx, tw, mean, rstd);
  CHECK(values_of(dx_only) == values_of(dx));
}

TEST_CASE("gelu forward and backward, erf and tanh forms, dx aliasing dout") {
  std::mt19937 rng(17);
  const int n = 2051;  // crosses the 1024-element chunks
  Vec x = random_vec(n, rng, -6.0, 6.0), probe = random_vec(n, rng);
  for (GeluKind kind : {GeluKind::erf, GeluKind::tanh}) {
    CAPTURE(int(kind));
    Tensor tx = make({n}, DType::f32, x), out = make({n}, DType::f32);
    backend.gelu_forward(out, tx, kind);
    Vec want(n);
    for (int i = 0; i < n; ++i) want[i] = gelu_ref(x[i], kind);
    check_close(values_of(out), want, kF32Tol, "gelu forward");

    Tensor grad = make({n}, DType::f32, probe);
    backend.gelu_backward(grad, grad, tx, kind);
    Vec want_dx = numeric_grad(
        [&](const Vec& xs) {
          double sum = 0.0;
          for (int i = 0; i < n; ++i) sum += gelu_ref(xs[i], kind) * probe[i];
          return sum;
        },
        x);
    check_close(values_of(grad), want_dx, kGradTol, "gelu dx");
  }
  // The two forms differ by up to ~5e-4 (near |x| = 2): the switch is real.
  Tensor tx = make({n}, DType::f32, x), erf_out = make({n}, DType::f32), tanh_out = make({n}, DType::f32);
  backend.gelu_forward(erf_out, tx, GeluKind::erf);
  backend.gelu_forward(tanh_out, tx, GeluKind::tanh);
  CHECK(values_of(erf_out) != values_of(tanh_out));
}

TEST_CASE("add_bias adds to every row; bias_backward accumulates column sums") {
  std::mt19937 rng(18);
  const int N = 13, C = 37;
  Vec x = random_vec(size_t(N) * C, rng), b = random_vec(C, rng), prior = random_vec(C, rng);
  Tensor out = make({N, C}, DType::f32, x), tb = make({C}, DType::bf16, b);
  backend.add_bias(out, tb);
  Vec b_bf16 = rounded(b, DType::bf16), want(x.size());
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) want[size_t(n) * C + c] = x[size_t(n) * C + c] + b_bf16[c];
  check_close(values_of(out), want, kF32Tol, "add_bias");

  Tensor dout = make({N, C}, DType::f32, x), dbias = make({C}, DType::f32, prior);
  backend.bias_backward(dbias, dout);
  Vec want_db = prior;
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) want_db[c] += x[size_t(n) * C + c];
  check_close(values_of(dbias), want_db, kF32Tol, "dbias (+= prior)");

  Tensor wrong = make({C + 1}, DType::f32);
  CHECK_THROWS_AS(backend.add_bias(out, wrong), Error);
  CHECK_THROWS_AS(backend.bias_backward(wrong, dout), Error);
}

TEST_CASE("copy_columns splits a fused [rows, 3D] block and puts it back") {
  std::mt19937 rng(19);
  const int R = 11, D = 5;
  Vec fused = random_vec(size_t(R) * 3 * D, rng);
  Tensor tf = make({R, 3 * D}, DType::f32, fused), back = make({R, 3 * D}, DType::f32);
  for (int part = 0; part < 3; ++part) {
    Tensor slice = make({R, D}, DType::bf16);
    backend.copy_columns(slice, 0, tf, part * D, D);
    Vec got = values_of(slice);
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < D; ++j)
        REQUIRE(got[size_t(r) * D + j] == rounded({fused[size_t(r) * 3 * D + part * D + j]}, DType::bf16)[0]);
    backend.copy_columns(back, part * D, slice, 0, D);
  }
  check_close(values_of(back), rounded(fused, DType::bf16), 0.0, "round trip");

  Tensor short_rows = make({R - 1, D}, DType::f32);
  CHECK_THROWS_AS(backend.copy_columns(short_rows, 0, tf, 0, D), Error);
  Tensor slice = make({R, D}, DType::f32);
  CHECK_THROWS_AS(backend.copy_columns(slice, 0, tf, 2 * D + 1, D), Error);  // past src's last column
}

// ---- fused residual add + norm ---------------------------------------------
// The fused ops are specified as the unfused sequences they replace (add then
// norm; norm backward into a dx-typed tensor then add): on the CPU they must
// match them bit for bit, in f32, bf16 and mixed dtypes, with sum aliasing a
// and dx aliasing dresidual as the models call them.

namespace {

struct FusedCase {
  int N, C;
  DType a, b, act;  // a: the residual stream, b: the block output, act: sum/out/gradients
};
const FusedCase kFusedCases[] = {{7, 37, DType::f32, DType::f32, DType::f32},
                                 {5, 1031, DType::bf16, DType::bf16, DType::bf16},
                                 {3, 1, DType::f32, DType::bf16, DType::bf16},
                                 {9, 300, DType::bf16, DType::f32, DType::f32}};

struct FusedInputs {
  Tensor a, b, w, bias, dout, dres;
};

// b spans a larger range than a, so sum's rounding to bf16 is visible.
FusedInputs fused_inputs(const FusedCase& c, unsigned seed) {
  std::mt19937 rng(seed);
  const size_t n = size_t(c.N) * c.C;
  return {make({c.N, c.C}, c.a, random_vec(n, rng, -2.0, 2.0)), make({c.N, c.C}, c.b, random_vec(n, rng, -8.0, 8.0)),
          make({c.C}, c.act, random_vec(size_t(c.C), rng, 0.5, 1.5)), make({c.C}, c.act, random_vec(size_t(c.C), rng)),
          make({c.N, c.C}, c.act, random_vec(n, rng)), make({c.N, c.C}, c.act, random_vec(n, rng))};
}

Tensor copy_of(const Tensor& t) {
  Tensor out = make(t.shape, t.dtype);
  backend.copy(out, t);
  return out;
}

}  // namespace

TEST_CASE("add_rmsnorm_forward and rmsnorm_backward_add equal add + rmsnorm bit for bit") {
  for (const FusedCase& c : kFusedCases) {
    CAPTURE(c.C);
    CAPTURE(dtype_name(c.act));
    FusedInputs in = fused_inputs(c, 31);
    const float eps = 1e-5f;
    Tensor want_sum = make({c.N, c.C}, c.act), want_out = make({c.N, c.C}, c.act), want_rstd = make({c.N}, DType::f32);
    backend.add(want_sum, in.a, in.b);
    backend.rmsnorm_forward(want_out, want_rstd, want_sum, in.w, eps);
    Tensor want_dx = make({c.N, c.C}, c.act), want_dw = copy_of(in.w);
    backend.rmsnorm_backward(want_dx, &want_dw, in.dout, want_sum, in.w, want_rstd);
    backend.add(want_dx, in.dres, want_dx);

    // sum aliases a when a has its dtype (the models' residual stream).
    Tensor sum = c.a == c.act ? copy_of(in.a) : make({c.N, c.C}, c.act);
    const Tensor a = c.a == c.act ? sum : in.a;
    Tensor out = make({c.N, c.C}, c.act), rstd = make({c.N}, DType::f32);
    backend.add_rmsnorm_forward(sum, out, rstd, a, in.b, in.w, eps);
    CHECK(values_of(sum) == values_of(want_sum));
    CHECK(values_of(out) == values_of(want_out));
    CHECK(values_of(rstd) == values_of(want_rstd));

    Tensor dx = copy_of(in.dres), dw = copy_of(in.w);  // dx aliases dresidual
    backend.rmsnorm_backward_add(dx, &dw, in.dout, dx, sum, in.w, rstd);
    CHECK(values_of(dx) == values_of(want_dx));
    CHECK(values_of(dw) == values_of(want_dw));
    Tensor dx_only = make({c.N, c.C}, c.act);
    backend.rmsnorm_backward_add(dx_only, nullptr, in.dout, in.dres, sum, in.w, rstd);
    CHECK(values_of(dx_only) == values_of(want_dx));
  }
}

TEST_CASE("add_layernorm_forward and layernorm_backward_add equal add + layernorm bit for bit") {
  for (const FusedCase& c : kFusedCases) {
    CAPTURE(c.C);
    CAPTURE(dtype_name(c.act));
    FusedInputs in = fused_inputs(c, 32);
    const float eps = 1e-5f;
    Tensor want_sum = make({c.N, c.C}, c.act), want_out = make({c.N, c.C}, c.act);
    Tensor want_mean = make({c.N}, DType::f32), want_rstd = make({c.N}, DType::f32);
    backend.add(want_sum, in.a, in.b);
    backend.layernorm_forward(want_out, want_mean, want_rstd, want_sum, in.w, in.bias, eps);
    Tensor want_dx = make({c.N, c.C}, c.act), want_dw = copy_of(in.w), want_db = copy_of(in.bias);
    backend.layernorm_backward(want_dx, &want_dw, &want_db, in.dout, want_sum, in.w, want_mean, want_rstd);
    backend.add(want_dx, in.dres, want_dx);

    Tensor sum = c.a == c.act ? copy_of(in.a) : make({c.N, c.C}, c.act);
    const Tensor a = c.a == c.act ? sum : in.a;
    Tensor out = make({c.N, c.C}, c.act), mean = make({c.N}, DType::f32), rstd = make({c.N}, DType::f32);
    backend.add_layernorm_forward(sum, out, mean, rstd, a, in.b, in.w, in.bias, eps);
    CHECK(values_of(sum) == values_of(want_sum));
    CHECK(values_of(out) == values_of(want_out));
    CHECK(values_of(mean) == values_of(want_mean));
    CHECK(values_of(rstd) == values_of(want_rstd));

    Tensor dx = copy_of(in.dres), dw = copy_of(in.w), db = copy_of(in.bias);
    backend.layernorm_backward_add(dx, &dw, &db, in.dout, dx, sum, in.w, mean, rstd);
    CHECK(values_of(dx) == values_of(want_dx));
    CHECK(values_of(dw) == values_of(want_dw));
    CHECK(values_of(db) == values_of(want_db));
    Tensor dx_only = make({c.N, c.C}, c.act);
    backend.layernorm_backward_add(dx_only, nullptr, nullptr, in.dout, in.dres, sum, in.w, mean, rstd);
    CHECK(values_of(dx_only) == values_of(want_dx));
  }
}

TEST_CASE("fused residual norms reject mismatched residual operands") {
  Tensor x = make({3, 4}, DType::f32), wrong = make({3, 5}, DType::f32), w = make({4}, DType::f32);
  Tensor out = make({3, 4}, DType::f32), stat = make({3}, DType::f32), ids = make({3, 4}, DType::i32);
  CHECK_THROWS_AS(backend.add_rmsnorm_forward(out, out, stat, x, wrong, w, 1e-5f), Error);
  CHECK_THROWS_AS(backend.add_rmsnorm_forward(wrong, out, stat, x, x, w, 1e-5f), Error);
  CHECK_THROWS_AS(backend.add_layernorm_forward(out, out, stat, stat, x, ids, w, w, 1e-5f), Error);
  CHECK_THROWS_AS(backend.rmsnorm_backward_add(out, nullptr, x, wrong, x, w, stat), Error);
  CHECK_THROWS_AS(backend.layernorm_backward_add(out, nullptr, nullptr, x, ids, x, w, stat, stat), Error);
}

// ---- T5 attention and activation ------------------------------------------

namespace {

struct BiasedShape {
  int B, Tq, Tk, H, D;
  bool causal, with_bias;
  std::vector<int32_t> key_lengths = {};  // per row; empty: every key
};

// key_lengths as the op takes them, or null.
const Tensor* key_lengths_arg(const BiasedShape& s, Tensor& storage) {
  if (s.key_lengths.empty()) return nullptr;
  storage = make_i32(s.key_lengths);
  return &storage;
}

// scores = q.k + bias[i, j, h] (unscaled), causal or full, keys of row b
// cut at key_lengths[b]; bias empty: none.
void biased_attention_ref(const Vec& q, const Vec& k, const Vec& v, const Vec& bias, const BiasedShape& s, Vec& out,
                          Vec& lse) {
  out.assign(size_t(s.B) * s.Tq * s.H * s.D, 0.0);
  lse.assign(size_t(s.B) * s.H * s.Tq, 0.0);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.H; ++h)
      for (int i = 0; i < s.Tq; ++i) {
        int keys = s.causal ? i + 1 : s.Tk;
        if (!s.key_lengths.empty()) keys = std::min(keys, s.key_lengths[size_t(b)]);
        Vec scores(size_t(keys), 0.0);
        for (int j = 0; j < keys; ++j) {
          double sum = bias.empty() ? 0.0 : bias[(size_t(i) * s.Tk + j) * s.H + h];
          for (int e = 0; e < s.D; ++e)
            sum += q[((size_t(b) * s.Tq + i) * s.H + h) * s.D + e] * k[((size_t(b) * s.Tk + j) * s.H + h) * s.D + e];
          scores[size_t(j)] = sum;
        }
        const double m = *std::max_element(scores.begin(), scores.end());
        double total = 0.0;
        for (double& x : scores) total += (x = std::exp(x - m));
        for (int j = 0; j < keys; ++j)
          for (int e = 0; e < s.D; ++e)
            out[((size_t(b) * s.Tq + i) * s.H + h) * s.D + e] +=
                scores[size_t(j)] / total * v[((size_t(b) * s.Tk + j) * s.H + h) * s.D + e];
        lse[(size_t(b) * s.H + h) * s.Tq + i] = m + std::log(total);
      }
}

const BiasedShape kBiasedShapes[] = {
    {2, 7, 7, 3, 5, false, true},   // encoder self-attention
    {2, 6, 6, 2, 4, true, true},    // decoder self-attention
    {2, 5, 9, 3, 6, false, false},  // cross-attention: more keys than queries, no bias
    {1, 9, 4, 2, 3, false, false},  // fewer keys than queries
    {2, 7, 7, 3, 5, false, true, {7, 4}},   // encoder self-attention over a padded row
    {2, 5, 9, 3, 6, false, false, {3, 9}},  // cross-attention to a padded encoder row
    {2, 6, 6, 2, 4, true, true, {6, 2}},    // causal and cut
};

}  // namespace

TEST_CASE("biased attention forward: unscaled scores plus bias, causal and full, cross shapes") {
  std::mt19937 rng(31);
  for (const BiasedShape& s : kBiasedShapes)
    for (DType dtype : {DType::f32, DType::bf16}) {
      CAPTURE(s.Tq);
      CAPTURE(s.Tk);
      CAPTURE(s.causal);
      CAPTURE(dtype_name(dtype));
      const Shape q_shape = {s.B, s.Tq, s.H, s.D}, kv_shape = {s.B, s.Tk, s.H, s.D};
      Vec q = random_vec(size_t(s.B) * s.Tq * s.H * s.D, rng, -2.0, 2.0);
      Vec k = random_vec(size_t(s.B) * s.Tk * s.H * s.D, rng, -2.0, 2.0);
      Vec v = random_vec(k.size(), rng);
      Vec bias = s.with_bias ? random_vec(size_t(s.Tq) * s.Tk * s.H, rng, -3.0, 3.0) : Vec{};
      Tensor tq = make(q_shape, dtype, q), tk = make(kv_shape, dtype, k), tv = make(kv_shape, dtype, v);
      Tensor tbias = s.with_bias ? make({s.Tq, s.Tk, s.H}, dtype, bias) : Tensor{};
      Tensor out = make(q_shape, dtype), lse = make({s.B, s.H, s.Tq}, DType::f32), lengths;
      backend.biased_attention_forward(out, lse, tq, tk, tv, s.with_bias ? &tbias : nullptr,
                                       key_lengths_arg(s, lengths), s.causal);
      Vec want_out, want_lse;
      biased_attention_ref(rounded(q, dtype), rounded(k, dtype), rounded(v, dtype), rounded(bias, dtype), s, want_out,
                           want_lse);
      check_close(values_of(out), want_out, dtype == DType::f32 ? kF32Tol : kBf16Tol, "biased attention out");
      check_close(values_of(lse), want_lse, kF32Tol, "biased attention lse");
    }
}

TEST_CASE("biased attention backward: finite differences for dq, dk, dv and the accumulated dbias") {
  std::mt19937 rng(32);
  for (const BiasedShape& s : kBiasedShapes) {
    CAPTURE(s.Tq);
    CAPTURE(s.Tk);
    CAPTURE(s.causal);
    const Shape q_shape = {s.B, s.Tq, s.H, s.D}, kv_shape = {s.B, s.Tk, s.H, s.D};
    Vec q = random_vec(size_t(s.B) * s.Tq * s.H * s.D, rng, -2.0, 2.0);
    Vec k = random_vec(size_t(s.B) * s.Tk * s.H * s.D, rng, -2.0, 2.0);
    Vec v = random_vec(k.size(), rng);
    Vec bias = random_vec(size_t(s.Tq) * s.Tk * s.H, rng, -3.0, 3.0);
    if (!s.with_bias) bias.clear();
    Vec probe = random_vec(q.size(), rng);
    Tensor tq = make(q_shape, DType::f32, q), tk = make(kv_shape, DType::f32, k), tv = make(kv_shape, DType::f32, v);
    Tensor tbias = s.with_bias ? make({s.Tq, s.Tk, s.H}, DType::f32, bias) : Tensor{};
    const Tensor* bias_arg = s.with_bias ? &tbias : nullptr;
    Tensor out = make(q_shape, DType::f32), lse = make({s.B, s.H, s.Tq}, DType::f32), lengths;
    const Tensor* lengths_arg = key_lengths_arg(s, lengths);
    backend.biased_attention_forward(out, lse, tq, tk, tv, bias_arg, lengths_arg, s.causal);
    Tensor dout = make(q_shape, DType::f32, probe);
    Tensor dq = make(q_shape, DType::f32), dk = make(kv_shape, DType::f32), dv = make(kv_shape, DType::f32);
    backend.fill(dk, NAN);  // overwritten, never accumulated into
    const Vec dbias_before = random_vec(size_t(s.Tq) * s.Tk * s.H, rng);
    Tensor dbias = make({s.Tq, s.Tk, s.H}, DType::f32, dbias_before);
    backend.biased_attention_backward(dq, dk, dv, &dbias, dout, tq, tk, tv, out, lse, bias_arg, lengths_arg,
                                      s.causal);

    auto loss = [&](const Vec& qs, const Vec& ks, const Vec& vs, const Vec& bs) {
      Vec o, l;
      biased_attention_ref(qs, ks, vs, bs, s, o, l);
      return dot(o, probe);
    };
    check_close(values_of(dq), numeric_grad([&](const Vec& x) { return loss(x, k, v, bias); }, q), kGradTol, "dq");
    check_close(values_of(dk), numeric_grad([&](const Vec& x) { return loss(q, x, v, bias); }, k), kGradTol, "dk");
    check_close(values_of(dv), numeric_grad([&](const Vec& x) { return loss(q, k, x, bias); }, v), kGradTol, "dv");
    // The bias gradient, with or without a bias in the forward (the
    // gradient of an all-zero bias), added to what dbias held.
    Vec zero_or_bias = s.with_bias ? bias : Vec(dbias_before.size(), 0.0);
    Vec want_dbias = numeric_grad(
        [&](const Vec& x) {
          BiasedShape with = s;
          with.with_bias = true;
          Vec o, l;
          biased_attention_ref(q, k, v, x, with, o, l);
          return dot(o, probe);
        },
        zero_or_bias);
    for (size_t n = 0; n < want_dbias.size(); ++n) want_dbias[n] += double(float(dbias_before[n]));
    check_close(values_of(dbias), want_dbias, kGradTol, "dbias");
  }
}

TEST_CASE("activation: relu and tanh GELU, plain and gated, dx aliasing dout") {
  std::mt19937 rng(33);
  const int n = 2051;  // crosses the 1024-element chunks
  Vec x = random_vec(n, rng, -6.0, 6.0), up = random_vec(n, rng, -2.0, 2.0), probe = random_vec(n, rng);
  x[0] = 0.0;  // relu'(0) = 0, as torch
  auto act = [](double value, Activation kind) {
    return kind == Activation::relu ? std::max(value, 0.0) : gelu_ref(value, GeluKind::tanh);
  };
  for (Activation kind : {Activation::relu, Activation::gelu_tanh})
    for (bool gated : {false, true}) {
      CAPTURE(int(kind));
      CAPTURE(gated);
      Tensor tx = make({n}, DType::f32, x), tup = make({n}, DType::f32, up), out = make({n}, DType::f32);
      const Tensor* up_arg = gated ? &tup : nullptr;
      backend.activation_forward(out, tx, up_arg, kind);
      auto loss = [&](const Vec& xs, const Vec& us) {
        double sum = 0.0;
        for (int i = 0; i < n; ++i) sum += act(xs[i], kind) * (gated ? us[i] : 1.0) * probe[i];
        return sum;
      };
      Vec want(n);
      for (int i = 0; i < n; ++i) want[i] = act(x[i], kind) * (gated ? up[i] : 1.0);
      check_close(values_of(out), want, kF32Tol, "activation forward");

      Tensor grad = make({n}, DType::f32, probe), dup = make({n}, DType::f32);
      backend.activation_backward(grad, gated ? &dup : nullptr, grad, tx, up_arg, kind);
      Vec want_dx = numeric_grad([&](const Vec& xs) { return loss(xs, up); }, x);
      if (kind == Activation::relu) want_dx[0] = 0.0;  // the kink: torch's subgradient
      check_close(values_of(grad), want_dx, kGradTol, "activation dx");
      if (gated) check_close(values_of(dup), numeric_grad([&](const Vec& us) { return loss(x, us); }, up), kGradTol,
                             "activation dup");
    }
}

TEST_CASE("biased attention and activation reject mismatched operands") {
  Tensor q = make({1, 4, 2, 3}, DType::f32), k = make({1, 5, 2, 3}, DType::f32), v = make({1, 5, 2, 3}, DType::f32);
  Tensor out = make({1, 4, 2, 3}, DType::f32), lse = make({1, 2, 4}, DType::f32);
  Tensor bias = make({4, 4, 2}, DType::f32);
  CHECK_THROWS_WITH_AS(backend.biased_attention_forward(out, lse, q, k, v, nullptr, nullptr, true),
                       doctest::Contains("causal attention needs as many keys as queries"), Error);
  CHECK_THROWS_WITH_AS(backend.biased_attention_forward(out, lse, q, k, v, &bias, nullptr, false),
                       doctest::Contains("bias"), Error);
  Tensor lengths = make_i32({5, 5});
  CHECK_THROWS_WITH_AS(backend.biased_attention_forward(out, lse, q, k, v, nullptr, &lengths, false),
                       doctest::Contains("key_lengths has shape [2], expected [1]"), Error);
  Tensor x = make({6}, DType::f32), y = make({5}, DType::f32);
  CHECK_THROWS_AS(backend.activation_forward(x, x, &y, Activation::relu), Error);
  CHECK_THROWS_WITH_AS(backend.activation_backward(x, &x, x, x, nullptr, Activation::relu),
                       doctest::Contains("dup needs up"), Error);
}

// ---- DoRA ---------------------------------------------------------------

namespace {

// y = out + (m / sqrt(ss) - 1) (z - b) over [N, O], in double (b null: no
// bias): PEFT's result + (mag_norm_scale - 1) * base_result with the LoRA
// term already in out and z.
Vec dora_scale_ref(const Vec& out, const Vec& z, const Vec& m, const Vec& ss, const Vec* b, int N, int O) {
  Vec y(z.size());
  for (int n = 0; n < N; ++n)
    for (int j = 0; j < O; ++j) {
      const size_t i = size_t(n) * O + j;
      y[i] = out[i] + (m[j] / std::sqrt(ss[j]) - 1.0) * (z[i] - (b ? (*b)[j] : 0.0));
    }
  return y;
}

}  // namespace

TEST_CASE("row_sum_squares: per-row sums of squares, overwritten or accumulated, f32 and bf16") {
  std::mt19937 rng(40);
  const int C = 53;
  for (const Shape& shape : {Shape{37, C}, Shape{3, 5, C}}) {
    const int R = int(shape[0] * (shape.size() == 3 ? shape[1] : 1));
    for (DType dtype : {DType::f32, DType::bf16})
      for (bool accumulate : {false, true}) {
        CAPTURE(shape_string(shape));
        CAPTURE(dtype_name(dtype));
        CAPTURE(accumulate);
        Vec x = rounded(random_vec(size_t(R) * C, rng), dtype), prior = random_vec(R, rng, 0.0, 2.0);
        Tensor tx = make(shape, dtype, x), sums = make({R}, DType::f32, prior);
        backend.row_sum_squares(sums, tx, accumulate);
        Vec want(R);
        for (int i = 0; i < R; ++i) {
          want[i] = accumulate ? double(float(prior[i])) : 0.0;
          for (int j = 0; j < C; ++j) want[i] += x[size_t(i) * C + j] * x[size_t(i) * C + j];
        }
        check_close(values_of(sums), want, kF32Tol, "row_sum_squares");
      }
  }
}

TEST_CASE("dora_scale_forward: out += (m / sqrt(ss) - 1) (z - b), z apart or out itself, f32 and bf16, bias or none") {
  std::mt19937 rng(41);
  const int N = 37, O = 29;
  for (DType dtype : {DType::f32, DType::bf16})
    for (bool with_bias : {false, true})
      for (bool in_place : {false, true}) {
        CAPTURE(dtype_name(dtype));
        CAPTURE(with_bias);
        CAPTURE(in_place);
        // magnitude and bias in the other dtype than out: mixed operands.
        const DType vectors = dtype == DType::f32 ? DType::bf16 : DType::f32;
        Vec o = rounded(random_vec(size_t(N) * O, rng), dtype), z = rounded(random_vec(size_t(N) * O, rng), dtype);
        Vec m = rounded(random_vec(O, rng, 0.5, 2.0), vectors);
        Vec ss = rounded(random_vec(O, rng, 0.25, 4.0), DType::f32), b = rounded(random_vec(O, rng), vectors);
        Tensor out = make({N, O}, dtype, o), tz = make({N, O}, dtype, z), tm = make({O}, vectors, m);
        Tensor tss = make({O}, DType::f32, ss), tb = make({O}, vectors, b);
        backend.dora_scale_forward(out, in_place ? out : tz, tm, tss, with_bias ? &tb : nullptr);
        // In place, out = g (out - b) + b: PEFT's form without dropout.
        const Vec want = dora_scale_ref(o, in_place ? o : z, m, ss, with_bias ? &b : nullptr, N, O);
        check_close(values_of(out), want, dtype == DType::bf16 ? kBf16Tol : kF32Tol, "dora_scale_forward");
      }
}

TEST_CASE("dora_scale_backward: dz = dout * g (in place too), dbase = dout * (g - 1), dmagnitude accumulates "
          "d/dm of sum(dout * y)") {
  std::mt19937 rng(42);
  const int N = 37, O = 29;
  for (DType dtype : {DType::f32, DType::bf16})
    for (bool with_bias : {false, true})
      for (bool in_place : {false, true})
        for (bool frozen : {false, true}) {
          CAPTURE(dtype_name(dtype));
          CAPTURE(with_bias);
          CAPTURE(in_place);
          CAPTURE(frozen);
          Vec dout = rounded(random_vec(size_t(N) * O, rng), dtype), z = rounded(random_vec(size_t(N) * O, rng), dtype);
          Vec m = random_vec(O, rng, 0.5, 2.0), ss = rounded(random_vec(O, rng, 0.25, 4.0), DType::f32);
          Vec b = random_vec(O, rng), prior = rounded(random_vec(O, rng), DType::f32);
          Tensor tdout = make({N, O}, dtype, dout), tz = make({N, O}, dtype, z), tm = make({O}, DType::f32, m);
          Tensor tss = make({O}, DType::f32, ss), tb = make({O}, DType::f32, b);
          Tensor dm = make({O}, DType::f32, prior), separate = make({N, O}, dtype), dbase = make({N, O}, dtype);
          Tensor& dz = in_place ? tdout : separate;
          const Vec* bias = with_bias ? &b : nullptr;
          // dbase only beside a separate dz (in place, dout is gone once dz is written: both come from it).
          backend.dora_scale_backward(dz, in_place ? nullptr : &dbase, frozen ? nullptr : &dm, tdout, tz, tm, tss,
                                      with_bias ? &tb : nullptr);

          Vec want_dz(dout.size()), want_dbase(dout.size());
          for (int n = 0; n < N; ++n)
            for (int j = 0; j < O; ++j) {
              const size_t i = size_t(n) * O + j;
              want_dz[i] = dout[i] * m[j] / std::sqrt(ss[j]);
              want_dbase[i] = dout[i] * (m[j] / std::sqrt(ss[j]) - 1.0);
            }
          check_close(values_of(dz), want_dz, dtype == DType::bf16 ? kBf16Tol : kF32Tol, "dz");
          if (!in_place) check_close(values_of(dbase), want_dbase, dtype == DType::bf16 ? kBf16Tol : kF32Tol, "dbase");
          if (frozen) {
            CHECK(values_of(dm) == prior);  // untouched
            continue;
          }
          // The probe loss sum(dout * y) with y the reference forward; its
          // magnitude gradient by central differences, plus the prior.
          Vec want_dm = numeric_grad(
              [&](const Vec& ms) { return dot(dout, dora_scale_ref(z, z, ms, ss, bias, N, O)); }, m);
          for (int j = 0; j < O; ++j) want_dm[j] += prior[j];
          check_close(values_of(dm), want_dm, kGradTol, "dmagnitude (+= prior)");
        }
}

TEST_CASE("DoRA ops reject mismatched operands, naming the op and operand") {
  Tensor x = make({4, 6}, DType::f32), sums = make({4}, DType::f32), sums_bf16 = make({4}, DType::bf16);
  CHECK_THROWS_WITH_AS(backend.row_sum_squares(sums_bf16, x, false),
                       doctest::Contains("row_sum_squares: sums must be f32"), Error);
  Tensor sums5 = make({5}, DType::f32);
  CHECK_THROWS_WITH_AS(backend.row_sum_squares(sums5, x, false),
                       doctest::Contains("row_sum_squares: sums has shape [5]"), Error);
  Tensor ids = make_i32({1, 2, 3, 4});
  CHECK_THROWS_WITH_AS(backend.row_sum_squares(sums, ids, false),
                       doctest::Contains("row_sum_squares: x must be f32 or bf16"), Error);

  Tensor m = make({6}, DType::f32), ss = make({6}, DType::f32), ss_bf16 = make({6}, DType::bf16);
  Tensor m5 = make({5}, DType::f32), b5 = make({5}, DType::f32);
  CHECK_THROWS_WITH_AS(backend.dora_scale_forward(x, x, m5, ss, nullptr),
                       doctest::Contains("dora_scale_forward: magnitude has shape [5], expected [6]"), Error);
  CHECK_THROWS_WITH_AS(backend.dora_scale_forward(x, x, m, ss_bf16, nullptr),
                       doctest::Contains("dora_scale_forward: weight_sum_squares must be f32"), Error);
  CHECK_THROWS_WITH_AS(backend.dora_scale_forward(x, x, m, ss, &b5),
                       doctest::Contains("dora_scale_forward: bias has shape [5], expected [6]"), Error);
  Tensor x_wide = make({4, 7}, DType::f32);
  CHECK_THROWS_WITH_AS(backend.dora_scale_forward(x, x_wide, m, ss, nullptr),
                       doctest::Contains("dora_scale_forward: z has shape [4, 7], expected [4, 6]"), Error);

  Tensor dout = make({4, 6}, DType::f32), z = make({4, 6}, DType::f32), dm = make({6}, DType::f32);
  Tensor z_wide = make({4, 7}, DType::f32), dz_bf16 = make({4, 6}, DType::bf16), dm_bf16 = make({6}, DType::bf16);
  CHECK_THROWS_WITH_AS(backend.dora_scale_backward(x, nullptr, &dm, dout, z_wide, m, ss, nullptr),
                       doctest::Contains("dora_scale_backward: z has shape [4, 7], expected [4, 6]"), Error);
  CHECK_THROWS_WITH_AS(backend.dora_scale_backward(dz_bf16, nullptr, &dm, dout, z, m, ss, nullptr),
                       doctest::Contains("dora_scale_backward: dz must be f32 as dout, got bf16"), Error);
  CHECK_THROWS_WITH_AS(backend.dora_scale_backward(x, &dz_bf16, &dm, dout, z, m, ss, nullptr),
                       doctest::Contains("dora_scale_backward: dbase must be f32 as dout, got bf16"), Error);
  CHECK_THROWS_WITH_AS(backend.dora_scale_backward(x, &dout, &dm, dout, z, m, ss, nullptr),
                       doctest::Contains("dora_scale_backward: dbase must not alias dout or dz"), Error);
  CHECK_THROWS_WITH_AS(backend.dora_scale_backward(x, nullptr, &dm_bf16, dout, z, m, ss, nullptr),
                       doctest::Contains("dora_scale_backward: dmagnitude must be f32"), Error);
  CHECK_THROWS_WITH_AS(backend.dora_scale_backward(x, nullptr, &dm, dout, z, m5, ss, nullptr),
                       doctest::Contains("dora_scale_backward: magnitude has shape [5], expected [6]"), Error);
}
