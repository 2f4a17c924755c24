// Evaluation: mean loss and perplexity over the eval set, and the task metric
// (ROUGE of greedy generations against the reference completions), for the
// decoder-only models and T5 alike: micro_batch_loss and complete_prompts are
// where the two kinds of model differ.
#pragma once
#include <string>
#include <vector>

#include "model/causal_lm.h"
#include "tokenizer/tokenizer.h"
#include "trainer/data/data.h"
#include "trainer/generate.h"
#include "trainer/report/rouge.h"

namespace ft {

// A batch cut to its longest row (the last position that carries loss), so
// right padding costs no compute.
Batch trim_padding(const Batch& batch, Allocator& host);

struct EvalLoss {
  double loss = 0.0;  // mean over every counted token of the set
  double perplexity = 0.0;
  int64_t tokens = 0;
};

// The mean loss of one micro-batch (batch.counted_tokens > 0), and with
// grad_scale the gradients of grad_scale * loss added to the trainable
// parameters (LanguageModel::forward and forward_backward, whatever the
// model's kind).
float micro_batch_loss(LanguageModel& model, const Batch& batch, const float* grad_scale);

// max_batches 0 = the whole set.
EvalLoss evaluate_loss(LanguageModel& model, const DataLoader& eval, int64_t max_batches);
// What it evaluates: the first max_batches micro-batches (0: all) in file
// order, padding trimmed, those without a counted token left out.
std::vector<Batch> eval_batches(const DataLoader& eval, int64_t max_batches, Allocator& host);
// The result from the sum over batches of mean loss x counted tokens.
EvalLoss eval_loss_of(double loss_sum, int64_t tokens);

// How a prompt's text becomes ids, as training tokenizes its rows: a text
// prompt as text_tokens, [bos] + encode(prompt) (tokenize_example); a rendered chat prompt
// (reply_prompt) as encode(prompt) alone, its special tokens those the template
// wrote, as apply_chat_template tokenizes (no special tokens added).
enum class PromptForm { text, chat };
std::vector<int32_t> prompt_tokens(const Tokenizer& tokenizer, const std::string& prompt,
                                   PromptForm form = PromptForm::text);
// The form of a loaded dataset's prompts: chat rows' are rendered (set_chat_prompts).
PromptForm prompt_form(const Dataset& data);
// A T5's encoder input for a prompt: encode(prompt) + [eos], as in training.
std::vector<int32_t> seq2seq_prompt_tokens(const Tokenizer& tokenizer, const std::string& prompt);

// Continues each prompt and decodes the new tokens, cut before the first stop
// string, batch_size prompts at a time. stop.tokenizer is set to `tokenizer`.
// A decoder-only model is given prompt_tokens(form); T5 reads each prompt as
// its encoder input (seq2seq_prompt_tokens, one at a time, generate_seq2seq).
// cut_prompts, where given, counts the prompts generate() cut to the model's
// positions (prompt_token_limit).
std::vector<std::string> complete_prompts(LanguageModel& model, const Tokenizer& tokenizer,
                                          const std::vector<std::string>& prompts, const SamplingOptions& sampling,
                                          const StopCondition& stop, int64_t batch_size, PromptForm form,
                                          int64_t* cut_prompts = nullptr);

struct TaskMetricResult {
  RougeScores rouge;
  std::vector<std::string> predictions;
  int64_t cut_prompts = 0;  // prompts longer than the model's positions, cut from the left
};

// ROUGE of greedy completions of the first `count` examples' prompts against
// their completions (chat rows' prompts in PromptForm::chat).
TaskMetricResult evaluate_rouge(LanguageModel& model, const Tokenizer& tokenizer, const Dataset& data,
                                int64_t count, int64_t max_new_tokens, const StopCondition& stop,
                                int64_t batch_size);

}  // namespace ft
