// Evaluation: mean loss and perplexity over the eval set, and the task metric
// (ROUGE of greedy generations against the reference completions).
#pragma once
#include <string>
#include <vector>

#include "model/causal_lm.h"
#include "tokenizer/tokenizer.h"
#include "trainer/data.h"
#include "trainer/generate.h"
#include "trainer/rouge.h"

namespace ft {

// A batch cut to its longest row (the last position that carries loss), so
// right padding costs no compute.
Batch trim_padding(const Batch& batch, Allocator& host);

struct EvalLoss {
  double loss = 0.0;  // mean over every counted token of the set
  double perplexity = 0.0;
  int64_t tokens = 0;
};

// max_batches 0 = the whole set.
EvalLoss evaluate_loss(CausalLM& model, const DataLoader& eval, int64_t max_batches);

// The ids a prompt is given to the model as: [bos] + encode(prompt), as in training.
std::vector<int32_t> prompt_tokens(const Tokenizer& tokenizer, const std::string& prompt);

// Continues each prompt and decodes the new tokens, cut before the first stop
// string, batch_size prompts at a time. stop.tokenizer is set to `tokenizer`.
std::vector<std::string> complete_prompts(CausalLM& model, const Tokenizer& tokenizer,
                                          const std::vector<std::string>& prompts, const SamplingOptions& sampling,
                                          const StopCondition& stop, int64_t batch_size);

struct TaskMetricResult {
  RougeScores rouge;
  std::vector<std::string> predictions;
};

// ROUGE of greedy completions of the first `count` examples' prompts against
// their completions.
TaskMetricResult evaluate_rouge(CausalLM& model, const Tokenizer& tokenizer,
                                const std::vector<Example>& examples, int64_t count, int64_t max_new_tokens,
                                const StopCondition& stop, int64_t batch_size);

}  // namespace ft
