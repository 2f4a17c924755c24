#include "trainer/evaluate.h"

#include <algorithm>
#include <cmath>

#include "kernels/error.h"
#include "model/t5.h"
#include "trainer/data/data.h"
#include "trainer/generate_seq2seq.h"

namespace ft {

Batch trim_padding(const Batch& batch, Allocator& host) {
  const int64_t B = batch.input_ids.dim(0), T = batch.input_ids.dim(1);
  int64_t used = 1;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = T; t-- > used;)
      if (batch.targets.ptr<int32_t>()[b * T + t] != kIgnoreIndex) {
        used = t + 1;
        break;
      }
  auto trim = [&](const Tensor& full) {
    if (!full.defined()) return Tensor{};
    Tensor columns = Tensor::empty({B, used}, DType::i32, host, MemCategory::activations);
    for (int64_t b = 0; b < B; ++b) std::copy_n(full.ptr<int32_t>() + b * T, used, columns.ptr<int32_t>() + b * used);
    return columns;
  };
  // A prefix of packed position_ids still restarts at each example it keeps.
  return Batch{trim(batch.input_ids), trim(batch.targets), batch.counted_tokens, trim(batch.position_ids),
               batch.margins};
}

float micro_batch_loss(LanguageModel& model, const Batch& batch, const float* grad_scale) {
  return grad_scale ? model.forward_backward(batch.input_ids, batch.targets, *grad_scale, batch.positions())
                    : model.forward(batch.input_ids, batch.targets, batch.positions());
}

std::vector<Batch> eval_batches(const DataLoader& eval, int64_t max_batches, Allocator& host) {
  const int64_t batches = max_batches > 0 ? std::min(max_batches, eval.batches_per_epoch()) : eval.batches_per_epoch();
  std::vector<Batch> counted;
  for (int64_t i = 0; i < batches; ++i) {
    Batch batch = trim_padding(eval.batch_in_order(i), host);
    if (batch.counted_tokens > 0) counted.push_back(std::move(batch));
  }
  return counted;
}

EvalLoss eval_loss_of(double loss_sum, int64_t tokens) {
  EvalLoss result;
  result.tokens = tokens;
  result.loss = tokens ? loss_sum / double(tokens) : 0.0;
  result.perplexity = std::exp(result.loss);
  return result;
}

EvalLoss evaluate_loss(LanguageModel& model, const DataLoader& eval, int64_t max_batches) {
  HostAllocator host;
  double loss_sum = 0.0;
  int64_t tokens = 0;
  for (const Batch& batch : eval_batches(eval, max_batches, host)) {
    loss_sum += double(micro_batch_loss(model, batch, nullptr)) * double(batch.counted_tokens);
    tokens += batch.counted_tokens;
  }
  model.release_logits();
  return eval_loss_of(loss_sum, tokens);
}

std::vector<int32_t> prompt_tokens(const Tokenizer& tokenizer, const std::string& prompt, PromptForm form) {
  return form == PromptForm::text ? text_tokens(tokenizer, prompt) : tokenizer.encode(prompt);
}

PromptForm prompt_form(const Dataset& data) {
  return data.format == DataFormat::chat ? PromptForm::chat : PromptForm::text;
}

std::vector<int32_t> seq2seq_prompt_tokens(const Tokenizer& tokenizer, const std::string& prompt) {
  std::vector<int32_t> tokens = tokenizer.encode(prompt);
  tokens.push_back(tokenizer.eos_id());  // as tokenize_seq2seq_example
  return tokens;
}

std::vector<std::string> complete_prompts(LanguageModel& model, const Tokenizer& tokenizer,
                                          const std::vector<std::string>& prompts, const SamplingOptions& sampling,
                                          const StopCondition& stop, int64_t batch_size, PromptForm form,
                                          int64_t* cut_prompts) {
  StopCondition decoding_stop = stop;
  decoding_stop.tokenizer = &tokenizer;
  T5Model* t5 = model.as_seq2seq();  // an encoder-decoder model generates from the encoder's tokens
  std::vector<std::string> completions;
  for (size_t first = 0; first < prompts.size(); first += size_t(batch_size)) {
    std::vector<std::vector<int32_t>> batch;
    for (size_t i = first; i < std::min(prompts.size(), first + size_t(batch_size)); ++i) {
      batch.push_back(t5 ? seq2seq_prompt_tokens(tokenizer, prompts[i]) : prompt_tokens(tokenizer, prompts[i], form));
      if (cut_prompts && !t5) *cut_prompts += int64_t(batch.back().size()) > prompt_token_limit(*model.as_causal_lm());
    }
    SamplingOptions options = sampling;
    options.seed = sampling.seed + first;
    const std::vector<std::vector<int32_t>> generated_rows =
        t5 ? generate_seq2seq(*t5, batch, options, decoding_stop)
           : generate(*model.as_causal_lm(), batch, options, decoding_stop);
    for (const auto& generated : generated_rows) {
      std::string text = tokenizer.decode(generated);
      completions.push_back(text.substr(0, find_stop_string(text, stop.strings)));
    }
  }
  return completions;
}

TaskMetricResult evaluate_rouge(LanguageModel& model, const Tokenizer& tokenizer, const Dataset& data,
                                int64_t count, int64_t max_new_tokens, const StopCondition& stop,
                                int64_t batch_size) {
  std::vector<std::string> prompts, references;
  for (int64_t i = 0; i < std::min<int64_t>(count, int64_t(data.examples.size())); ++i) {
    prompts.push_back(data.examples[size_t(i)].prompt);
    references.push_back(data.examples[size_t(i)].completion);
  }
  SamplingOptions greedy;
  greedy.max_new_tokens = max_new_tokens;
  TaskMetricResult result;
  result.predictions = complete_prompts(model, tokenizer, prompts, greedy, stop, batch_size, prompt_form(data),
                                        &result.cut_prompts);
  result.rouge = rouge_corpus(references, result.predictions);
  return result;
}

}  // namespace ft
