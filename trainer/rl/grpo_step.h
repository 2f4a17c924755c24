// One GRPO optimizer step as trl's GRPOTrainer takes it
// (steps_per_generation = gradient_accumulation_steps): a generation batch
// of micro_batch_size x grad_accum_steps completions is generated for
// (that / num_generations) prompts, num_generations each, sampled at
// temperature 1 with the KV cache; the rewards (rewards.h) give advantages
// per group (grpo.h). The batch serves grpo.num_iterations consecutive
// optimizer steps (trl's mu, its _buffered_inputs): with num_iterations 1
// each step generates anew and the loss is on-policy (the ratio is 1, its
// gradient the advantage); above 1 the generation also keeps the policy's
// log-probabilities at generation time (old_logps, an eval forward as
// trl's no-grad pass; LoRA dropout is not applied to it) and the later
// steps' ratios move away from 1, clipped. With beta > 0 the k3 KL to the
// reference (the same model, adapters disabled) is read at generation too.
// Each micro-batch of completions runs the policy forward and backward with
// the clipped-ratio loss; the step's gradients accumulate in the model and
// the caller steps the optimizer.
#pragma once
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/causal_lm.h"
#include "trainer/generate.h"
#include "trainer/rl/grpo.h"
#include "trainer/rl/prompts.h"
#include "trainer/rl/rewards.h"
#include "trainer/rl/rollouts.h"

namespace ft {

struct GrpoStep {
  RolloutSampler sampler;  // temperature 1; top_p, top_k; rows_per_batch = micro_batch_size
  const GrpoConfig& config;
  const RewardRules& rules;
  const RewardModel* reward_model;  // null unless rules.model
  int32_t pad_id = 0;
  int64_t micro_batch_size = 0;  // completions per micro-batch
  int64_t grad_accum_steps = 1;
};

// A generation batch and what the loss needs of it, per micro-batch of
// completions: [rows * width] log-probabilities at generation (old_logps,
// num_iterations > 1 only) and of the reference (beta > 0 only).
struct GrpoGeneration {
  int64_t step = -1;  // the optimizer step that generated it; -1: none
  std::vector<Rollout> completions;
  nlohmann::json reward_figures;   // trl's reward, rewards/<rule>/mean and /std, reward_std
  std::vector<double> advantages;  // [completion]
  std::vector<std::vector<double>> old_logps, ref_logps;
};

// Generates, rewards and reads the log-probabilities of step's generation batch from prompts.
GrpoGeneration grpo_generate(const GrpoStep& s, const std::vector<const PromptRow*>& prompts, int64_t step);

// Trains on generation's completions (generated at this step or up to
// num_iterations - 1 steps before); returns trl's figures ("loss",
// "reward", "reward_std", "rewards/<rule>/mean", "kl", "clip_ratio/...",
// "completions/mean_length", "completions/clipped_ratio"), the reward
// figures those of the generation trained on.
nlohmann::json grpo_step(const GrpoStep& s, const GrpoGeneration& generation, int64_t step);

// A generation batch as JSON for the training state (a run saved between
// its iterations resumes on the same completions): each completion's prompt
// as an index into rows, its tokens, and the figures, advantages and
// log-probabilities (doubles round-trip exactly). from_json rebuilds it
// over the same rows, without the completions' text (the rewards read it,
// and theirs are saved; the loss reads tokens); an index out of range is an
// Error naming `where`.
nlohmann::json to_json(const GrpoGeneration& generation, const std::vector<PromptRow>& rows);
GrpoGeneration grpo_generation_from_json(const nlohmann::json& state, const std::vector<PromptRow>& rows,
                                         const std::string& where);

}  // namespace ft
