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

// transformers' RepetitionPenaltyLogitsProcessor: the logit of every token in
// context is divided by the penalty where positive, multiplied where not.
std::vector<float> penalised(const float* logits, int64_t vocab_size, double penalty,
                             std::span<const int32_t> context) {
  std::vector<float> out(logits, logits + vocab_size);
  for (int32_t token : context) {
    if (token < 0 || token >= vocab_size) continue;
    const float original = logits[token];
    out[size_t(token)] = original > 0.0f ? float(original / penalty) : float(original * penalty);
  }
  return out;
}

// Every row's tokens (prompt, then generated), its new tokens alone, and
// whether it has finished.
struct Rows {
  std::vector<std::vector<int32_t>> tokens, generated;
  std::vector<bool> done;
  bool all_done() const { return std::all_of(done.begin(), done.end(), [](bool d) { return d; }); }
};

// One step: each unfinished row samples its next token from logits_of(row)
// (rows in order, so the draws are the same with and without the cache).
template <class LogitsOf>
void advance_rows(Rows& rows, LogitsOf logits_of, int64_t vocab_size, int64_t max_positions,
                  const SamplingOptions& options, const StopCondition& stop, SamplerRng& rng,
                  const TokenCallback& on_token) {
  for (size_t b = 0; b < rows.tokens.size(); ++b) {
    if (rows.done[b] || int64_t(rows.tokens[b].size()) >= max_positions) {
      rows.done[b] = true;
      continue;
    }
    const int32_t token = sample_token(logits_of(b), vocab_size, options, rng, rows.tokens[b]);
    if (std::find(stop.ids.begin(), stop.ids.end(), token) != stop.ids.end()) {
      rows.done[b] = true;
      if (options.keep_stop_id) rows.generated[b].push_back(token);
      continue;
    }
    rows.tokens[b].push_back(token);
    rows.generated[b].push_back(token);
    if (on_token) on_token(b, token);
    if (!stop.strings.empty())
      rows.done[b] = find_stop_string(stop.tokenizer->decode(rows.generated[b]), stop.strings) != std::string::npos;
  }
}

// Every step reruns the whole right-padded batch.
void generate_uncached(CausalLM& model, Rows& rows, const SamplingOptions& options, const StopCondition& stop,
                       const TokenCallback& on_token) {
  const int64_t B = int64_t(rows.tokens.size()), V = model.config().vocab_size;
  const int64_t max_positions = model.config().position_limit();
  SamplerRng rng{options.seed};
  HostAllocator host;
  for (int64_t new_tokens = 0; new_tokens < options.max_new_tokens; ++new_tokens) {
    int64_t T = 0;
    for (const auto& row : rows.tokens) T = std::max<int64_t>(T, int64_t(row.size()));
    if (T > max_positions || rows.all_done()) break;
    Tensor ids = Tensor::empty({B, T}, DType::i32, host, MemCategory::activations);
    Tensor targets = Tensor::empty({B, T}, DType::i32, host, MemCategory::activations);
    std::fill_n(ids.ptr<int32_t>(), B * T, 0);
    std::fill_n(targets.ptr<int32_t>(), B * T, -100);
    for (int64_t b = 0; b < B; ++b)
      std::copy(rows.tokens[size_t(b)].begin(), rows.tokens[size_t(b)].end(), ids.ptr<int32_t>() + b * T);
    model.forward(ids, targets);
    Tensor logits = Tensor::empty({B * T, V}, DType::f32, host, MemCategory::activations);
    model.backend().copy(logits, model.last_logits());
    auto last_logits = [&](size_t b) {
      return logits.ptr<const float>() + (int64_t(b) * T + int64_t(rows.tokens[b].size()) - 1) * V;
    };
    advance_rows(rows, last_logits, V, max_positions, options, stop, rng, on_token);
  }
}

// The prompts run once as a right-padded batch; then each step runs every
// row's newest token against the cache (finished rows idle along).
void generate_cached(CausalLM& model, Rows& rows, const SamplingOptions& options, const StopCondition& stop,
                     const TokenCallback& on_token) {
  const int64_t B = int64_t(rows.tokens.size()), V = model.config().vocab_size;
  const int64_t max_positions = model.config().position_limit();
  int64_t longest_prompt = 0;
  for (const auto& row : rows.tokens) longest_prompt = std::max<int64_t>(longest_prompt, int64_t(row.size()));
  if (longest_prompt > max_positions || options.max_new_tokens <= 0) return;
  HostAllocator host;
  KvCache cache = model.make_kv_cache(B, std::min(longest_prompt + options.max_new_tokens, max_positions));
  Tensor ids = Tensor::empty({B, longest_prompt}, DType::i32, host, MemCategory::activations);
  std::fill_n(ids.ptr<int32_t>(), B * longest_prompt, 0);
  std::vector<int64_t> valid(static_cast<size_t>(B), 0);
  for (int64_t b = 0; b < B; ++b) {
    std::copy(rows.tokens[size_t(b)].begin(), rows.tokens[size_t(b)].end(), ids.ptr<int32_t>() + b * longest_prompt);
    valid[size_t(b)] = int64_t(rows.tokens[size_t(b)].size());
  }
  Tensor logits = Tensor::empty({B, V}, DType::f32, host, MemCategory::activations);
  model.backend().copy(logits, model.forward_cached(cache, ids, valid));
  SamplerRng rng{options.seed};
  Tensor step_ids = Tensor::empty({B, 1}, DType::i32, host, MemCategory::activations);
  for (int64_t new_tokens = 0;; ++new_tokens) {
    auto row_logits = [&](size_t b) { return logits.ptr<const float>() + int64_t(b) * V; };
    advance_rows(rows, row_logits, V, max_positions, options, stop, rng, on_token);
    if (new_tokens + 1 >= options.max_new_tokens || rows.all_done()) return;
    for (int64_t b = 0; b < B; ++b) {
      valid[size_t(b)] = rows.done[size_t(b)] ? 0 : 1;
      step_ids.ptr<int32_t>()[b] = rows.done[size_t(b)] ? 0 : rows.tokens[size_t(b)].back();
    }
    model.backend().copy(logits, model.forward_cached(cache, step_ids, valid));
  }
}

}  // namespace

int32_t sample_token(const float* logits, int64_t vocab_size, const SamplingOptions& options, SamplerRng& rng,
                     std::span<const int32_t> context) {
  std::vector<float> adjusted;
  if (options.repetition_penalty != 1.0 && !context.empty()) {
    adjusted = penalised(logits, vocab_size, options.repetition_penalty, context);
    logits = adjusted.data();
  }
  if (options.temperature <= 0.0) return int32_t(std::max_element(logits, logits + vocab_size) - logits);
  const double max_logit = *std::max_element(logits, logits + vocab_size);
  std::vector<double> probs(static_cast<size_t>(vocab_size));
  for (int64_t i = 0; i < vocab_size; ++i) probs[size_t(i)] = std::exp((logits[i] - max_logit) / options.temperature);
  std::vector<int32_t> order(static_cast<size_t>(vocab_size));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return probs[size_t(a)] > probs[size_t(b)]; });
  // Top-k first, as transformers' warpers run: the nucleus is taken from the k kept tokens.
  const size_t candidates = options.top_k > 0 ? std::min(order.size(), size_t(options.top_k)) : order.size();
  double total = 0.0;
  for (size_t i = 0; i < candidates; ++i) total += probs[size_t(order[i])];
  // Nucleus: the smallest prefix of the sorted tokens whose mass reaches top_p (at least one token).
  double kept_mass = 0.0;
  size_t kept = 0;
  while (kept < candidates && (kept == 0 || kept_mass < options.top_p * total)) kept_mass += probs[size_t(order[kept++])];
  double draw = next_uniform(rng) * kept_mass;
  for (size_t i = 0; i < kept; ++i) {
    draw -= probs[size_t(order[i])];
    if (draw <= 0.0) return order[i];
  }
  return order[kept - 1];
}

int64_t prompt_token_limit(const CausalLM& model) {
  return std::max<int64_t>(model.config().position_limit() - 1, 1);
}

std::vector<std::vector<int32_t>> generate(CausalLM& model, const std::vector<std::vector<int32_t>>& prompts,
                                           const SamplingOptions& options, const StopCondition& stop,
                                           const TokenCallback& on_token) {
  for (const auto& prompt : prompts) FT_CHECK(!prompt.empty(), "generate: empty prompt");
  FT_CHECK(stop.strings.empty() || stop.tokenizer, "generate: stop strings need a tokenizer");
  Rows rows{prompts, std::vector<std::vector<int32_t>>(prompts.size()), std::vector<bool>(prompts.size(), false)};
  const size_t limit = size_t(prompt_token_limit(model));
  for (std::vector<int32_t>& row : rows.tokens)
    if (row.size() > limit) row.erase(row.begin(), row.end() - std::ptrdiff_t(limit));
  if (prompts.empty()) return {};
  if (options.kv_cache) generate_cached(model, rows, options, stop, on_token);
  else generate_uncached(model, rows, options, stop, on_token);
  model.release_logits();  // the uncached path's last forward kept them
  return rows.generated;
}

size_t find_stop_string(const std::string& text, const std::vector<std::string>& strings) {
  size_t first = std::string::npos;
  for (const std::string& stop : strings) first = std::min(first, text.find(stop));
  return first;
}

}  // namespace ft
