// Text generation for samples, the task metric and `finetune generate`:
// batched, greedy (temperature 0) or sampled as transformers' generate()
// does it (repetition penalty, then temperature, top-k and top-p). With the
// key/value cache (the default) the prompts run once, right-padded in one
// batch, and every later step runs one new token per row against the cache;
// without it every step reruns the whole batch (kept as the reference the
// cache is tested against).
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "model/causal_lm.h"

namespace ft {

struct SamplingOptions {
  int64_t max_new_tokens = 48;
  double temperature = 0.0;  // 0 = greedy
  double top_p = 1.0;
  int64_t top_k = 0;                // 0 = no limit; else the k most likely tokens (ties: lower id first)
  double repetition_penalty = 1.0;  // > 1 discourages tokens already in the row (CTRL, as transformers)
  uint64_t seed = 0;
  bool kv_cache = true;
  // The stop id that ended a row is returned as its last token (RL: a
  // completion ends with its eos, as trl's completion_ids do).
  bool keep_stop_id = false;
};

class Tokenizer;

// Where a row's generation ends: at a sampled token in `ids` (not returned:
// the EOS tokens, trainer/data/special_tokens.h), or once its decoded new text
// contains one of `strings` (those tokens are returned; find_stop_string cuts
// the text).
struct StopCondition {
  std::vector<int32_t> ids;
  std::vector<std::string> strings;
  const Tokenizer* tokenizer = nullptr;  // decodes for `strings`; needed only with them
};

// Called with (row, token) for each token as it is generated: streaming.
using TokenCallback = std::function<void(size_t, int32_t)>;

// The most prompt tokens generate() keeps: the model's position_limit() - 1, room
// for one new token.
int64_t prompt_token_limit(const CausalLM& model);

// Continues every prompt until `stop` or max_new_tokens (or the model's
// position limit); returns only the new tokens. A prompt longer than
// prompt_token_limit keeps its last that many tokens (the text the reply
// continues), so it neither fails nor holds back the other rows.
std::vector<std::vector<int32_t>> generate(CausalLM& model, const std::vector<std::vector<int32_t>>& prompts,
                                           const SamplingOptions& options, const StopCondition& stop,
                                           const TokenCallback& on_token = {});

// Where the first of `strings` starts in text; std::string::npos if none does.
size_t find_stop_string(const std::string& text, const std::vector<std::string>& strings);

// The sampler's random numbers: draw k of a generation is splitmix64(seed, k)
// (kernels/dropout_hash.h), a fully specified generator, so samples are
// reproducible across platforms and standard libraries.
struct SamplerRng {
  uint64_t seed = 0;
  uint64_t draws = 0;  // how many numbers were drawn so far
};

// Picks a token from one row of logits, the repetition penalty applied to the
// tokens in `context` (the row's prompt and generated tokens); exposed for tests.
int32_t sample_token(const float* logits, int64_t vocab_size, const SamplingOptions& options, SamplerRng& rng,
                     std::span<const int32_t> context = {});

}  // namespace ft
