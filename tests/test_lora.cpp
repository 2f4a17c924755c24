// LoRA (PEFT semantics) over a dense and an int8 base, against a float64
// reference that redraws the dropout mask with the shared hash; finite
// differences for dA and dB; initialisation and scaling; the dropout op.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/dropout_hash.h"
#include "kernels/op_profile.h"
#include "model/lora_linear.h"
#include "model/quant/int8.h"
#include "tests/host_tensors.h"

using namespace ft;
using ft::testing::gaussian;
using ft::testing::make;
using ft::testing::read;

namespace {

// A parameter with only its name set (value and grad assigned by the test).
Parameter named(const std::string& name) {
  Parameter p;
  p.name = name;
  return p;
}

// A trainable f32 parameter whose gradient starts at `grad` (checks +=).
void make_trainable(CpuBackend& backend, Parameter& p, const Shape& shape, const std::vector<float>& value,
                    const std::vector<float>& grad) {
  p.value = make(backend, shape, value);
  p.grad = make(backend, shape, grad);
}

double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// f32 products of a few dozen terms vs float64: 2e-5 of the tensor's largest
// value (f32 rounding is ~1e-7 relative per operation).
void check_close(const std::vector<float>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double tolerance = 2e-5 * max_abs(want);
  for (size_t i = 0; i < got.size(); ++i) CHECK(std::fabs(got[i] - want[i]) <= tolerance);
}

// y[N, O] = a[N, K] b[O, K]^T in float64 (b given as a function of (o, k)).
template <class B>
std::vector<double> matmul_nt(const std::vector<double>& a, B b, int64_t N, int64_t K, int64_t O) {
  std::vector<double> y(size_t(N * O), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t k = 0; k < K; ++k) y[size_t(n * O + o)] += a[size_t(n * K + k)] * b(o, k);
  return y;
}

struct Sizes {
  int64_t N, in, out, r;
};

// The LoRA branch in float64: xd = dropout(x) with the shared mask,
// h = xd A^T, y = scaling * h B^T; and its gradients for a given dout.
struct LoraRef {
  std::vector<double> y, dx, dA, dB;
};

LoraRef lora_ref(const std::vector<float>& x, const std::vector<float>& A, const std::vector<float>& B,
                 const std::vector<float>& dout, Sizes s, double scaling, float p, uint64_t seed) {
  std::vector<double> xd(size_t(s.N * s.in)), dy(dout.begin(), dout.end());
  for (size_t i = 0; i < xd.size(); ++i) xd[i] = dropout_keep(seed, i, p) ? x[i] / (1.0 - p) : 0.0;
  std::vector<double> h = matmul_nt(xd, [&](int64_t o, int64_t k) { return double(A[size_t(o * s.in + k)]); }, s.N,
                                    s.in, s.r);
  LoraRef ref;
  ref.y = matmul_nt(h, [&](int64_t o, int64_t k) { return scaling * B[size_t(o * s.r + k)]; }, s.N, s.r, s.out);
  // g = scaling * dout B [N, r]
  std::vector<double> g = matmul_nt(dy, [&](int64_t o, int64_t k) { return scaling * B[size_t(k * s.r + o)]; }, s.N,
                                    s.out, s.r);
  ref.dB.assign(size_t(s.out * s.r), 0.0);
  ref.dA.assign(size_t(s.r * s.in), 0.0);
  for (int64_t n = 0; n < s.N; ++n) {
    for (int64_t o = 0; o < s.out; ++o)
      for (int64_t j = 0; j < s.r; ++j) ref.dB[size_t(o * s.r + j)] += scaling * dy[size_t(n * s.out + o)] * h[size_t(n * s.r + j)];
    for (int64_t j = 0; j < s.r; ++j)
      for (int64_t k = 0; k < s.in; ++k) ref.dA[size_t(j * s.in + k)] += g[size_t(n * s.r + j)] * xd[size_t(n * s.in + k)];
  }
  ref.dx = matmul_nt(g, [&](int64_t k, int64_t j) { return double(A[size_t(j * s.in + k)]); }, s.N, s.r, s.in);
  for (size_t i = 0; i < ref.dx.size(); ++i) ref.dx[i] = dropout_keep(seed, i, p) ? ref.dx[i] / (1.0 - p) : 0.0;
  return ref;
}

std::vector<double> plus(const std::vector<double>& a, const std::vector<float>& b) {
  std::vector<double> sum(a);
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += b[i];
  return sum;
}

}  // namespace

TEST_CASE("LoraLinear forward and backward match float64 over a dense and an int8 base") {
  HostAllocator host;
  CpuBackend backend(host);
  const Sizes s{10, 37, 23, 4};
  const float scaling = lora_scaling(8.0, s.r, false);
  std::vector<float> w = gaussian(s.out * s.in, 0.1f, 1), x = gaussian(s.N * s.in, 1.0f, 2),
                     A = gaussian(s.r * s.in, 0.15f, 3), B = gaussian(s.out * s.r, 0.2f, 4),
                     dout = gaussian(s.N * s.out, 1.0f, 5), dA0 = gaussian(s.r * s.in, 1.0f, 6),
                     dB0 = gaussian(s.out * s.r, 1.0f, 7), dx0 = gaussian(s.N * s.in, 1.0f, 8);
  Tensor xt = make(backend, {2, 5, s.in}, x), dout_t = make(backend, {2, 5, s.out}, dout);
  Parameter dense_w;
  dense_w.name = "q_proj.weight";
  dense_w.value = make(backend, {s.out, s.in}, w);
  Parameter int8_w = named("q_proj.weight");
  quantize_parameter(backend, int8_w, make(backend, {s.out, s.in}, w));
  REQUIRE(int8_w.value.dtype == DType::i8);
  REQUIRE(int8_scales(int8_w).shape == Shape{s.out});

  for (bool int8_base : {false, true})
    for (float p : {0.0f, 0.3f})
      for (bool accumulate_dx : {false, true}) {
        CAPTURE(int8_base);
        CAPTURE(p);
        CAPTURE(accumulate_dx);
        // The base's own outputs, from the base alone.
        std::vector<double> base_y(size_t(s.N * s.out)), base_dx(size_t(s.N * s.in));
        if (int8_base) {
          Tensor y = backend.empty({s.N, s.out}, DType::f32, MemCategory::activations);
          Tensor dx = backend.empty({s.N, s.in}, DType::f32, MemCategory::activations);
          backend.int8_linear_forward(y, xt, int8_w.value, int8_scales(int8_w), 6.0f);
          backend.int8_linear_backward(dx, dout_t, int8_w.value, int8_scales(int8_w), false);
          std::vector<float> yv = read(y), dxv = read(dx);
          base_y.assign(yv.begin(), yv.end());
          base_dx.assign(dxv.begin(), dxv.end());
        } else {
          std::vector<double> xs(x.begin(), x.end()), ds(dout.begin(), dout.end());
          base_y = matmul_nt(xs, [&](int64_t o, int64_t k) { return double(w[size_t(o * s.in + k)]); }, s.N, s.in, s.out);
          base_dx = matmul_nt(ds, [&](int64_t k, int64_t o) { return double(w[size_t(o * s.in + k)]); }, s.N, s.out, s.in);
        }
        Parameter lora_A = named("lora_A.weight"), lora_B = named("lora_B.weight");
        make_trainable(backend, lora_A, {s.r, s.in}, A, dA0);
        make_trainable(backend, lora_B, {s.out, s.r}, B, dB0);
        std::unique_ptr<Linear> base;
        if (int8_base)
          base = std::make_unique<Int8Linear>(int8_w, 6.0f);
        else
          base = std::make_unique<DenseLinear>(dense_w);
        LoraLinear layer(std::move(base), lora_A, lora_B, scaling, p);
        layer.set_dropout_seed(1234);

        LoraRef ref = lora_ref(x, A, B, dout, s, scaling, p, 1234);
        Tensor y = backend.empty({2, 5, s.out}, DType::f32, MemCategory::activations);
        layer.forward(backend, y, xt);
        std::vector<double> want_y(base_y);
        for (size_t i = 0; i < want_y.size(); ++i) want_y[i] += ref.y[i];
        check_close(read(y), want_y);

        Tensor dx = make(backend, {2, 5, s.in}, dx0);
        layer.backward(backend, &dx, dout_t, xt, accumulate_dx);
        std::vector<double> want_dx(base_dx);
        for (size_t i = 0; i < want_dx.size(); ++i) want_dx[i] += ref.dx[i] + (accumulate_dx ? dx0[i] : 0.0f);
        check_close(read(dx), want_dx);
        check_close(read(lora_A.grad), plus(ref.dA, dA0));
        check_close(read(lora_B.grad), plus(ref.dB, dB0));

        // No input gradient wanted (the first layer under a frozen
        // embedding): the same parameter gradients, bit for bit.
        const auto dA_with_dx = read(lora_A.grad), dB_with_dx = read(lora_B.grad);
        backend.copy(lora_A.grad, make(backend, {s.r, s.in}, dA0));
        backend.copy(lora_B.grad, make(backend, {s.out, s.r}, dB0));
        layer.backward(backend, nullptr, dout_t, xt, accumulate_dx);
        CHECK(read(lora_A.grad) == dA_with_dx);
        CHECK(read(lora_B.grad) == dB_with_dx);
      }
}

// q/k/v-like linears reading one x: under an InputShare the INT8 bases
// quantise x once between them (one int8_quantize_input, counted by the op
// profile) and give the outputs they give alone, bit for bit; a dense base
// ignores the share; a forward of another x under the share quantises its
// own; after the share no forward quantises through it.
TEST_CASE("linears under an InputShare quantise their x once and give their unshared outputs bit for bit") {
  HostAllocator host;
  CpuBackend backend(host);
  const int64_t N = 9, in = 37, r = 4;
  std::vector<float> x = gaussian(N * in, 1.0f, 20);
  x[size_t(3 * in + 5)] = 7.0f;  // an outlier column
  const Tensor xt = make(backend, {N, in}, x), other = make(backend, {N, in}, gaussian(N * in, 1.0f, 21));
  std::vector<Parameter> weights;
  for (int64_t out : {23, 11, 11}) {
    weights.push_back(named("proj.weight"));
    const std::vector<float> w = gaussian(out * in, 0.1f, unsigned(30 + weights.size()));
    quantize_parameter(backend, weights.back(), make(backend, {out, in}, w));
  }
  Parameter dense_w = named("dense.weight");
  dense_w.value = make(backend, {11, in}, gaussian(11 * in, 0.1f, 22));
  Parameter lora_A = named("lora_A.weight"), lora_B = named("lora_B.weight");
  make_trainable(backend, lora_A, {r, in}, gaussian(r * in, 0.15f, 23), std::vector<float>(size_t(r * in), 0.0f));
  make_trainable(backend, lora_B, {23, r}, gaussian(23 * r, 0.2f, 24), std::vector<float>(size_t(23 * r), 0.0f));
  LoraLinear q(std::make_unique<Int8Linear>(weights[0], 6.0f), lora_A, lora_B, 2.0f, 0.3f);
  Int8Linear k(weights[1], 6.0f), v(weights[2], 6.0f);
  DenseLinear dense(dense_w);
  std::vector<Linear*> linears = {&q, &k, &v, &dense};
  auto outputs = [&](const Tensor& input) {
    std::vector<std::vector<float>> all;
    for (Linear* linear : linears) {
      Tensor y = backend.empty({N, linear == &q ? 23 : 11}, DType::f32, MemCategory::activations);
      linear->forward(backend, y, input);
      all.push_back(read(y));
    }
    return all;
  };
  auto quantisations = [&](const OpProfile& profile) {
    int64_t calls = 0;
    for (const OpProfile::Row& row : profile.rows()) calls += row.op == "int8_quantize_input" ? row.calls : 0;
    return calls;
  };
  const auto alone = outputs(xt), other_alone = outputs(other);
  OpProfile profile;
  backend.set_op_profile(&profile);
  {
    const InputShare share(xt, {&q, &k, &v, &dense});
    CHECK(outputs(xt) == alone);
    CHECK(quantisations(profile) == 1);
    CHECK(outputs(other) == other_alone);  // not the shared x: each quantises its own
    CHECK(quantisations(profile) == 1);
  }
  CHECK(outputs(xt) == alone);
  CHECK(quantisations(profile) == 1);
  backend.set_op_profile(nullptr);
}

// L = sum(y * dout) is linear in A and in B, so central differences are exact
// but for f32 rounding of y: with step 0.01 that noise is ~1e-4 of the
// largest gradient, well inside the 2e-3 tolerance.
TEST_CASE("LoraLinear dA and dB match finite differences with dropout") {
  HostAllocator host;
  CpuBackend backend(host);
  const Sizes s{6, 11, 7, 3};
  const float scaling = lora_scaling(16.0, s.r, true);
  std::vector<float> x = gaussian(s.N * s.in, 1.0f, 11), dout = gaussian(s.N * s.out, 1.0f, 12);
  Parameter w;
  w.name = "v_proj.weight";
  w.value = make(backend, {s.out, s.in}, gaussian(s.out * s.in, 0.1f, 13));
  Parameter lora_A = named("lora_A.weight"), lora_B = named("lora_B.weight");
  make_trainable(backend, lora_A, {s.r, s.in}, gaussian(s.r * s.in, 0.3f, 14), std::vector<float>(s.r * s.in, 0.0f));
  make_trainable(backend, lora_B, {s.out, s.r}, gaussian(s.out * s.r, 0.3f, 15), std::vector<float>(s.out * s.r, 0.0f));
  LoraLinear layer(std::make_unique<DenseLinear>(w), lora_A, lora_B, scaling, 0.3f);
  layer.set_dropout_seed(99);
  Tensor xt = make(backend, {s.N, s.in}, x), y = backend.empty({s.N, s.out}, DType::f32, MemCategory::activations);
  Tensor dx = backend.empty({s.N, s.in}, DType::f32, MemCategory::activations);
  layer.forward(backend, y, xt);
  layer.backward(backend, &dx, make(backend, {s.N, s.out}, dout), xt, false);
  auto loss = [&]() {
    layer.forward(backend, y, xt);
    double sum = 0.0;
    for (int64_t i = 0; i < y.numel(); ++i) sum += double(y.ptr<float>()[i]) * dout[size_t(i)];
    return sum;
  };
  for (Parameter* p : {&lora_A, &lora_B}) {
    CAPTURE(p->name);
    std::vector<float> grad = read(p->grad);
    double largest = 0.0;
    for (float g : grad) largest = std::max(largest, double(std::fabs(g)));
    for (int64_t i = 0; i < p->value.numel(); ++i) {
      float& value = p->value.ptr<float>()[i];
      const float saved = value, step = 0.01f;
      value = saved + step;
      double up = loss();
      value = saved - step;
      double down = loss();
      value = saved;
      CHECK(std::fabs((up - down) / (2.0 * step) - grad[size_t(i)]) <= 2e-3 * largest);
    }
  }
}

TEST_CASE("init_lora_parameters: A kaiming-uniform within 1/sqrt(in), B zero, so the layer starts as its base") {
  HostAllocator host;
  CpuBackend backend(host);
  const int64_t in = 300, out = 40, r = 8;
  Parameter lora_A = named("lora_A.weight");
  lora_A.value = backend.empty({r, in}, DType::f32, MemCategory::adapters);
  Parameter lora_B;
  lora_B.name = "lora_B.weight";
  lora_B.value = make(backend, {out, r}, gaussian(out * r, 1.0f, 21));
  init_lora_parameters(backend, lora_A, lora_B, LoraInit::kaiming_uniform, 7);
  std::vector<float> A = read(lora_A.value);
  const float bound = 1.0f / std::sqrt(float(in));
  double sum = 0.0, sum_sq = 0.0;
  for (float a : A) {
    CHECK(std::fabs(a) <= bound);
    sum += a;
    sum_sq += double(a) * a;
  }
  CHECK(*std::min_element(A.begin(), A.end()) < *std::max_element(A.begin(), A.end()));
  // Uniform(-b, b) over 2400 values: mean 0 (sd b/sqrt(3*2400) = 0.012 b), variance b^2/3.
  CHECK(std::fabs(sum / A.size()) < 0.06 * bound);
  CHECK(sum_sq / A.size() == doctest::Approx(bound * bound / 3.0).epsilon(0.1));
  for (float b : read(lora_B.value)) CHECK(b == 0.0f);
  init_lora_parameters(backend, lora_A, lora_B, LoraInit::kaiming_uniform, 8);
  CHECK(read(lora_A.value) != A);  // another seed, other values

  Parameter w;

  w.name = "q_proj.weight";

  w.value = make(backend, {out, in}, gaussian(out * in, 0.1f, 22));
  Tensor x = make(backend, {5, in}, gaussian(5 * in, 1.0f, 23));
  Tensor base_y = backend.empty({5, out}, DType::f32, MemCategory::activations);
  Tensor y = backend.empty({5, out}, DType::f32, MemCategory::activations);
  DenseLinear(w).forward(backend, base_y, x);
  LoraLinear(std::make_unique<DenseLinear>(w), lora_A, lora_B, lora_scaling(16.0, r, false), 0.1f)
      .forward(backend, y, x);
  CHECK(read(y) == read(base_y));
}

// Moments of a sample against a distribution's mean 0 and variance: the
// mean within 5 standard errors, the variance within 10%.
static void check_moments(const std::vector<float>& values, double variance) {
  double sum = 0.0, sum_sq = 0.0;
  for (float v : values) sum += v, sum_sq += double(v) * v;
  const double n = double(values.size());
  CHECK(std::fabs(sum / n) < 5.0 * std::sqrt(variance / n));
  CHECK(sum_sq / n == doctest::Approx(variance).epsilon(0.1));
}

// PEFT's init_lora_weights="gaussian" (nn.init.normal_(A, std=1/r), B zero)
// and False (A and B as nn.Linear leaves them: kaiming-uniform, bound
// 1/sqrt(fan_in)); a tensor-parallel shard (A's columns, B's rows) draws the
// whole tensor's values at its place.
TEST_CASE("init_lora_parameters: gaussian A with std 1/r, false leaves B kaiming-uniform, shards draw the whole") {
  HostAllocator host;
  CpuBackend backend(host);
  const int64_t in = 300, out = 40, r = 8;
  auto adapter = [&](const char* name, Shape shape) {
    Parameter p = named(name);
    p.value = backend.empty(shape, DType::f32, MemCategory::adapters);
    return p;
  };
  Parameter A = adapter("lora_A.weight", {r, in}), B = adapter("lora_B.weight", {out, r});
  init_lora_parameters(backend, A, B, LoraInit::gaussian, 7);
  const std::vector<float> gaussian_A = read(A.value);
  check_moments(gaussian_A, 1.0 / double(r * r));
  // Normal, not uniform: 68.3% within one sd (a uniform of that variance: 57.7%).
  const double within = double(std::count_if(gaussian_A.begin(), gaussian_A.end(),
                                             [&](float a) { return std::fabs(a) < 1.0 / double(r); }));
  CHECK(within / double(gaussian_A.size()) == doctest::Approx(0.683).epsilon(0.05));
  for (float b : read(B.value)) CHECK(b == 0.0f);

  init_lora_parameters(backend, A, B, LoraInit::random, 7);
  std::vector<float> random_B = read(B.value);
  for (float b : random_B) CHECK(std::fabs(b) <= 1.0f / std::sqrt(float(r)));
  check_moments(random_B, 1.0 / (3.0 * double(r)));
  std::vector<float> random_A = read(A.value);
  check_moments(random_A, 1.0 / (3.0 * double(in)));

  // Ranks holding columns [100, 200) of A and rows [10, 30) of B.
  Parameter A_shard = adapter("lora_A.weight", {r, 100}), B_shard = adapter("lora_B.weight", {20, r});
  A_shard.slice = TensorSlice{1, 100, in};
  B_shard.slice = TensorSlice{0, 10, out};
  for (LoraInit init : {LoraInit::gaussian, LoraInit::random}) {
    CAPTURE(int(init));
    init_lora_parameters(backend, A, B, init, 9);
    init_lora_parameters(backend, A_shard, B_shard, init, 9);
    const std::vector<float> whole_A = read(A.value), whole_B = read(B.value);
    const std::vector<float> shard_A = read(A_shard.value), shard_B = read(B_shard.value);
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < 100; ++j) CHECK(shard_A[size_t(i * 100 + j)] == whole_A[size_t(i * in + 100 + j)]);
    for (int64_t i = 0; i < 20; ++i)
      for (int64_t j = 0; j < r; ++j) CHECK(shard_B[size_t(i * r + j)] == whole_B[size_t((10 + i) * r + j)]);
  }
}

TEST_CASE("lora_scaling: alpha / r, or alpha / sqrt(r) with rslora") {
  CHECK(lora_scaling(16.0, 8, false) == 2.0f);
  CHECK(lora_scaling(16.0, 4, true) == 8.0f);
  CHECK(lora_scaling(8.0, 8, true) == float(8.0 / std::sqrt(8.0)));
  CHECK(lora_scaling(32.0, 16, false) == 2.0f);  // trl's 20B recipe
}

TEST_CASE("dropout keeps a fraction 1 - p, scales by 1 / (1 - p) and redraws the same mask") {
  HostAllocator host;
  CpuBackend backend(host);
  const int64_t n = 100000;
  const float p = 0.3f;
  std::vector<float> ones(n, 1.0f);
  Tensor x = make(backend, {n}, ones);
  Tensor out = backend.empty({n}, DType::f32, MemCategory::activations);
  backend.dropout_forward(out, x, p, 42);
  int64_t dropped = 0, wrong = 0;
  const float scale = 1.0f / (1.0f - p);
  for (int64_t i = 0; i < n; ++i) {
    float y = out.ptr<float>()[i];
    wrong += y != (dropout_keep(42, uint64_t(i), p) ? scale : 0.0f);  // the shared hash decides
    dropped += y == 0.0f;
  }
  CHECK(wrong == 0);
  // Binomial(1e5, 0.3): standard deviation 145, so 5 sigma is +-0.0073.
  CHECK(std::fabs(double(dropped) / n - p) < 0.0073);

  // Backward applies the same mask and scale; in place is allowed.
  Tensor dout = make(backend, {n}, ones);
  backend.dropout_backward(dout, dout, p, 42);
  CHECK(read(dout) == read(out));

  // Same seed: same mask (out may alias x); another seed: another mask.
  Tensor again = make(backend, {n}, ones);
  backend.dropout_forward(again, again, p, 42);
  CHECK(read(again) == read(out));
  Tensor other = backend.empty({n}, DType::f32, MemCategory::activations);
  backend.dropout_forward(other, x, p, 43);
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) differ += (other.ptr<float>()[i] == 0.0f) != (out.ptr<float>()[i] == 0.0f);
  // Independent masks disagree with probability 2 p (1 - p) = 0.42.
  CHECK(differ > n / 3);

  // p = 0 is the identity and p = 1 drops everything (zeros, not NaN).
  backend.dropout_forward(out, x, 0.0f, 42);
  CHECK(read(out) == ones);
  backend.dropout_forward(out, x, 1.0f, 42);
  CHECK(read(out) == std::vector<float>(n, 0.0f));
}

TEST_CASE("dropout over some columns of a wider tensor draws that tensor's mask (row_stride)") {
  HostAllocator host;
  CpuBackend backend(host);
  const int64_t rows = 7, wide = 40, first = 24, cols = 16;  // columns [24, 40) of [7, 40]
  const float p = 0.4f;
  std::vector<float> values(size_t(rows * wide));
  for (size_t i = 0; i < values.size(); ++i) values[i] = float(i % 13) - 6.0f;
  Tensor x = make(backend, {rows, wide}, values);
  Tensor whole = backend.empty({rows, wide}, DType::f32, MemCategory::activations);
  backend.dropout_forward(whole, x, p, 42);
  std::vector<float> part_values;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = first; c < first + cols; ++c) part_values.push_back(values[size_t(r * wide + c)]);
  Tensor part = make(backend, {rows, cols}, part_values);
  Tensor out = backend.empty({rows, cols}, DType::f32, MemCategory::activations);
  backend.dropout_forward(out, part, p, seed_at(42, first), wide);
  Tensor back = make(backend, {rows, cols}, part_values);
  backend.dropout_backward(back, back, p, seed_at(42, first), wide);
  std::vector<float> want;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = first; c < first + cols; ++c) want.push_back(whole.ptr<float>()[r * wide + c]);
  CHECK(read(out) == want);
  CHECK(read(back) == want);
  // Without the stride the part draws a mask of its own.
  backend.dropout_forward(out, part, p, seed_at(42, first));
  CHECK(read(out) != want);
  CHECK_THROWS_WITH(backend.dropout_forward(out, part, p, 42, cols - 1),
                    "dropout_forward: row_stride 15 needs a 2-D x of at most that many columns, got [7, 16]");
}

TEST_CASE("hash_uniform is splitmix64's output stream") {
  // splitmix64 seeded with 0 starts e220a8397b1dcdaf (Vigna's reference code).
  CHECK(splitmix64(0, 0) == 0xe220a8397b1dcdafull);
  CHECK(hash_uniform(0, 0) == float(0xe220a8397b1dcdafull >> 40) / 16777216.0f);
  CHECK(hash_uniform(7, 3) >= 0.0f);
  CHECK(hash_uniform(7, 3) < 1.0f);
}
