#include "trainer/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/dropout_hash.h"
#include "kernels/error.h"
#include "tokenizer/tokenizer.h"

namespace ft {
namespace {

// The next of the stream's uniforms in [0, 1), from its top 53 bits.
double next_uniform(SamplerRng& rng) {
  return double(splitmix64(rng.seed, rng.draws++) >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace

int32_t sample_token(const float* logits, int64_t vocab_size, const SamplingOptions& options, SamplerRng& rng) {
  if (options.temperature <= 0.0) return int32_t(std::max_element(logits, logits + vocab_size) - logits);
  const double max_logit = *std::max_element(logits, logits + vocab_size);
  std::vector<double> probs(static_cast<size_t>(vocab_size));
  for (int64_t i = 0; i < vocab_size; ++i) probs[size_t(i)] = std::exp((logits[i] - max_logit) / options.temperature);
  std::vector<int32_t> order(static_cast<size_t>(vocab_size));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return probs[size_t(a)] > probs[size_t(b)]; });
  const double total = std::accumulate(probs.begin(), probs.end(), 0.0);
  // Nucleus: the smallest prefix of the sorted tokens whose mass reaches top_p (at least one token).
  double kept_mass = 0.0;
  size_t kept = 0;
  while (kept < order.size() && (kept == 0 || kept_mass < options.top_p * total)) kept_mass += probs[size_t(order[kept++])];
  double draw = next_uniform(rng) * kept_mass;
  for (size_t i = 0; i < kept; ++i) {
    draw -= probs[size_t(order[i])];
    if (draw <= 0.0) return order[i];
  }
  return order[kept - 1];
}

std::vector<std::vector<int32_t>> generate(CausalLM& model, const std::vector<std::vector<int32_t>>& prompts,
                                           const SamplingOptions& options, const StopCondition& stop) {
  const int64_t B = int64_t(prompts.size()), V = model.config().vocab_size;
  const int64_t max_positions = model.config().max_position_embeddings;
  std::vector<std::vector<int32_t>> rows = prompts, generated(prompts.size());
  std::vector<bool> done(prompts.size(), false);
  for (const auto& prompt : prompts) FT_CHECK(!prompt.empty(), "generate: empty prompt");
  FT_CHECK(stop.strings.empty() || stop.tokenizer, "generate: stop strings need a tokenizer");
  SamplerRng rng{options.seed};
  HostAllocator host;
  for (int64_t new_tokens = 0; new_tokens < options.max_new_tokens; ++new_tokens) {
    int64_t T = 0;
    for (const auto& row : rows) T = std::max<int64_t>(T, int64_t(row.size()));
    if (T > max_positions || std::all_of(done.begin(), done.end(), [](bool d) { return d; })) break;
    Tensor ids = Tensor::empty({B, T}, DType::i32, host, MemCategory::activations);
    Tensor targets = Tensor::empty({B, T}, DType::i32, host, MemCategory::activations);
    std::fill_n(ids.ptr<int32_t>(), B * T, 0);
    std::fill_n(targets.ptr<int32_t>(), B * T, -100);
    for (int64_t b = 0; b < B; ++b) std::copy(rows[size_t(b)].begin(), rows[size_t(b)].end(), ids.ptr<int32_t>() + b * T);
    model.forward(ids, targets);
    Tensor logits = Tensor::empty({B * T, V}, DType::f32, host, MemCategory::activations);
    model.backend().copy(logits, model.last_logits());
    for (int64_t b = 0; b < B; ++b) {
      if (done[size_t(b)] || int64_t(rows[size_t(b)].size()) >= max_positions) {
        done[size_t(b)] = true;
        continue;
      }
      const int64_t last = b * T + int64_t(rows[size_t(b)].size()) - 1;
      int32_t token = sample_token(logits.ptr<float>() + last * V, V, options, rng);
      if (std::find(stop.ids.begin(), stop.ids.end(), token) != stop.ids.end()) {
        done[size_t(b)] = true;
        continue;
      }
      rows[size_t(b)].push_back(token);
      generated[size_t(b)].push_back(token);
      if (!stop.strings.empty())
        done[size_t(b)] = find_stop_string(stop.tokenizer->decode(generated[size_t(b)]), stop.strings) != std::string::npos;
    }
  }
  return generated;
}

size_t find_stop_string(const std::string& text, const std::vector<std::string>& strings) {
  size_t first = std::string::npos;
  for (const std::string& stop : strings) first = std::min(first, text.find(stop));
  return first;
}

}  // namespace ft
