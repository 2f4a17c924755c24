// AdamW against PyTorch's formula written out in double and a worked example
// by hand; sum_squares, which feeds global-norm clipping; the _many forms
// against the single-tensor ops; the learning-rate schedules against
// transformers'.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/cpu/cpu_backend.h"
#include "tests/host_tensors.h"
#include "trainer/lr_schedule.h"

using namespace ft;
using ft::testing::same_bytes;

namespace {

Tensor make(CpuBackend& backend, const std::vector<float>& values, DType dtype = DType::f32) {
  Tensor t = backend.empty({int64_t(values.size())}, dtype, MemCategory::activations);
  for (size_t i = 0; i < values.size(); ++i) store_from_f32(t.data, dtype, int64_t(i), values[i]);
  return t;
}

std::vector<float> read(const Tensor& t) {
  std::vector<float> values(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) values[size_t(i)] = load_as_f32(t.data, t.dtype, i);
  return values;
}

// torch.optim.AdamW's single-tensor step, in double.
void adamw_ref(std::vector<double>& p, const std::vector<double>& grad, std::vector<double>& m,
               std::vector<double>& v, const AdamWStep& s) {
  double b1 = s.beta1, b2 = s.beta2;
  for (size_t i = 0; i < p.size(); ++i) {
    double g = grad[i] * s.grad_scale;
    p[i] *= 1.0 - double(s.lr) * s.weight_decay;
    m[i] += (1.0 - b1) * (g - m[i]);
    v[i] = b2 * v[i] + (1.0 - b2) * g * g;
    double denom = std::sqrt(v[i]) / std::sqrt(1.0 - std::pow(b2, double(s.step))) + s.eps;
    p[i] -= double(s.lr) / (1.0 - std::pow(b1, double(s.step))) * m[i] / denom;
  }
}

}  // namespace

// f32 vs double over 3 steps: every f32 operation rounds (2^-24 relative).
// Parameters agree to 1e-6 relative; the moments to 1e-6 of their largest
// element (m mixes gradients of both signs, so a small m is a difference of
// larger terms and carries their absolute rounding error).
TEST_CASE("adamw_update follows PyTorch's AdamW over 3 steps") {
  HostAllocator host;
  CpuBackend backend(host);
  const int64_t n = 1001;  // not a multiple of any vector width
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> p0(n);
  for (float& x : p0) x = dist(rng);
  Tensor param = make(backend, p0), m = make(backend, std::vector<float>(n, 0.0f)),
         v = make(backend, std::vector<float>(n, 0.0f));
  std::vector<double> p_ref(p0.begin(), p0.end()), m_ref(n, 0.0), v_ref(n, 0.0);
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<float> g(n);
    for (float& x : g) x = 0.1f * dist(rng);
    AdamWStep s{1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 0.5f, step};
    backend.adamw_update(param, make(backend, g), m, v, s);
    adamw_ref(p_ref, std::vector<double>(g.begin(), g.end()), m_ref, v_ref, s);
    std::vector<float> p_got = read(param), m_got = read(m), v_got = read(v);
    double m_max = 0.0, v_max = 0.0;
    for (int64_t i = 0; i < n; ++i) m_max = std::max(m_max, std::fabs(m_ref[i])), v_max = std::max(v_max, v_ref[i]);
    for (int64_t i = 0; i < n; ++i) {
      CHECK(std::fabs(p_got[i] - p_ref[i]) <= 1e-6 * (1.0 + std::fabs(p_ref[i])));
      CHECK(std::fabs(m_got[i] - m_ref[i]) <= 1e-6 * m_max);
      CHECK(std::fabs(v_got[i] - v_ref[i]) <= 1e-6 * v_max);
    }
  }
}

// One parameter p = 1, raw gradients 4, -2, 1 clipped by grad_scale 0.5 to
// g = 2, -1, 0.5; lr 0.1, betas (0.5, 0.75), eps 0, weight decay 0.5, so the
// decay factor is 1 - 0.1 * 0.5 = 0.95 and every number is a short fraction.
//   step 1: m = 0.5 * 2 = 1;               v = 0.25 * 4 = 1
//           m_hat = 1 / 0.5 = 2;           v_hat = 1 / 0.25 = 4, sqrt 2
//           p = 1 * 0.95 - 0.1 * 2 / 2 = 0.85
//   step 2: m = 0.5 * 1 + 0.5 * -1 = 0;    v = 0.75 * 1 + 0.25 * 1 = 1
//           update 0, p = 0.85 * 0.95 = 0.8075
//   step 3: m = 0 + 0.5 * 0.5 = 0.25;      v = 0.75 + 0.25 * 0.25 = 0.8125
//           1 - 0.5^3 = 0.875: m_hat = 0.25 / 0.875 = 2/7
//           1 - 0.75^3 = 37/64: v_hat = 0.8125 * 64 / 37 = 52/37
//           p = 0.8075 * 0.95 - 0.1 * (2/7) / sqrt(52/37)
//             = 0.767125 - 0.0241008 = 0.7430242
TEST_CASE("adamw_update reproduces a worked example") {
  HostAllocator host;
  CpuBackend backend(host);
  Tensor param = make(backend, {1.0f}), m = make(backend, {0.0f}), v = make(backend, {0.0f});
  const float raw[3] = {4.0f, -2.0f, 1.0f};
  const double expected_p[3] = {0.85, 0.8075, 0.767125 - 0.1 * (2.0 / 7.0) / std::sqrt(52.0 / 37.0)};
  const double expected_m[3] = {1.0, 0.0, 0.25};
  const double expected_v[3] = {1.0, 1.0, 0.8125};
  for (int t = 0; t < 3; ++t) {
    backend.adamw_update(param, make(backend, {raw[t]}), m, v, AdamWStep{0.1f, 0.5f, 0.75f, 0.0f, 0.5f, 0.5f, t + 1});
    CHECK(param.ptr<float>()[0] == doctest::Approx(expected_p[t]).epsilon(1e-6));
    CHECK(m.ptr<float>()[0] == float(expected_m[t]));
    CHECK(v.ptr<float>()[0] == float(expected_v[t]));
  }
  CHECK(expected_p[2] == doctest::Approx(0.7430242).epsilon(1e-7));
}

TEST_CASE("sum_squares is exact on known input") {
  HostAllocator host;
  CpuBackend backend(host);
  // 1..n: the squares and their sum (n(n+1)(2n+1)/6 < 2^53) are exact in
  // double, whatever the order; n spans several 1024-element chunks.
  const int64_t n = 5000;
  std::vector<float> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = float(i + 1);
  CHECK(backend.sum_squares(make(backend, values)) == double(n) * (n + 1) * (2 * n + 1) / 6);
  // bf16 holds 0.5 and -3 exactly: 1000 * (0.25 + 9) = 9250.
  std::vector<float> halves(2000);
  for (size_t i = 0; i < halves.size(); ++i) halves[i] = i % 2 ? 0.5f : -3.0f;
  CHECK(backend.sum_squares(make(backend, halves, DType::bf16)) == 9250.0);
  // 0.1f squared is not an f32 but is exact in double: no f32 accumulation.
  CHECK(backend.sum_squares(make(backend, {0.1f})) == double(0.1f) * double(0.1f));
}

std::vector<float> random_values(int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> values(size_t(n), 0.0f);
  for (float& x : values) x = dist(rng);
  return values;
}

// Tensors of odd sizes (empty, one element, not a multiple of any vector
// width), decayed and not, over 3 steps: every bit as adamw_update per tensor
// with weight decay 0 where not decayed, which is what the optimizer did.
TEST_CASE("adamw_update_many is adamw_update per tensor, bit for bit") {
  HostAllocator host;
  CpuBackend backend(host);
  const int64_t sizes[] = {1001, 0, 1, 37, 4099};
  struct State {
    Tensor param, m, v;
  };
  std::vector<State> many, single;
  for (int64_t n : sizes)
    for (std::vector<State>* states : {&many, &single})
      states->push_back({make(backend, random_values(n, unsigned(n))), make(backend, std::vector<float>(n, 0.0f)),
                         make(backend, std::vector<float>(n, 0.0f))});
  for (int64_t step = 1; step <= 3; ++step) {
    AdamWStep s{1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 0.5f, step};
    std::vector<Tensor> grads;
    for (int64_t n : sizes) grads.push_back(make(backend, random_values(n, unsigned(100 * step + n))));
    std::vector<AdamWTensors> tensors;
    for (size_t i = 0; i < many.size(); ++i) {
      const bool decayed = i % 2 == 0;
      tensors.push_back({&many[i].param, &grads[i], &many[i].m, &many[i].v, decayed});
      AdamWStep one = s;
      one.weight_decay = decayed ? s.weight_decay : 0.0f;
      backend.adamw_update(single[i].param, grads[i], single[i].m, single[i].v, one);
    }
    backend.adamw_update_many(tensors, s);
    for (size_t i = 0; i < many.size(); ++i) {
      CAPTURE(i);
      CHECK(same_bytes(many[i].param, single[i].param));
      CHECK(same_bytes(many[i].m, single[i].m));
      CHECK(same_bytes(many[i].v, single[i].v));
    }
  }
}

TEST_CASE("sum_squares_many adds sum_squares per tensor in order") {
  HostAllocator host;
  CpuBackend backend(host);
  Tensor a = make(backend, random_values(5000, 1)), empty = make(backend, {}), one = make(backend, {0.1f});
  std::vector<float> values = random_values(3001, 2);
  Tensor b = make(backend, values, DType::bf16);
  std::vector<const Tensor*> tensors{&a, &empty, &b, &one};
  double want = 0.0;
  for (const Tensor* x : tensors) want += backend.sum_squares(*x);
  CHECK(backend.sum_squares_many(tensors) == want);
  CHECK(backend.sum_squares_many({}) == 0.0);
}

// transformers' schedules as its Trainer applies them, step by step
// (scripts/make_lr_schedule_fixture.py). After warmup the same; during it
// ours is one step ahead: step s uses lr (s + 1) / W where transformers'
// uses s / W (its first step runs at lr 0, and the lr its Trainer logs after
// step s is the next step's, (s + 1) / W: ours logs the one step s used).
TEST_CASE("the learning-rate schedules are transformers', warmup one step ahead") {
  std::ifstream file(std::string(FT_FIXTURES_DIR) + "/lr_schedule.json");
  REQUIRE(file.good());
  const nlohmann::json fixture = nlohmann::json::parse(file);
  const std::map<std::string, std::pair<Schedule, double>> kinds = {{"constant", {Schedule::constant, 0.0}},
                                                                    {"linear", {Schedule::linear, 0.0}},
                                                                    {"cosine", {Schedule::cosine, 0.0}},
                                                                    {"cosine_min_lr_0.1", {Schedule::cosine, 0.1}}};
  int cases = 0;
  for (const nlohmann::json& c : fixture["cases"]) {
    CAPTURE(c.dump());
    const auto [kind, floor] = kinds.at(c["schedule"]);
    const LrSchedule schedule{kind, c["peak_lr"], c["warmup_steps"], c["total_steps"], floor};
    const std::vector<double> applied = c["applied"];
    REQUIRE(schedule.warmup_steps < schedule.total_steps);
    for (int64_t s = 0; s < schedule.total_steps; ++s) {
      CAPTURE(s);
      const double theirs = applied[size_t(s < schedule.warmup_steps ? s + 1 : s)];
      CHECK(schedule.lr_at(s) == doctest::Approx(theirs).epsilon(1e-12));
    }
    cases++;
  }
  CHECK(cases == 12);
}
