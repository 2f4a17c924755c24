// LLM.int8(): quantisation, the mixed int8/f32 forward and the input gradient,
// each against a float64 reference. Sizes are odd on purpose (no multiple of
// the 3 x 4 register tile or of the 8/16-lane vectors).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/onednn_gemm.h"
#include "kernels/error.h"
#include "tests/host_tensors.h"

using namespace ft;
using ft::testing::gaussian;
using ft::testing::make;
using ft::testing::read;

namespace {

// code = round-half-even(x * 127 / s) in float64, 0 where s = 0.
void codes_ref(const float* x, int64_t K, double s, std::vector<int>& codes) {
  codes.assign(size_t(K), 0);
  if (s > 0.0)
    for (int64_t k = 0; k < K; ++k) codes[size_t(k)] = int(std::nearbyint(double(x[k]) * 127.0 / s));
}

// The float64 quantiser: scale = max|x|, codes as codes_ref.
double quantize_ref(const float* x, int64_t K, std::vector<int>& codes) {
  double s = 0.0;
  for (int64_t k = 0; k < K; ++k) s = std::max(s, std::fabs(double(x[k])));
  codes_ref(x, K, s, codes);
  return s;
}

// A weight W [O, K] quantised by the backend under test (checked separately).
struct QuantWeight {
  Tensor q, scales;
  std::vector<int8_t> codes;
  std::vector<float> s;
  double dequant(int64_t o, int64_t k, int64_t K) const { return double(codes[size_t(o * K + k)]) * s[size_t(o)] / 127.0; }
};

QuantWeight quantize_weight(CpuBackend& backend, const std::vector<float>& w, int64_t O, int64_t K) {
  QuantWeight qw;
  qw.q = backend.empty({O, K}, DType::i8, MemCategory::weights);
  qw.scales = backend.empty({O}, DType::f32, MemCategory::weights);
  backend.quantize_rows_int8(qw.q, qw.scales, make(backend, {O, K}, w));
  qw.codes.assign(qw.q.ptr<int8_t>(), qw.q.ptr<int8_t>() + O * K);
  qw.s.assign(qw.scales.ptr<float>(), qw.scales.ptr<float>() + O);
  return qw;
}

// The LLM.int8() decomposition in float64: outlier columns against the
// dequantised weight, the rest as an exact integer product dequantised with
// s_x * s_w / 127^2 (s_x: given_sx where not empty, else each row's absmax
// over its non-outlier columns). magnitude = sum of |terms|, the scale of f32
// rounding error.
struct ForwardRef {
  std::vector<double> out, magnitude;
  std::vector<int64_t> outlier_columns;
};

ForwardRef int8_forward_ref(const std::vector<float>& x, const QuantWeight& w, int64_t N, int64_t K, int64_t O,
                            float threshold, const std::vector<float>& given_sx = {}) {
  ForwardRef ref;
  for (int64_t k = 0; k < K; ++k) {
    bool outlier = false;
    for (int64_t n = 0; n < N; ++n) outlier |= threshold > 0.0f && std::fabs(x[size_t(n * K + k)]) >= threshold;
    if (outlier) ref.outlier_columns.push_back(k);
  }
  ref.out.assign(size_t(N * O), 0.0);
  ref.magnitude.assign(size_t(N * O), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    std::vector<float> row(x.begin() + n * K, x.begin() + (n + 1) * K);
    for (int64_t c : ref.outlier_columns) row[size_t(c)] = 0.0f;
    std::vector<int> codes;
    double sx = given_sx.empty() ? quantize_ref(row.data(), K, codes) : double(given_sx[size_t(n)]);
    if (!given_sx.empty()) codes_ref(row.data(), K, sx, codes);
    for (int64_t o = 0; o < O; ++o) {
      int64_t acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += int64_t(codes[size_t(k)]) * w.codes[size_t(o * K + k)];
      double int_part = double(acc) * sx * double(w.s[size_t(o)]) / (127.0 * 127.0);
      double outlier_part = 0.0, outlier_abs = 0.0;
      for (int64_t c : ref.outlier_columns) {
        double term = double(x[size_t(n * K + c)]) * w.dequant(o, c, K);
        outlier_part += term;
        outlier_abs += std::fabs(term);
      }
      ref.out[size_t(n * O + o)] = int_part + outlier_part;
      ref.magnitude[size_t(n * O + o)] = std::fabs(int_part) + outlier_abs;
    }
  }
  return ref;
}

// The epilogue in float64 on top of a decomposition: out += bias[o] +
// scaling * sum_j h[n, j] B[o, j], each term's magnitude added to the scale.
void add_epilogue_ref(ForwardRef& ref, const std::vector<float>& bias, const std::vector<float>& h,
                      const std::vector<float>& B, float scaling, int64_t N, int64_t O, int64_t r) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o) {
      double lora = 0.0, lora_abs = 0.0;
      for (int64_t j = 0; j < r; ++j) {
        double term = double(h[size_t(n * r + j)]) * B[size_t(o * r + j)];
        lora += term;
        lora_abs += std::fabs(term);
      }
      ref.out[size_t(n * O + o)] += bias[size_t(o)] + double(scaling) * lora;
      ref.magnitude[size_t(n * O + o)] += std::fabs(bias[size_t(o)]) + std::fabs(double(scaling)) * lora_abs;
    }
}

// Exact product x W^T of the unquantised operands, in float64.
std::vector<double> exact_product(const std::vector<float>& x, const std::vector<float>& w, int64_t N, int64_t K,
                                  int64_t O) {
  std::vector<double> out(size_t(N * O), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t k = 0; k < K; ++k) out[size_t(n * O + o)] += double(x[size_t(n * K + k)]) * w[size_t(o * K + k)];
  return out;
}

// ||got - want|| / ||want|| over rows [n0, n1) of an [N, O] result.
double relative_error(const std::vector<float>& got, const std::vector<double>& want, int64_t O, int64_t n0,
                      int64_t n1) {
  double diff = 0.0, norm = 0.0;
  for (int64_t i = n0 * O; i < n1 * O; ++i) {
    diff += (got[size_t(i)] - want[size_t(i)]) * (got[size_t(i)] - want[size_t(i)]);
    norm += want[size_t(i)] * want[size_t(i)];
  }
  return std::sqrt(diff / norm);
}

std::vector<float> run_forward(CpuBackend& backend, const Tensor& x, const QuantWeight& w, float threshold,
                               DType out_dtype = DType::f32, const Int8Epilogue& epilogue = {}) {
  Tensor out = backend.empty({x.rows(), w.q.dim(0)}, out_dtype, MemCategory::activations);
  backend.int8_linear_forward(out, x, w.q, w.scales, threshold, epilogue);
  return read(out);
}

}  // namespace

TEST_CASE("quantize_rows_int8 matches the float64 quantiser exactly") {
  HostAllocator host;
  CpuBackend backend(host);
  const int64_t R = 7, K = 37;
  std::vector<float> x = gaussian(R * K, 1.5f, 1);
  for (int64_t k = 0; k < K; ++k) x[size_t(3 * K + k)] = 0.0f;  // an all-zero row
  // Row 5 has absmax 127, so codes are x itself: ties must round to even.
  for (int64_t k = 0; k < K; ++k) x[size_t(5 * K + k)] = float(k % 7) - 3.5f;
  x[size_t(5 * K)] = 127.0f;
  for (DType dtype : {DType::f32, DType::bf16}) {
    CAPTURE(dtype_name(dtype));
    Tensor xt = make(backend, {R, K}, x, dtype);
    std::vector<float> xr = read(xt);  // the values as stored (bf16-rounded)
    Tensor q = backend.empty({R, K}, DType::i8, MemCategory::activations);
    Tensor scales = backend.empty({R}, DType::f32, MemCategory::activations);
    backend.quantize_rows_int8(q, scales, xt);
    for (int64_t r = 0; r < R; ++r) {
      std::vector<int> codes;
      double s = quantize_ref(xr.data() + r * K, K, codes);
      CHECK(double(scales.ptr<float>()[r]) == s);
      for (int64_t k = 0; k < K; ++k) CHECK(int(q.ptr<int8_t>()[r * K + k]) == codes[size_t(k)]);
    }
  }
  Tensor q = backend.empty({R, K}, DType::i8, MemCategory::activations);
  Tensor scales = backend.empty({R}, DType::f32, MemCategory::activations);
  backend.quantize_rows_int8(q, scales, make(backend, {R, K}, x));
  CHECK(scales.ptr<float>()[3] == 0.0f);
  for (int64_t k = 0; k < K; ++k) CHECK(q.ptr<int8_t>()[3 * K + k] == 0);
  // -3.5 -> -4, -2.5 -> -2, -1.5 -> -2, -0.5 -> 0, 0.5 -> 0, 1.5 -> 2, 2.5 -> 2.
  const int8_t* row5 = q.ptr<int8_t>() + 5 * K;
  CHECK(row5[0] == 127);
  CHECK(row5[1] == -2);
  CHECK(row5[2] == -2);
  CHECK(row5[3] == 0);
  CHECK(row5[4] == 0);
  CHECK(row5[5] == 2);
  CHECK(row5[6] == 2);
}

// Ties x * 127 / s = k + 1/2 exactly at scales s = 127 * t * 2^e (t odd),
// where the reciprocal 1 / s is inexact, and the floats next to each tie:
// the codes are the exact quotient's round-half-even, as float64 division
// gives, through the vector loops and their tails (K = 263), in f32 and bf16
// inputs and in the forward's quantisation of x (its codes seen through a
// one-hot weight).
TEST_CASE("quantize_rows_int8 rounds ties and near-ties as the exact quotient, at any scale") {
  HostAllocator host;
  CpuBackend backend(host);
  const int64_t K = 263;
  const int odd[] = {1, 3, 5, 7, 9, 11, 13, 25, 63, 127, 255, 1023};
  const int exponents[] = {-20, -7, -1, 0, 3, 11};
  std::mt19937 rng(11);
  std::vector<float> x;
  int64_t R = 0;
  for (int t : odd)
    for (int e : exponents) {
      const float s = std::ldexp(127.0f * float(t), e);
      std::vector<float> row(static_cast<size_t>(K));
      row[0] = (R % 2) ? -s : s;
      for (int64_t k = 1; k < K; ++k) {
        const int half_steps = int(rng() % 254) - 127;  // tie at (half_steps + 1/2), within +-127
        const float tie = std::ldexp(float(t) * float(2 * half_steps + 1), e - 1);
        const int kind = int(k % 3);
        row[size_t(k)] = kind == 0 ? tie : std::nextafter(tie, kind == 1 ? 2.0f * s : -2.0f * s);
        if (std::fabs(row[size_t(k)]) > s) row[size_t(k)] = tie;
      }
      x.insert(x.end(), row.begin(), row.end());
      ++R;
    }
  Tensor xt = make(backend, {R, K}, x);
  Tensor q = backend.empty({R, K}, DType::i8, MemCategory::activations);
  Tensor scales = backend.empty({R}, DType::f32, MemCategory::activations);
  backend.quantize_rows_int8(q, scales, xt);
  int64_t ties = 0, mismatches = 0;
  for (int64_t r = 0; r < R; ++r) {
    std::vector<int> codes;
    const double s = quantize_ref(x.data() + r * K, K, codes);
    CHECK(double(scales.ptr<float>()[r]) == s);
    for (int64_t k = 0; k < K; ++k) {
      const double quotient = double(x[size_t(r * K + k)]) * 127.0 / s;
      ties += quotient - std::floor(quotient) == 0.5;
      mismatches += int(q.ptr<int8_t>()[r * K + k]) != codes[size_t(k)];
    }
  }
  CHECK(ties > 5000);
  CHECK(mismatches == 0);
  // The forward's codes for x, read back through a weight that is 127 at
  // (o, o) and 0 elsewhere with scale 127: out[n, o] = code(x[n, o]) * s_x[n] / 127.
  const int64_t O = 64;
  Tensor w = backend.empty({O, K}, DType::i8, MemCategory::weights);
  Tensor w_scales = backend.empty({O}, DType::f32, MemCategory::weights);
  std::fill_n(w.ptr<int8_t>(), O * K, int8_t(0));
  for (int64_t o = 0; o < O; ++o) w.ptr<int8_t>()[o * K + o] = 127, w_scales.ptr<float>()[o] = 127.0f;
  Tensor out = backend.empty({R, O}, DType::f32, MemCategory::activations);
  backend.int8_linear_forward(out, xt, w, w_scales, 0.0f);
  mismatches = 0;
  for (int64_t r = 0; r < R; ++r) {
    std::vector<int> codes;
    const double s = quantize_ref(x.data() + r * K, K, codes);
    for (int64_t o = 0; o < O; ++o) {
      const float expected = float(127 * codes[size_t(o)]) * (float(s) * 127.0f * (1.0f / (127.0f * 127.0f)));
      mismatches += out.ptr<float>()[r * O + o] != expected;
    }
  }
  CHECK(mismatches == 0);
}

// f32 vs the float64 decomposition: the integer product is exact in both, so
// only f32 rounding of the dequantisation (a few ulps) and of the outlier sum
// (one ulp per term) differ: |got - ref| <= 1e-5 * sum of |terms|.
TEST_CASE("int8_linear_forward matches the float64 LLM.int8() decomposition") {
  HostAllocator host;
  CpuBackend backend(host);
  const int64_t N = 13, K = 75, O = 27;
  std::vector<float> w = gaussian(O * K, 0.05f, 2);
  QuantWeight qw = quantize_weight(backend, w, O, K);
  std::vector<float> x = gaussian(N * K, 1.0f, 3);
  x[size_t(2 * K + 9)] = 8.0f;     // two outlier columns at threshold 6
  x[size_t(11 * K + 40)] = -6.0f;  // exactly at the threshold: >= counts
  for (DType dtype : {DType::f32, DType::bf16})
    for (float threshold : {0.0f, 6.0f}) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(threshold);
      Tensor xt = make(backend, {N, K}, x, dtype);
      ForwardRef ref = int8_forward_ref(read(xt), qw, N, K, O, threshold);
      CHECK(ref.outlier_columns.size() == (threshold > 0.0f ? 2u : 0u));
      std::vector<float> got = run_forward(backend, xt, qw, threshold);
      for (size_t i = 0; i < got.size(); ++i) CHECK(std::fabs(got[i] - ref.out[i]) <= 1e-5 * ref.magnitude[i]);
    }
}

// The epilogue (bias and LoRA update, kernels/backend.h) against the float64
// decomposition plus bias + scaling * h B^T: one f32 sum of all the terms,
// |got - ref| <= 1e-5 * sum of |terms|, over several 128-row x 32-column CPU
// tasks; a bf16 out is that f32 value rounded once.
TEST_CASE("int8_linear_forward's epilogue adds the bias and the LoRA update in f32") {
  HostAllocator host;
  CpuBackend backend(host);
  const int64_t N = 131, K = 75, O = 67, r = 5;
  const float scaling = 16.0f / float(r);
  QuantWeight qw = quantize_weight(backend, gaussian(O * K, 0.05f, 20), O, K);
  std::vector<float> x = gaussian(N * K, 1.0f, 21);
  x[size_t(2 * K + 9)] = 8.0f;
  x[size_t(130 * K + 40)] = -6.5f;
  const std::vector<float> bias = gaussian(O, 0.5f, 22), h = gaussian(N * r, 1.0f, 23), B = gaussian(O * r, 0.1f, 24);
  for (DType dtype : {DType::f32, DType::bf16})
    for (bool with_bias : {false, true})
      for (bool with_lora : {false, true}) {
        CAPTURE(dtype_name(dtype));
        CAPTURE(with_bias);
        CAPTURE(with_lora);
        Tensor xt = make(backend, {N, K}, x, dtype), bias_t = make(backend, {O}, bias, dtype);
        Tensor h_t = make(backend, {N, r}, h, dtype), B_t = make(backend, {O, r}, B, dtype);
        Int8Epilogue epilogue;
        if (with_bias) epilogue.bias = &bias_t;
        if (with_lora) epilogue = {epilogue.bias, &h_t, &B_t, scaling};
        ForwardRef ref = int8_forward_ref(read(xt), qw, N, K, O, 6.0f);
        REQUIRE(ref.outlier_columns.size() == 2);
        add_epilogue_ref(ref, with_bias ? read(bias_t) : std::vector<float>(size_t(O), 0.0f), read(h_t), read(B_t),
                         with_lora ? scaling : 0.0f, N, O, r);
        std::vector<float> got = run_forward(backend, xt, qw, 6.0f, DType::f32, epilogue);
        size_t bad = 0;
        for (size_t i = 0; i < got.size(); ++i) bad += !(std::fabs(got[i] - ref.out[i]) <= 1e-5 * ref.magnitude[i]);
        CHECK(bad == 0);
        std::vector<float> bf16_out = run_forward(backend, xt, qw, 6.0f, DType::bf16, epilogue);
        size_t not_rounded_once = 0;
        for (size_t i = 0; i < got.size(); ++i) not_rounded_once += bf16_out[i] != bf16_to_f32(f32_to_bf16(got[i]));
        CHECK(not_rounded_once == 0);
      }
}

// oneDNN computes the same exact int32 product as the reference kernels and
// the epilogue is shared, so the two GEMMs agree bit for bit: with outliers,
// bias, LoRA and bf16 operands, and across oneDNN's row blocks of the int32
// product (N * O above kernels/int8_tiles.h's 8 Mi elements in the second shape).
TEST_CASE("int8_linear_forward: oneDNN and the reference kernels agree bit for bit") {
  HostAllocator host;
  CpuBackend reference(host, CpuGemm::reference);
  if (!onednn_built()) {
    MESSAGE("built without oneDNN: only the reference GEMM exists");
    return;
  }
  CpuBackend onednn(host, CpuGemm::onednn);
  struct Case { int64_t N, K, O; };
  for (Case c : {Case{131, 301, 67}, Case{2053, 19, 4099}}) {
    const int64_t r = 3;
    CAPTURE(c.N);
    QuantWeight qw = quantize_weight(reference, gaussian(c.O * c.K, 0.05f, 30), c.O, c.K);
    std::vector<float> x = gaussian(c.N * c.K, 1.0f, 31);
    x[size_t(5 * c.K + 3)] = 7.5f;  // one outlier column
    for (DType dtype : {DType::f32, DType::bf16}) {
      CAPTURE(dtype_name(dtype));
      Tensor xt = make(reference, {c.N, c.K}, x, dtype), bias = make(reference, {c.O}, gaussian(c.O, 0.5f, 32), dtype);
      Tensor h = make(reference, {c.N, r}, gaussian(c.N * r, 1.0f, 33), dtype);
      Tensor B = make(reference, {c.O, r}, gaussian(c.O * r, 0.1f, 34), dtype);
      const Int8Epilogue epilogue{&bias, &h, &B, 2.0f};
      std::vector<float> want = run_forward(reference, xt, qw, 6.0f, dtype, epilogue);
      std::vector<float> got = run_forward(onednn, xt, qw, 6.0f, dtype, epilogue);
      REQUIRE(got.size() == want.size());
      size_t differ = 0;
      for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
      CHECK(differ == 0);
    }
  }
}

// A row-parallel layer's shard of x: columns [k0, k0 + count) of x [N, K].
std::vector<float> column_shard(const std::vector<float>& x, int64_t N, int64_t K, int64_t k0, int64_t count) {
  std::vector<float> shard;
  for (int64_t n = 0; n < N; ++n)
    shard.insert(shard.end(), x.begin() + n * K + k0, x.begin() + n * K + k0 + count);
  return shard;
}

// The same shard of a quantised weight [O, K]: its codes, the whole rows' scales.
QuantWeight weight_shard(CpuBackend& backend, const QuantWeight& w, int64_t O, int64_t K, int64_t k0, int64_t count) {
  QuantWeight shard;
  for (int64_t o = 0; o < O; ++o)
    shard.codes.insert(shard.codes.end(), w.codes.begin() + o * K + k0, w.codes.begin() + o * K + k0 + count);
  shard.s = w.s;
  shard.q = backend.empty({O, count}, DType::i8, MemCategory::weights);
  std::memcpy(shard.q.data, shard.codes.data(), shard.codes.size());
  shard.scales = make(backend, {O}, w.s);
  return shard;
}

// x [13, 75] with outliers at threshold 6 in both edge columns (0 and 74)
// and column 40, sharded as a row-parallel layer's 3 ranks see it.
constexpr int64_t kShardRows = 13, kShardK = 75, kShards = 3;
std::vector<float> sharded_x() {
  std::vector<float> x = gaussian(kShardRows * kShardK, 1.0f, 40);
  x[size_t(0)] = 8.0f;
  x[size_t(12 * kShardK + 74)] = -6.0f;
  x[size_t(5 * kShardK + 40)] = 9.5f;
  x[size_t(7 * kShardK + 20)] = 4.5f;  // no outlier: row 7's absmax, in shard 0 only
  return x;
}

TEST_CASE("int8_row_absmax is the absmax over the non-outlier columns, and the shards' maximum is the whole row's") {
  HostAllocator host;
  CpuBackend backend(host);
  const int64_t N = kShardRows, K = kShardK, Ks = K / kShards;
  for (DType dtype : {DType::f32, DType::bf16})
    for (float threshold : {0.0f, 6.0f}) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(threshold);
      const std::vector<float> x = read(make(backend, {N, K}, sharded_x(), dtype));  // as stored
      Tensor whole = backend.empty({N}, DType::f32, MemCategory::activations);
      backend.int8_row_absmax(whole, make(backend, {N, K}, x, dtype), threshold);
      const ForwardRef outliers = int8_forward_ref(x, {}, N, K, 0, threshold);  // O = 0: the outlier columns only
      std::vector<double> want(size_t(N), 0.0);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) {
          const bool outlier = std::count(outliers.outlier_columns.begin(), outliers.outlier_columns.end(), k) > 0;
          if (!outlier) want[size_t(n)] = std::max(want[size_t(n)], std::fabs(double(x[size_t(n * K + k)])));
        }
      std::vector<float> shard_max(size_t(N), 0.0f);
      for (int64_t r = 0; r < kShards; ++r) {
        Tensor part = backend.empty({N}, DType::f32, MemCategory::activations);
        backend.int8_row_absmax(part, make(backend, {N, Ks}, column_shard(x, N, K, r * Ks, Ks), dtype), threshold);
        for (int64_t n = 0; n < N; ++n) shard_max[size_t(n)] = std::max(shard_max[size_t(n)], part.ptr<float>()[n]);
      }
      for (int64_t n = 0; n < N; ++n) {
        CAPTURE(n);
        CHECK(double(whole.ptr<float>()[n]) == want[size_t(n)]);
        CHECK(shard_max[size_t(n)] == whole.ptr<float>()[n]);
      }
      CHECK(double(whole.ptr<float>()[0]) == (threshold > 0.0f ? want[0] : 8.0));
      CHECK(outliers.outlier_columns.size() == (threshold > 0.0f ? 3u : 0u));
    }
}

// Each rank of a row-parallel layer multiplies its columns of x with the
// whole rows' scales: each shard's output is the float64 decomposition of
// its columns with those scales (1e-5 of the sum of |terms|, as above), and
// the shards' outputs add up to the whole layer's decomposition, which they
// partition exactly in real arithmetic (the integer products split by
// columns, s_x and s_w shared, the outlier terms split by columns). Their
// own row scales instead miss it: the check can fail.
TEST_CASE("int8_linear_forward with the whole rows' scales: row-parallel shards add up to one process's product") {
  HostAllocator host;
  CpuBackend backend(host);
  const int64_t N = kShardRows, K = kShardK, O = 27, Ks = K / kShards;
  const std::vector<float> x = sharded_x();
  QuantWeight qw = quantize_weight(backend, gaussian(O * K, 0.05f, 41), O, K);
  const ForwardRef whole = int8_forward_ref(x, qw, N, K, O, 6.0f);
  REQUIRE(whole.outlier_columns.size() == 3);
  Tensor row_absmax = backend.empty({N}, DType::f32, MemCategory::activations);
  backend.int8_row_absmax(row_absmax, make(backend, {N, K}, x), 6.0f);
  const std::vector<float> given = read(row_absmax);
  std::vector<double> sum(size_t(N * O), 0.0), own_sum(size_t(N * O), 0.0);
  for (int64_t r = 0; r < kShards; ++r) {
    CAPTURE(r);
    const std::vector<float> xs = column_shard(x, N, K, r * Ks, Ks);
    const QuantWeight ws = weight_shard(backend, qw, O, K, r * Ks, Ks);
    const Tensor xt = make(backend, {N, Ks}, xs);
    Int8Epilogue epilogue;
    epilogue.row_absmax = &row_absmax;
    const std::vector<float> got = run_forward(backend, xt, ws, 6.0f, DType::f32, epilogue);
    const ForwardRef ref = int8_forward_ref(xs, ws, N, Ks, O, 6.0f, given);
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) bad += !(std::fabs(got[i] - ref.out[i]) <= 1e-5 * ref.magnitude[i]);
    CHECK(bad == 0);
    const std::vector<float> own = run_forward(backend, xt, ws, 6.0f);
    for (size_t i = 0; i < got.size(); ++i) {
      sum[i] += got[i];
      own_sum[i] += own[i];
    }
  }
  size_t bad = 0, own_bad = 0;
  for (size_t i = 0; i < sum.size(); ++i) {
    bad += !(std::fabs(sum[i] - whole.out[i]) <= 1e-5 * whole.magnitude[i]);
    own_bad += !(std::fabs(own_sum[i] - whole.out[i]) <= 1e-5 * whole.magnitude[i]);
  }
  CHECK(bad == 0);
  CHECK(own_bad > 0);
}

// A layer run over blocks of rows (the MLP in chunks of tokens) flags the
// outlier columns over every block first: int8_outlier_columns ORs each
// block's into the flags, which are then the whole batch's (the float64
// reference's columns), and each block's forward and row scales with them
// are the whole call's rows bit for bit. Without them the blocks that hold
// no outlier of their own quantise those columns: the check can fail.
TEST_CASE("int8_linear_forward over blocks of rows with the whole batch's outlier flags is the whole call's") {
  HostAllocator host;
  CpuBackend backend(host);
  const int64_t N = kShardRows, K = kShardK, O = 27, block_rows = 4;
  const QuantWeight qw = quantize_weight(backend, gaussian(O * K, 0.05f, 42), O, K);
  for (DType dtype : {DType::f32, DType::bf16}) {
    CAPTURE(dtype_name(dtype));
    const Tensor x = make(backend, {N, K}, sharded_x(), dtype);
    const std::vector<float> whole = run_forward(backend, x, qw, 6.0f, DType::f32);
    Tensor whole_absmax = backend.empty({N}, DType::f32, MemCategory::activations);
    backend.int8_row_absmax(whole_absmax, x, 6.0f);
    Tensor flags = make(backend, {K}, std::vector<float>(size_t(K), 0.0f), DType::i32);
    for (int64_t first = 0; first < N; first += block_rows)
      backend.int8_outlier_columns(flags, x.slice_rows(first, std::min(block_rows, N - first)), 6.0f);
    std::vector<int64_t> flagged;
    for (int64_t k = 0; k < K; ++k)
      if (flags.ptr<int32_t>()[k] != 0) flagged.push_back(k);
    CHECK(flagged == int8_forward_ref(read(x), {}, N, K, 0, 6.0f).outlier_columns);
    Int8Epilogue epilogue;
    epilogue.outlier_flags = &flags;
    size_t differs = 0, differs_alone = 0;
    for (int64_t first = 0; first < N; first += block_rows) {
      const int64_t rows = std::min(block_rows, N - first);
      const Tensor block = x.slice_rows(first, rows);
      const std::vector<float> got = run_forward(backend, block, qw, 6.0f, DType::f32, epilogue);
      const std::vector<float> alone = run_forward(backend, block, qw, 6.0f, DType::f32);
      Tensor absmax = backend.empty({rows}, DType::f32, MemCategory::activations);
      backend.int8_row_absmax(absmax, block, 6.0f, &flags);
      for (int64_t i = 0; i < rows * O; ++i) {
        differs += got[size_t(i)] != whole[size_t(first * O + i)];
        differs_alone += alone[size_t(i)] != whole[size_t(first * O + i)];
      }
      for (int64_t n = 0; n < rows; ++n) differs += absmax.ptr<float>()[n] != whole_absmax.ptr<float>()[first + n];
    }
    CHECK(differs == 0);
    CHECK(differs_alone > 0);
  }
}

// Backend::int8_quantize_input of x [N, K] into fresh tensors.
Int8Input quantize_input(CpuBackend& backend, const Tensor& x, float threshold, const Tensor* flags = nullptr) {
  const int64_t N = x.rows(), K = x.cols();
  Int8Input input{backend.empty({N, K}, DType::i8, MemCategory::activations),
                  backend.empty({N}, DType::f32, MemCategory::activations),
                  backend.empty({int8_outlier_list_elements(K)}, DType::i32, MemCategory::activations)};
  backend.int8_quantize_input(input, x, threshold, flags);
  return input;
}

// The quantised input is what the float64 reference makes of x: the outlier
// columns (count, ascending list, bit mask), each row's absmax over the
// others, the codes round(x * 127 / s) with those columns 0. A forward
// given it is the forward without it bit for bit, for several weights (the
// linears that share it) and over blocks of rows with the batch's flags.
// Given another x's, the forward differs: the op reads what it is given.
TEST_CASE("int8_quantize_input is the forward's own quantisation, and a forward given it is the forward without it") {
  HostAllocator host;
  CpuBackend backend(host);
  const int64_t N = kShardRows, K = kShardK, O = 27, r = 3;
  for (DType dtype : {DType::f32, DType::bf16})
    for (float threshold : {0.0f, 6.0f}) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(threshold);
      const Tensor x = make(backend, {N, K}, sharded_x(), dtype);
      const std::vector<float> xs = read(x);
      const Int8Input input = quantize_input(backend, x, threshold);
      CHECK(input.threshold == threshold);
      const ForwardRef outliers = int8_forward_ref(xs, {}, N, K, 0, threshold);
      const int32_t* list = input.outlier_columns.ptr<const int32_t>();
      REQUIRE(size_t(list[0]) == outliers.outlier_columns.size());
      for (size_t c = 0; c < outliers.outlier_columns.size(); ++c) CHECK(list[1 + c] == outliers.outlier_columns[c]);
      const uint32_t* mask = reinterpret_cast<const uint32_t*>(list + 1 + K);
      for (int64_t k = 0; k < K; ++k) {
        const bool outlier = std::count(outliers.outlier_columns.begin(), outliers.outlier_columns.end(), k) > 0;
        CHECK(bool((mask[k / 32] >> (k % 32)) & 1u) == outlier);
      }
      size_t bad = 0;
      for (int64_t n = 0; n < N; ++n) {
        std::vector<float> row(xs.begin() + n * K, xs.begin() + (n + 1) * K);
        for (int64_t c : outliers.outlier_columns) row[size_t(c)] = 0.0f;
        std::vector<int> codes;
        bad += quantize_ref(row.data(), K, codes) != double(input.row_absmax.ptr<float>()[n]);
        for (int64_t k = 0; k < K; ++k) bad += codes[size_t(k)] != input.codes.ptr<int8_t>()[n * K + k];
      }
      CHECK(bad == 0);
      for (uint64_t seed : {50, 51, 52}) {
        const QuantWeight qw = quantize_weight(backend, gaussian(O * K, 0.05f, seed), O, K);
        Tensor bias = make(backend, {O}, gaussian(O, 0.5f, seed + 10), dtype);
        Tensor h = make(backend, {N, r}, gaussian(N * r, 1.0f, seed + 20), dtype);
        Tensor B = make(backend, {O, r}, gaussian(O * r, 0.1f, seed + 30), dtype);
        Int8Epilogue epilogue{&bias, &h, &B, 2.0f};
        const std::vector<float> want = run_forward(backend, x, qw, threshold, dtype, epilogue);
        epilogue.input = &input;
        CHECK(run_forward(backend, x, qw, threshold, dtype, epilogue) == want);
      }
    }
  const QuantWeight qw = quantize_weight(backend, gaussian(O * K, 0.05f, 53), O, K);
  const Tensor x = make(backend, {N, K}, sharded_x()), other = make(backend, {N, K}, gaussian(N * K, 1.0f, 54));
  const Int8Input others = quantize_input(backend, other, 6.0f);
  Int8Epilogue given;
  given.input = &others;
  CHECK(run_forward(backend, x, qw, 6.0f, DType::f32, given) != run_forward(backend, x, qw, 6.0f));

  // Blocks of rows with the whole batch's flags, as the chunked MLP runs them.
  Tensor flags = make(backend, {K}, std::vector<float>(size_t(K), 0.0f), DType::i32);
  backend.int8_outlier_columns(flags, x, 6.0f);
  const std::vector<float> whole = run_forward(backend, x, qw, 6.0f);
  size_t differs = 0;
  for (int64_t first = 0; first < N; first += 4) {
    const Tensor block = x.slice_rows(first, std::min<int64_t>(4, N - first));
    const Int8Input input = quantize_input(backend, block, 6.0f, &flags);
    given.input = &input;
    const std::vector<float> got = run_forward(backend, block, qw, 6.0f, DType::f32, given);
    for (size_t i = 0; i < got.size(); ++i) differs += got[i] != whole[size_t(first * O) + i];
  }
  CHECK(differs == 0);
}

TEST_CASE("int8_linear_forward checks the epilogue's shapes, and int8_quantize_input its operands") {
  HostAllocator host;
  CpuBackend backend(host);
  QuantWeight qw = quantize_weight(backend, gaussian(3 * 8, 0.05f, 25), 3, 8);
  Tensor x = make(backend, {2, 8}, gaussian(16, 1.0f, 26));
  Tensor out = backend.empty({2, 3}, DType::f32, MemCategory::activations);
  Tensor bias = make(backend, {4}, gaussian(4, 1.0f, 27)), h = make(backend, {2, 4}, gaussian(8, 1.0f, 28));
  Tensor B = make(backend, {3, 4}, gaussian(12, 1.0f, 29)), B_wide = make(backend, {3, 5}, gaussian(15, 1.0f, 30));
  auto forward = [&](const Int8Epilogue& e) { backend.int8_linear_forward(out, x, qw.q, qw.scales, 6.0f, e); };
  CHECK_THROWS_WITH_AS(forward({&bias}), doctest::Contains("bias has shape"), Error);
  CHECK_THROWS_WITH_AS(forward({nullptr, &h}), doctest::Contains("lora_h and lora_B come together"), Error);
  CHECK_THROWS_WITH_AS(forward({nullptr, &h, &B_wide, 1.0f}), doctest::Contains("lora_h has shape"), Error);
  CHECK_THROWS_WITH_AS(forward({nullptr, &h, &h, 1.0f}), doctest::Contains("lora_B has shape"), Error);
  CHECK_NOTHROW(forward({nullptr, &h, &B, 1.0f}));
  Tensor absmax3 = make(backend, {3}, gaussian(3, 1.0f, 31));
  Tensor absmax_i8 = backend.empty({2}, DType::i8, MemCategory::activations);
  Int8Epilogue given;
  given.row_absmax = &absmax3;
  CHECK_THROWS_WITH_AS(forward(given), doctest::Contains("row_absmax has shape"), Error);
  given.row_absmax = &absmax_i8;
  CHECK_THROWS_WITH_AS(forward(given), doctest::Contains("row_absmax must be f32"), Error);
  CHECK_THROWS_WITH_AS(backend.int8_row_absmax(absmax3, x, 6.0f),
                       doctest::Contains("int8_row_absmax: absmax has shape"), Error);
  // A quantised input (int8_quantize_input) and the forward given it.
  Int8Input input = quantize_input(backend, x, 6.0f);
  given = {};
  given.input = &input;
  CHECK_NOTHROW(backend.int8_linear_forward(out, x, qw.q, qw.scales, 6.0f, given));
  CHECK_THROWS_WITH_AS(backend.int8_linear_forward(out, x, qw.q, qw.scales, 5.0f, given),
                       doctest::Contains("the quantised input was made with threshold 6, the call's is 5"), Error);
  const Tensor flags = make(backend, {8}, std::vector<float>(8, 0.0f), DType::i32);
  given.outlier_flags = &flags;
  CHECK_THROWS_WITH_AS(backend.int8_linear_forward(out, x, qw.q, qw.scales, 6.0f, given),
                       doctest::Contains("a quantised input excludes row_absmax and outlier_flags"), Error);
  Int8Input short_list = input;
  short_list.outlier_columns = backend.empty({9}, DType::i32, MemCategory::activations);
  CHECK_THROWS_WITH_AS(backend.int8_quantize_input(short_list, x, 6.0f),
                       doctest::Contains("int8_quantize_input: input.outlier_columns has shape [9]"), Error);
  Int8Input f32_codes = input;
  f32_codes.codes = backend.empty({2, 8}, DType::f32, MemCategory::activations);
  CHECK_THROWS_WITH_AS(backend.int8_quantize_input(f32_codes, x, 6.0f),
                       doctest::Contains("input.codes must be i8"), Error);
  Int8Input aliased = input;
  aliased.row_absmax = Tensor::view_of(x.data, {2}, DType::f32);
  CHECK_THROWS_WITH_AS(backend.int8_quantize_input(aliased, x, 6.0f),
                       doctest::Contains("input's tensors must not alias each other or x"), Error);
}

// Quantisation noise: each of x and W is rounded to a step of absmax/127,
// absmax ~ 3.5 sigma for these row lengths, so each operand carries a
// relative error of about 3.5 / 127 / sqrt(12) = 0.8% and the product about
// sqrt(2) * 0.8% = 1.1%. The bound is 2%.
TEST_CASE("int8_linear_forward is within 2% of the exact product on gaussian data") {
  HostAllocator host;
  CpuBackend backend(host);
  const int64_t N = 33, K = 515, O = 67;
  std::vector<float> w = gaussian(O * K, 0.02f, 4);
  std::vector<float> x = gaussian(N * K, 1.0f, 5);
  QuantWeight qw = quantize_weight(backend, w, O, K);
  std::vector<float> got = run_forward(backend, make(backend, {N, K}, x), qw, 6.0f);
  double error = relative_error(got, exact_product(x, w, N, K, O), O, 0, N);
  MESSAGE("relative error vs exact product: ", error);
  CHECK(error < 0.02);
  CHECK(error > 0.002);  // the weight really is quantised
}

TEST_CASE("outlier columns go through the 16-bit path only at or above the threshold") {
  HostAllocator host;
  CpuBackend backend(host);
  const int64_t N = 17, K = 131, O = 29;
  std::vector<float> w = gaussian(O * K, 0.05f, 6);
  QuantWeight qw = quantize_weight(backend, w, O, K);
  std::vector<float> x = gaussian(N * K, 0.5f, 7);

  // 6.5 in column 10 of row 4: with threshold 6 the column leaves the int8
  // product, so row 4 keeps its small absmax (~1.5 instead of 6.5, a 4x finer
  // step) and the outlier itself meets only the weight's rounding.
  std::vector<float> planted = x;
  planted[size_t(4 * K + 10)] = 6.5f;
  Tensor xt = make(backend, {N, K}, planted);
  std::vector<double> exact = exact_product(planted, w, N, K, O);
  std::vector<float> with_outliers = run_forward(backend, xt, qw, 6.0f);
  std::vector<float> without = run_forward(backend, xt, qw, 0.0f);
  ForwardRef ref = int8_forward_ref(planted, qw, N, K, O, 6.0f);
  REQUIRE(ref.outlier_columns == std::vector<int64_t>{10});
  for (size_t i = 0; i < with_outliers.size(); ++i)
    CHECK(std::fabs(with_outliers[i] - ref.out[i]) <= 1e-5 * ref.magnitude[i]);
  double error_with = relative_error(with_outliers, exact, O, 4, 5);
  double error_without = relative_error(without, exact, O, 4, 5);
  MESSAGE("row 4 relative error: threshold 6: ", error_with, ", threshold 0: ", error_without);
  CHECK(error_with < 0.5 * error_without);

  // 5.9 stays below the threshold: the same result as with outliers disabled.
  planted[size_t(4 * K + 10)] = 5.9f;
  xt = make(backend, {N, K}, planted);
  CHECK(run_forward(backend, xt, qw, 6.0f) == run_forward(backend, xt, qw, 0.0f));

  // Threshold 0 disables the outlier path even for huge values.
  planted[size_t(4 * K + 10)] = 100.0f;
  xt = make(backend, {N, K}, planted);
  ForwardRef no_outliers = int8_forward_ref(planted, qw, N, K, O, 0.0f);
  std::vector<float> got = run_forward(backend, xt, qw, 0.0f);
  for (size_t i = 0; i < got.size(); ++i)
    CHECK(std::fabs(got[i] - no_outliers.out[i]) <= 1e-5 * no_outliers.magnitude[i]);

  // A bf16 output is the f32 result rounded once.
  std::vector<float> f32_out = run_forward(backend, xt, qw, 6.0f);
  std::vector<float> bf16_out = run_forward(backend, xt, qw, 6.0f, DType::bf16);
  for (size_t i = 0; i < got.size(); ++i) CHECK(bf16_out[i] == bf16_to_f32(f32_to_bf16(f32_out[i])));
}

// dx = dout @ dequant(W) in f32 over O = 300 terms (two dequantised tiles of
// up to 256 weight rows): |got - ref| <= 1e-5 * sum of |terms|; a bf16 dx
// adds one rounding (2^-8 relative). With bf16 dout the weight enters as its
// f32 dequantisation rounded to bf16, as on the GPU.
TEST_CASE("int8_linear_backward matches the float64 product with the dequantised weight") {
  HostAllocator host;
  CpuBackend backend(host);
  const int64_t N = 19, O = 300, K = 45;
  QuantWeight qw = quantize_weight(backend, gaussian(O * K, 0.05f, 8), O, K);
  std::vector<float> prior = gaussian(N * K, 1.0f, 10);
  for (DType dout_dtype : {DType::f32, DType::bf16}) {
    Tensor dout_t = make(backend, {N, O}, gaussian(N * O, 1.0f, 9), dout_dtype);
    std::vector<float> dout = read(dout_t);
    std::vector<double> ref(size_t(N * K), 0.0), magnitude(size_t(N * K), 0.0);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k)
        for (int64_t o = 0; o < O; ++o) {
          float w = float(qw.codes[size_t(o * K + k)]) * qw.s[size_t(o)] / 127.0f;
          if (dout_dtype == DType::bf16) w = bf16_to_f32(f32_to_bf16(w));
          double term = double(dout[size_t(n * O + o)]) * w;
          ref[size_t(n * K + k)] += term;
          magnitude[size_t(n * K + k)] += std::fabs(term);
        }
    for (DType dtype : {DType::f32, DType::bf16})
      for (bool accumulate : {false, true}) {
        CAPTURE(dtype_name(dout_dtype));
        CAPTURE(dtype_name(dtype));
        CAPTURE(accumulate);
        std::vector<float> start = accumulate ? prior : std::vector<float>(size_t(N * K), NAN);
        Tensor dx = make(backend, {N, K}, start, dtype);
        std::vector<float> before = read(dx);
        backend.int8_linear_backward(dx, dout_t, qw.q, qw.scales, accumulate);
        std::vector<float> got = read(dx);
        double rounding = dtype == DType::bf16 ? 1.0 / 256.0 : 0.0;
        for (size_t i = 0; i < got.size(); ++i) {
          double want = ref[i] + (accumulate ? double(before[i]) : 0.0);
          double scale = magnitude[i] + (accumulate ? std::fabs(before[i]) : 0.0);
          CHECK(std::fabs(got[i] - want) <= 1e-5 * scale + rounding * std::fabs(want));
        }
      }
  }
}
