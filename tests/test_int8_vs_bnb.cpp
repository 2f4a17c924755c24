// Our LLM.int8() forward against bitsandbytes' on a Llama-2-7B q_proj-sized
// layer (tests/fixtures/int8_vs_bnb, written by scripts/compare_bnb_int8.py).
// The operands are regenerated here from the script's splitmix64 streams; the
// fixture holds bitsandbytes' float16 output and the differences the script
// measured. The test checks that CpuBackend::int8_linear_forward computes our
// rule (kernels/backend.h) up to f32 rounding, and that the differences it
// shows to full precision and to bitsandbytes are the ones the fixture states.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "tests/host_tensors.h"

using namespace ft;
using nlohmann::json;

namespace {

const std::string kDir = std::string(FT_FIXTURES_DIR) + "/int8_vs_bnb/";

// splitmix64's output for state stream + (index + 1) * golden (mod 2^64).
uint64_t draw(uint64_t stream, uint64_t index) {
  uint64_t z = stream + (index + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// 12 bytes of two draws summed, minus 1530: a bell-shaped integer in [-1530, 1530].
int64_t bell(uint64_t stream, uint64_t e) {
  uint64_t r0 = draw(stream, 2 * e), r1 = draw(stream, 2 * e + 1);
  int64_t sum = 0;
  for (int b = 0; b < 8; ++b) sum += int64_t((r0 >> (8 * b)) & 0xFF);
  for (int b = 0; b < 4; ++b) sum += int64_t((r1 >> (8 * b)) & 0xFF);
  return sum - 1530;
}

// The layer as integers: W = w_int * 2^-14, x = x_int * 2^-8 (both exact
// float16 numbers), generated as the script's docstring describes.
struct Layer {
  int64_t N, K, O;
  float threshold;
  std::vector<int32_t> w_int, x_int;
  std::vector<int64_t> outlier_columns;
};

Layer make_layer(const json& f) {
  Layer l;
  l.N = f.at("n_tokens").get<int64_t>();
  l.K = f.at("in_features").get<int64_t>();
  l.O = f.at("out_features").get<int64_t>();
  l.threshold = f.at("threshold").get<float>();
  const json& streams = f.at("streams");
  const uint64_t w_stream = streams.at("weight").get<uint64_t>(), x_stream = streams.at("x").get<uint64_t>(),
                 outlier_stream = streams.at("outliers").get<uint64_t>();
  l.w_int.resize(size_t(l.O * l.K));
  for (int64_t e = 0; e < l.O * l.K; ++e) l.w_int[size_t(e)] = int32_t(bell(w_stream, uint64_t(e)));
  l.x_int.resize(size_t(l.N * l.K));
  for (int64_t e = 0; e < l.N * l.K; ++e) l.x_int[size_t(e)] = int32_t(bell(x_stream, uint64_t(e)));
  for (const json& column : f.at("outlier_columns")) {
    const int64_t c = column.at("column").get<int64_t>(), sign = column.at("sign").get<int64_t>();
    l.outlier_columns.push_back(c);
    for (int64_t n = 0; n < l.N; ++n) {
      uint64_t r = draw(outlier_stream, uint64_t(n * l.K + c));
      int64_t m = r % 4 != 0 ? 96 + int64_t((r >> 8) % 865) : int64_t((r >> 8) % 96);
      l.x_int[size_t(n * l.K + c)] = int32_t(sign * m * 16);  // sign * m / 16 in units of 2^-8
    }
  }
  return l;
}

// The exact product x W^T: integer dot products scaled by 2^-22 (exact in float64).
std::vector<double> full_precision(const Layer& l) {
  std::vector<double> out(size_t(l.N * l.O));
  for (int64_t n = 0; n < l.N; ++n)
    for (int64_t o = 0; o < l.O; ++o) {
      const int32_t* x = l.x_int.data() + n * l.K;
      const int32_t* w = l.w_int.data() + o * l.K;
      int64_t acc = 0;
      for (int64_t k = 0; k < l.K; ++k) acc += int64_t(x[k] * w[k]);  // |x * w| < 2^25
      out[size_t(n * l.O + o)] = std::ldexp(double(acc), -22);
    }
  return out;
}

// Our rule in float64 (kernels/backend.h, int8_linear_forward), with the
// codes and scales of W our backend produced: outlier columns leave the int8
// product and are multiplied against the dequantised weight columns; the row
// scale of x is the absmax of its other columns. magnitude = the sum of |terms|
// (the int8 part and each outlier term), the scale of f32 rounding error.
struct OurRule {
  std::vector<double> out, magnitude;
};

OurRule our_rule_f64(const Layer& l, const std::vector<int8_t>& w_codes, const std::vector<float>& w_scales) {
  std::vector<uint8_t> is_outlier(size_t(l.K), 0);
  for (int64_t c : l.outlier_columns) is_outlier[size_t(c)] = 1;
  OurRule rule{std::vector<double>(size_t(l.N * l.O)), std::vector<double>(size_t(l.N * l.O))};
  std::vector<int32_t> x_codes(size_t(l.K));
  for (int64_t n = 0; n < l.N; ++n) {
    const int32_t* x = l.x_int.data() + n * l.K;
    double sx = 0.0;
    for (int64_t k = 0; k < l.K; ++k)
      if (!is_outlier[size_t(k)]) sx = std::max(sx, std::ldexp(std::fabs(double(x[k])), -8));
    for (int64_t k = 0; k < l.K; ++k)
      x_codes[size_t(k)] = is_outlier[size_t(k)] ? 0 : int32_t(std::nearbyint(std::ldexp(double(x[k]), -8) * 127.0 / sx));
    for (int64_t o = 0; o < l.O; ++o) {
      const int8_t* wq = w_codes.data() + o * l.K;
      int32_t acc = 0;  // |acc| <= K * 127^2 < 2^31
      for (int64_t k = 0; k < l.K; ++k) acc += x_codes[size_t(k)] * int32_t(wq[k]);
      double sw = w_scales[size_t(o)];
      double int_part = double(acc) * (sx * sw / (127.0 * 127.0)), outlier_part = 0.0, outlier_abs = 0.0;
      for (int64_t c : l.outlier_columns) {
        double term = std::ldexp(double(x[c]), -8) * (double(wq[c]) * (sw / 127.0));
        outlier_part += term;
        outlier_abs += std::fabs(term);
      }
      rule.out[size_t(n * l.O + o)] = int_part + outlier_part;
      rule.magnitude[size_t(n * l.O + o)] = std::fabs(int_part) + outlier_abs;
    }
  }
  return rule;
}

// The figures of scripts/compare_bnb_int8.py's diff_figures, got against want.
struct Figures {
  double max_abs = 0.0, mean_abs = 0.0, rel_frobenius = 0.0;
};

template <class Got>
Figures diff_figures(const Got& got, const std::vector<double>& want) {
  Figures f;
  double diff_sq = 0.0, want_sq = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    double d = double(got[i]) - want[i];
    f.max_abs = std::max(f.max_abs, std::fabs(d));
    f.mean_abs += std::fabs(d);
    diff_sq += d * d;
    want_sq += want[i] * want[i];
  }
  f.mean_abs /= double(want.size());
  f.rel_frobenius = std::sqrt(diff_sq / want_sq);
  return f;
}

double norm(const std::vector<double>& v) {
  double sq = 0.0;
  for (double x : v) sq += x * x;
  return std::sqrt(sq);
}

// Figures of our f32 output against `want` equal the stated ones (measured
// by the script on the float64 form of our rule) up to how far the f32 output
// is from that form: max_abs and mean_abs move by at most max|f32 - f64|, the
// relative Frobenius norm by at most ||f32 - f64|| / ||want|| (triangle
// inequality); the float64 form itself must reproduce them to rounding.
void check_figures(const std::vector<float>& ours, const std::vector<double>& ours_f64,
                   const std::vector<double>& want, const json& stated) {
  Figures f32 = diff_figures(ours, want), f64 = diff_figures(ours_f64, want), gap = diff_figures(ours, ours_f64);
  const double max_abs = stated.at("max_abs").get<double>(), mean_abs = stated.at("mean_abs").get<double>(),
               rel = stated.at("rel_frobenius").get<double>();
  CHECK(f64.max_abs == doctest::Approx(max_abs).epsilon(1e-9));
  CHECK(f64.mean_abs == doctest::Approx(mean_abs).epsilon(1e-9));
  CHECK(f64.rel_frobenius == doctest::Approx(rel).epsilon(1e-9));
  CHECK(std::fabs(f32.max_abs - max_abs) <= gap.max_abs * (1 + 1e-9) + 1e-12 * max_abs);
  CHECK(std::fabs(f32.mean_abs - mean_abs) <= gap.max_abs * (1 + 1e-9) + 1e-12 * mean_abs);
  double frobenius_gap = gap.rel_frobenius * norm(ours_f64) / norm(want);
  CHECK(std::fabs(f32.rel_frobenius - rel) <= frobenius_gap * (1 + 1e-9) + 1e-12 * rel);
  // The tolerance is far below the figures themselves: they are measured, not slack.
  CHECK(gap.max_abs < 1e-3 * max_abs);
}

std::vector<double> read_f16_file(const std::string& path, int64_t count) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot open ", path);
  std::vector<uint16_t> bits(static_cast<size_t>(count));
  in.read(reinterpret_cast<char*>(bits.data()), std::streamsize(count * 2));
  REQUIRE_MESSAGE(in.gcount() == count * 2, path, ": expected ", count * 2, " bytes");
  std::vector<double> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[size_t(i)] = load_as_f32(bits.data(), DType::f16, i);
  return values;
}

}  // namespace

TEST_CASE("int8_linear_forward vs bitsandbytes on a Llama-2-7B q_proj-sized layer: the stated differences hold") {
  std::ifstream file(kDir + "figures.json");
  REQUIRE(file.good());
  const json fixture = json::parse(file);
  const json& checks = fixture.at("checks");
  const json& figures = fixture.at("figures");
  Layer l = make_layer(fixture);

  // The regenerated operands are the script's (its integer sums).
  int64_t sum_w = 0, sum_x = 0, outlier_entries = 0;
  for (int32_t v : l.w_int) sum_w += v;
  for (int32_t v : l.x_int) {
    sum_x += v;
    outlier_entries += std::ldexp(std::fabs(double(v)), -8) >= l.threshold;
  }
  REQUIRE(sum_w == checks.at("sum_w_integers").get<int64_t>());
  REQUIRE(sum_x == checks.at("sum_x_times_256").get<int64_t>());
  REQUIRE(outlier_entries == checks.at("outlier_entries").get<int64_t>());

  HostAllocator host;
  CpuBackend backend(host);
  std::vector<float> w(l.w_int.size()), x(l.x_int.size());
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::ldexp(float(l.w_int[i]), -14);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::ldexp(float(l.x_int[i]), -8);
  Tensor wq = backend.empty({l.O, l.K}, DType::i8, MemCategory::weights);
  Tensor w_scales = backend.empty({l.O}, DType::f32, MemCategory::weights);
  backend.quantize_rows_int8(wq, w_scales, testing::make(backend, {l.O, l.K}, w, DType::f16));
  std::vector<int8_t> w_codes(wq.ptr<int8_t>(), wq.ptr<int8_t>() + l.O * l.K);
  std::vector<float> w_scale_values(w_scales.ptr<float>(), w_scales.ptr<float>() + l.O);
  int64_t sum_codes = 0;
  for (int8_t q : w_codes) sum_codes += q;
  REQUIRE(sum_codes == checks.at("sum_weight_codes_ours").get<int64_t>());

  Tensor out = backend.empty({l.N, l.O}, DType::f32, MemCategory::activations);
  backend.int8_linear_forward(out, testing::make(backend, {l.N, l.K}, x), wq, w_scales, l.threshold);
  std::vector<float> ours = testing::read(out);

  // (a) Our output is our rule in float64 up to f32 rounding (a few ulps of the terms' magnitude).
  OurRule rule = our_rule_f64(l, w_codes, w_scale_values);
  double worst_ratio = 0.0;  // max over elements of |ours - rule| / magnitude
  for (size_t i = 0; i < ours.size(); ++i)
    worst_ratio = std::max(worst_ratio, std::fabs(ours[i] - rule.out[i]) / rule.magnitude[i]);
  REQUIRE(worst_ratio <= 1e-6);

  // (b) The difference to bitsandbytes' int8 forward (its stored output) is the stated one.
  std::vector<double> bnb = read_f16_file(kDir + fixture.at("bnb_out").at("file").get<std::string>(), l.N * l.O);
  {
    INFO("ours vs bitsandbytes");
    check_figures(ours, rule.out, bnb, figures.at("ours_f64_vs_bnb_cpu_int8"));
  }

  // (c) Both errors against full precision are the stated ones.
  std::vector<double> full = full_precision(l);
  {
    INFO("ours vs full precision");
    check_figures(ours, rule.out, full, figures.at("vs_full_precision").at("ours_f64"));
  }
  Figures bnb_error = diff_figures(bnb, full);
  const json& stated = figures.at("vs_full_precision").at("bnb_cpu_int8");
  CHECK(bnb_error.max_abs == doctest::Approx(stated.at("max_abs").get<double>()).epsilon(1e-9));
  CHECK(bnb_error.mean_abs == doctest::Approx(stated.at("mean_abs").get<double>()).epsilon(1e-9));
  CHECK(bnb_error.rel_frobenius == doctest::Approx(stated.at("rel_frobenius").get<double>()).epsilon(1e-9));
}
