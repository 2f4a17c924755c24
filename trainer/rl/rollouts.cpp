#include "trainer/rl/rollouts.h"

#include <algorithm>

#include "kernels/dropout_hash.h"
#include "kernels/error.h"
#include "trainer/generate_seq2seq.h"
#include "trainer/rl/grpo.h"

namespace ft {

bool ended_by_stop(const Rollout& rollout, const StopCondition& stop) {
  return !rollout.tokens.empty() && std::find(stop.ids.begin(), stop.ids.end(), rollout.tokens.back()) != stop.ids.end();
}

std::vector<Rollout> generate_completions(const RolloutSampler& s, const std::vector<const PromptRow*>& prompts,
                                          int64_t repeats, int64_t step) {
  std::vector<Rollout> rollouts;
  for (const PromptRow* prompt : prompts)
    for (int64_t g = 0; g < repeats; ++g)
      rollouts.push_back({&prompt->row, prompt->prompt, prompt->tokens, {}, "", &prompt->messages});
  const size_t chunk = size_t(std::max<int64_t>(s.rows_per_batch, 1));
  for (size_t first = 0; first < rollouts.size(); first += chunk) {
    const size_t end = std::min(rollouts.size(), first + chunk);
    std::vector<std::vector<int32_t>> inputs;
    for (size_t i = first; i < end; ++i) inputs.push_back(rollouts[i].prompt_tokens);
    SamplingOptions sampling = s.sampling;
    sampling.seed = splitmix64(splitmix64(s.seed, 0x67656e00ULL + uint64_t(step)), uint64_t(first));
    sampling.keep_stop_id = true;
    T5Model* t5 = s.model.as_seq2seq();
    const std::vector<std::vector<int32_t>> generated = t5 ? generate_seq2seq(*t5, inputs, sampling, s.stop)
                                                           : generate(*s.model.as_causal_lm(), inputs, sampling, s.stop);
    for (size_t i = first; i < end; ++i) {
      Rollout& r = rollouts[i];
      r.tokens = generated[i - first];
      std::vector<int32_t> text_tokens = r.tokens;
      if (ended_by_stop(r, s.stop)) text_tokens.pop_back();
      r.text = s.tokenizer.decode(text_tokens);
    }
  }
  return rollouts;
}

namespace {

// Encoder rows: each rollout's prompt, right-padded, with its length.
void add_encoder_rows(CompletionBatch& batch, const std::vector<Rollout>& rollouts, size_t begin, int32_t pad_id,
                      Allocator& host) {
  int64_t S = 1;
  for (int64_t r = 0; r < batch.rows; ++r) S = std::max<int64_t>(S, int64_t(rollouts[begin + size_t(r)].prompt_tokens.size()));
  batch.encoder_ids = Tensor::empty({batch.rows, S}, DType::i32, host, MemCategory::activations);
  std::fill_n(batch.encoder_ids.ptr<int32_t>(), batch.rows * S, pad_id);
  for (int64_t r = 0; r < batch.rows; ++r) {
    const std::vector<int32_t>& prompt = rollouts[begin + size_t(r)].prompt_tokens;
    std::copy(prompt.begin(), prompt.end(), batch.encoder_ids.ptr<int32_t>() + r * S);
    batch.encoder_lengths.push_back(int32_t(prompt.size()));
  }
}

}  // namespace

CompletionBatch completion_batch(LanguageModel& model, const std::vector<Rollout>& rollouts, size_t begin, size_t end,
                                 int32_t pad_id, Allocator& host) {
  const bool seq2seq = model.as_seq2seq() != nullptr;
  const int32_t decoder_start = int32_t(model.config().decoder_start_token_id);
  CompletionBatch batch;
  batch.rows = int64_t(end - begin);
  for (size_t i = begin; i < end; ++i) {
    const Rollout& c = rollouts[i];
    const size_t decoder_tokens = seq2seq ? c.tokens.size() + 1 : c.prompt_tokens.size() + c.tokens.size();
    batch.T = std::max<int64_t>(batch.T, int64_t(decoder_tokens) - 1);
    batch.width = std::max<int64_t>(batch.width, int64_t(c.tokens.size()));
  }
  batch.T = std::max<int64_t>(batch.T, 1);
  batch.ids = Tensor::empty({batch.rows, batch.T}, DType::i32, host, MemCategory::activations);
  batch.targets = Tensor::empty({batch.rows, batch.T}, DType::i32, host, MemCategory::activations);
  int32_t* ids = batch.ids.ptr<int32_t>();
  int32_t* targets = batch.targets.ptr<int32_t>();
  std::fill_n(ids, batch.rows * batch.T, pad_id);
  std::fill_n(targets, batch.rows * batch.T, kIgnoreIndex);
  for (int64_t r = 0; r < batch.rows; ++r) {
    const Rollout& c = rollouts[begin + size_t(r)];
    FT_CHECK(!c.prompt_tokens.empty(), "a rollout's prompt has no token (an empty prompt without bos)");
    // The decoder's row: its start token, then the completion (seq2seq); else the prompt, then the completion.
    std::vector<int32_t> sequence = seq2seq ? std::vector<int32_t>{decoder_start} : c.prompt_tokens;
    sequence.insert(sequence.end(), c.tokens.begin(), c.tokens.end());
    for (size_t t = 0; t + 1 < sequence.size(); ++t) ids[r * batch.T + int64_t(t)] = sequence[t];
    batch.first_target.push_back(seq2seq ? 0 : int64_t(c.prompt_tokens.size()) - 1);
    for (size_t j = 0; j < c.tokens.size(); ++j)
      targets[r * batch.T + batch.first_target.back() + int64_t(j)] = c.tokens[j];
  }
  if (seq2seq) add_encoder_rows(batch, rollouts, begin, pad_id, host);
  return batch;
}

std::vector<float> policy_token_logps(LanguageModel& model, const CompletionBatch& batch, const HiddenHead* head) {
  if (T5Model* t5 = model.as_seq2seq())
    return t5->token_logps(batch.encoder_ids, batch.encoder_lengths, batch.ids, batch.targets, head);
  return model.as_causal_lm()->token_logps(batch.ids, batch.targets, nullptr, head);
}

void policy_token_logps_backward(LanguageModel& model, const CompletionBatch& batch,
                                 const TokenLogpsGradient& gradient, const HiddenHead* head) {
  if (T5Model* t5 = model.as_seq2seq())
    t5->token_logps_backward(batch.encoder_ids, batch.encoder_lengths, batch.ids, batch.targets, gradient, head);
  else
    model.as_causal_lm()->token_logps_backward(batch.ids, batch.targets, gradient, nullptr, head);
}

void gather_completion_tokens(const CompletionBatch& batch, const std::vector<float>& token_values, int64_t width,
                              int64_t row_offset, std::vector<double>& out) {
  const int32_t* targets = batch.targets.ptr<int32_t>();
  for (int64_t r = 0; r < batch.rows; ++r)
    for (int64_t j = 0; j < batch.width && batch.first_target[size_t(r)] + j < batch.T; ++j) {
      const int64_t n = r * batch.T + batch.first_target[size_t(r)] + j;
      if (targets[n] != kIgnoreIndex) out[size_t((row_offset + r) * width + j)] = token_values[size_t(n)];
    }
}

std::vector<float> scatter_completion_tokens(const CompletionBatch& batch, const std::vector<double>& values,
                                             int64_t width, int64_t row_offset, double scale) {
  std::vector<float> out(size_t(batch.rows * batch.T), 0.0f);
  const int32_t* targets = batch.targets.ptr<int32_t>();
  for (int64_t r = 0; r < batch.rows; ++r)
    for (int64_t j = 0; j < batch.width && batch.first_target[size_t(r)] + j < batch.T; ++j) {
      const int64_t n = r * batch.T + batch.first_target[size_t(r)] + j;
      if (targets[n] != kIgnoreIndex) out[size_t(n)] = float(scale * values[size_t((row_offset + r) * width + j)]);
    }
  return out;
}

std::vector<uint8_t> completion_mask(const std::vector<Rollout>& rollouts, size_t begin, int64_t rows,
                                     int64_t width) {
  std::vector<uint8_t> mask(size_t(rows * width), 0);
  for (int64_t r = 0; r < rows; ++r) std::fill_n(mask.begin() + r * width, rollouts[begin + size_t(r)].tokens.size(), uint8_t(1));
  return mask;
}

std::vector<float> reference_logps(LanguageModel& model, const CompletionBatch& batch) {
  AdaptersDisabled off(model);
  return policy_token_logps(model, batch);
}

HeldOutRollouts evaluate_rollouts(const RolloutSampler& sampler, const RewardRules& rules,
                                  const RewardModel* reward_model, int32_t pad_id,
                                  const std::vector<const PromptRow*>& prompts) {
  // A step number no training step reaches: the same draws at every evaluation.
  HeldOutRollouts out{generate_completions(sampler, prompts, 1, -1), {}, {}};
  const std::vector<Rollout>& completions = out.completions;
  out.rewards = compute_rewards(rules, completions, reward_model);
  double kl_sum = 0.0;
  HostAllocator host;
  const size_t chunk = size_t(std::max<int64_t>(sampler.rows_per_batch, 1));
  for (size_t first = 0; first < completions.size(); first += chunk) {
    const size_t end = std::min(completions.size(), first + chunk);
    const CompletionBatch batch = completion_batch(sampler.model, completions, first, end, pad_id, host);
    std::vector<double> policy(size_t(batch.rows * batch.width)), reference(policy.size());
    gather_completion_tokens(batch, policy_token_logps(sampler.model, batch), batch.width, 0, policy);
    gather_completion_tokens(batch, reference_logps(sampler.model, batch), batch.width, 0, reference);
    for (size_t n = 0; n < policy.size(); ++n) kl_sum += policy[n] - reference[n];
  }
  out.figures = out.rewards.metrics();
  const std::vector<double>& total = out.rewards.total;
  out.figures["reward_std"] = total.size() > 1 ? unbiased_std(total, 0, total.size()) : 0.0;
  out.figures["kl"] = kl_sum / double(completions.size());
  return out;
}

}  // namespace ft
