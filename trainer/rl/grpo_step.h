// One GRPO optimizer step as trl's GRPOTrainer takes it with its defaults
// (steps_per_generation = gradient_accumulation_steps, num_iterations 1):
// micro_batch_size x grad_accum_steps completions are generated for
// (that / num_generations) prompts, num_generations each, sampled at
// temperature 1 with the KV cache; the rewards (rewards.h) give
// advantages per group (grpo.h); then each micro-batch of completions runs
// the policy forward and backward with the clipped-ratio loss (on-policy:
// the ratio is 1, its gradient the advantage), with beta > 0 the k3 KL to
// the reference, the same model with its adapters disabled. The step's
// gradients accumulate in the model; the caller steps the optimizer.
#pragma once
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/causal_lm.h"
#include "trainer/generate.h"
#include "trainer/rl/grpo.h"
#include "trainer/rl/prompts.h"
#include "trainer/rl/rewards.h"

namespace ft {

struct GrpoStep {
  CausalLM& model;
  const Tokenizer& tokenizer;
  const GrpoConfig& config;
  const RewardRules& rules;
  const RewardModel* reward_model;  // null unless rules.model
  SamplingOptions sampling;         // temperature 1; top_p, top_k; seed set per step
  StopCondition stop;
  int32_t pad_id = 0;
  int64_t micro_batch_size = 0;  // completions per micro-batch
  int64_t grad_accum_steps = 1;
  uint64_t seed = 0;
};

// The step's completions for prompts (each num_generations times, in
// order), from generation seeds drawn from (seed, step).
std::vector<Rollout> generate_completions(const GrpoStep& s, const std::vector<const PromptRow*>& prompts,
                                             int64_t repeats, int64_t step);

// Trains on one step's rollouts; returns trl's figures ("loss", "reward",
// "reward_std", "rewards/<rule>/mean", "kl", "clip_ratio/...",
// "completions/mean_length", "completions/clipped_ratio").
nlohmann::json grpo_step(const GrpoStep& s, const std::vector<const PromptRow*>& prompts, int64_t step);

// Held-out figures: one completion per prompt from a fixed seed (the same
// draws before and after training), its mean reward ("reward") and the mean
// over completions of sum_t (logp - logp_ref), the sequence KL to the
// reference that PPO reports as objective/kl ("kl").
nlohmann::json evaluate_rollouts(const GrpoStep& s, const std::vector<const PromptRow*>& prompts);

}  // namespace ft
