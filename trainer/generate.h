// Text generation for samples and the task metric: batched, greedy
// (temperature 0) or temperature + nucleus (top-p) sampling as transformers'
// generate() does it. Rows are right-padded; with causal attention a row's
// real tokens never see the padding, so one forward serves the whole batch.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/causal_lm.h"

namespace ft {

struct SamplingOptions {
  int64_t max_new_tokens = 48;
  double temperature = 0.0;  // 0 = greedy
  double top_p = 1.0;
  uint64_t seed = 0;
};

class Tokenizer;

// Where a row's generation ends: at a sampled token in `ids` (not returned:
// the EOS tokens, trainer/special_tokens.h), or once its decoded new text
// contains one of `strings` (those tokens are returned; find_stop_string cuts
// the text).
struct StopCondition {
  std::vector<int32_t> ids;
  std::vector<std::string> strings;
  const Tokenizer* tokenizer = nullptr;  // decodes for `strings`; needed only with them
};

// Continues every prompt until `stop` or max_new_tokens (or the model's
// position limit); returns only the new tokens.
std::vector<std::vector<int32_t>> generate(CausalLM& model, const std::vector<std::vector<int32_t>>& prompts,
                                           const SamplingOptions& options, const StopCondition& stop);

// Where the first of `strings` starts in text; std::string::npos if none does.
size_t find_stop_string(const std::string& text, const std::vector<std::string>& strings);

// The sampler's random numbers: draw k of a generation is splitmix64(seed, k)
// (kernels/dropout_hash.h), a fully specified generator, so samples are
// reproducible across platforms and standard libraries.
struct SamplerRng {
  uint64_t seed = 0;
  uint64_t draws = 0;  // how many numbers were drawn so far
};

// Picks a token from one row of logits; exposed for tests.
int32_t sample_token(const float* logits, int64_t vocab_size, const SamplingOptions& options, SamplerRng& rng);

}  // namespace ft
