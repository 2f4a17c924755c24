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

// Trains on one step's rollouts; returns trl's figures ("loss", "reward",
// "reward_std", "rewards/<rule>/mean", "kl", "clip_ratio/...",
// "completions/mean_length", "completions/clipped_ratio").
nlohmann::json grpo_step(const GrpoStep& s, const std::vector<const PromptRow*>& prompts, int64_t step);

}  // namespace ft
