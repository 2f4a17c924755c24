// What online RL (objective: grpo, ppo) does with completions: sample them
// from prompts with the KV cache, and lay them out as training rows whose
// per-token log-probabilities (and values) map to the completion's tokens.
// The policy is a decoder-only model (prompt and completion in one row) or
// an encoder-decoder one (T5, as trl's seq2seq policies): the encoder reads
// the prompt, the decoder starts from decoder_start_token_id and its tokens
// are the completion ("response" in trl).
#pragma once
#include <cstdint>
#include <vector>

#include "model/causal_lm.h"
#include "model/t5.h"
#include "trainer/generate.h"
#include "trainer/rl/prompts.h"
#include "trainer/rl/rewards.h"

namespace ft {

struct RolloutSampler {
  LanguageModel& model;  // decoder-only, or seq2seq (as_seq2seq())
  const Tokenizer& tokenizer;
  SamplingOptions sampling;  // its seed is set per generation batch
  StopCondition stop;
  int64_t rows_per_batch = 1;  // prompts generated together
  uint64_t seed = 0;
};

// Each prompt `repeats` times in order, continued until a stop id (kept as
// the completion's last token) or sampling.max_new_tokens; the draws depend
// on (seed, step) only. Rollout.text is the decoded completion without its stop id.
std::vector<Rollout> generate_completions(const RolloutSampler& s, const std::vector<const PromptRow*>& prompts,
                                          int64_t repeats, int64_t step);

// Whether a completion ended at a stop id (else it reached max_new_tokens).
bool ended_by_stop(const Rollout& rollout, const StopCondition& stop);

// Rollouts [begin, end) as the policy's training rows, right-padded with
// pad_id. Decoder-only: ids prompt + completion, next-token targets the
// completion's tokens only. Seq2seq: encoder_ids the prompts (with their
// lengths, the padding mask), ids decoder_start_token_id then the
// completion but its last token, targets the completion (first_target 0).
// Completion token j of row r is the target at r * T + first_target[r] + j.
struct CompletionBatch {
  Tensor ids, targets;
  std::vector<int64_t> first_target;
  int64_t rows = 0, T = 0, width = 0;  // width: the longest completion's tokens
  Tensor encoder_ids;                    // seq2seq only: host i32 [rows, S]
  std::vector<int32_t> encoder_lengths;  // seq2seq only
};
CompletionBatch completion_batch(LanguageModel& model, const std::vector<Rollout>& rollouts, size_t begin, size_t end,
                                 int32_t pad_id, Allocator& host);

// The policy's log p(target) of every batch token ([rows * T]) from one eval
// forward; head, when given, reads the final hidden states (the decoder's).
std::vector<float> policy_token_logps(LanguageModel& model, const CompletionBatch& batch,
                                      const HiddenHead* head = nullptr);
// The same in training mode, with the backward of the loss whose derivative
// in each token's log-probability gradient() returns, plus the head's.
void policy_token_logps_backward(LanguageModel& model, const CompletionBatch& batch,
                                 const TokenLogpsGradient& gradient, const HiddenHead* head = nullptr);

// The batch's per-token values ([rows * T], as token_logps gives them) as
// [rows * width] completion tokens, row r written at out[(row_offset + r) *
// width + j]; width >= batch.width.
void gather_completion_tokens(const CompletionBatch& batch, const std::vector<float>& token_values, int64_t width,
                              int64_t row_offset, std::vector<double>& out);
// The inverse for gradients: [rows * width] completion-token values (from
// row_offset) placed at their [rows * T] token positions, times scale.
std::vector<float> scatter_completion_tokens(const CompletionBatch& batch, const std::vector<double>& values,
                                             int64_t width, int64_t row_offset, double scale);
// 1 for each completion token of rollouts [begin, begin + rows), 0 for padding, [rows * width].
std::vector<uint8_t> completion_mask(const std::vector<Rollout>& rollouts, size_t begin, int64_t rows,
                                     int64_t width);

// The reference's token log-probabilities: the same model, adapters off.
std::vector<float> reference_logps(LanguageModel& model, const CompletionBatch& batch);

// Held-out figures: one completion per prompt from a fixed seed (the same
// draws before and after training), the rewards' figures (rewards.h; their
// mean as "reward", their unbiased std as "reward_std") and the mean over
// completions of sum_t (logp - logp_ref), the sequence KL to the reference
// that PPO reports as objective/kl ("kl"); the completions and their
// rewards too.
struct HeldOutRollouts {
  std::vector<Rollout> completions;
  Rewards rewards;
  nlohmann::json figures;
};
HeldOutRollouts evaluate_rollouts(const RolloutSampler& sampler, const RewardRules& rules,
                                  const RewardModel* reward_model, int32_t pad_id,
                                  const std::vector<const PromptRow*>& prompts);

}  // namespace ft
