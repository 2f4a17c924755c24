// Wide rows of realistic logits and their softmax cross-entropy in float64,
// shared by the CPU and CUDA loss tests: a 50k or 128k vocabulary is where an
// f32 sum of the exponentials drifts (each small term loses its low bits
// against the growing total).
#pragma once
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace ft::testing {

struct WideRows {
  int64_t rows = 0, vocab = 0;
  std::vector<float> logits;  // [rows, vocab]
  std::vector<int32_t> targets;
};

// Logits as a language-model head gives them: Gaussian around 0 with sigma 3,
// and in each row one token raised 10 to 20 above the rest. The targets are
// that token, a random other token, and -100 (ignored), in turn.
inline WideRows wide_rows(int64_t rows, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> spread(0.0f, 3.0f);
  std::uniform_real_distribution<float> lift(10.0f, 20.0f);
  std::uniform_int_distribution<int64_t> token(0, vocab - 1);
  WideRows w{rows, vocab, std::vector<float>(size_t(rows * vocab)), {}};
  for (float& x : w.logits) x = spread(rng);
  for (int64_t n = 0; n < rows; ++n) {
    int64_t peak = token(rng);
    w.logits[size_t(n * vocab + peak)] += lift(rng);
    int64_t kind = n % 3;
    w.targets.push_back(kind == 0 ? int32_t(peak) : kind == 1 ? int32_t(token(rng)) : -100);
  }
  return w;
}

struct CrossEntropyF64 {
  std::vector<double> losses, dlogits;
};

// losses[n] = logsumexp(row n) - row n[target]; dlogits = (softmax - onehot) *
// dloss; both 0 on ignored rows. `logits` are the values the kernel read.
inline CrossEntropyF64 cross_entropy_f64(const std::vector<float>& logits, const std::vector<int32_t>& targets,
                                         int64_t vocab, double dloss) {
  CrossEntropyF64 out{std::vector<double>(targets.size(), 0.0), std::vector<double>(logits.size(), 0.0)};
  for (size_t n = 0; n < targets.size(); ++n) {
    if (targets[n] == -100) continue;
    const float* row = &logits[n * size_t(vocab)];
    double max_logit = -INFINITY, sum = 0.0;
    for (int64_t i = 0; i < vocab; ++i) max_logit = std::max(max_logit, double(row[i]));
    for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(row[i]) - max_logit);
    out.losses[n] = max_logit + std::log(sum) - double(row[targets[n]]);
    for (int64_t i = 0; i < vocab; ++i)
      out.dlogits[n * size_t(vocab) + size_t(i)] =
          (std::exp(double(row[i]) - max_logit) / sum - (i == targets[n] ? 1.0 : 0.0)) * dloss;
  }
  return out;
}

// The largest |got - want| / |want|; an element whose want is 0 counts as
// infinitely wrong unless got is 0 too.
inline double worst_relative_error(const std::vector<float>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return INFINITY;
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    double error = want[i] == 0.0 ? (got[i] == 0.0f ? 0.0 : INFINITY) : std::abs(double(got[i]) - want[i]) / std::abs(want[i]);
    if (!(error <= worst)) worst = error;  // also catches NaN
  }
  return worst;
}

}  // namespace ft::testing
