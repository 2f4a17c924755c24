// One PPO step as trl's classic PPOTrainer.step takes it (trl 0.11.4; the
// course's lab 3 and the 20B blog post): ppo.batch_size prompts, one
// sampled response each (the KV cache; the eos that ends it kept); their
// scores from the rewards (rewards.h: a reward model, or rules); a forward
// without gradients gives the policy's log-probabilities, the value head's
// values and the reference's log-probabilities (the same model with its
// adapters disabled); per-token rewards with the KL penalty and GAE
// advantages (ppo.h); then ppo_epochs passes over the rollouts in a
// shuffled order, mini_batch_size rows a forward and backward, an optimizer
// update every gradient_accumulation_steps mini-batches (update()), with
// trl's clipped policy and value losses. The KL controller is updated from
// the step's objective/kl at the end.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include <nlohmann/json.hpp>

#include "trainer/rl/ppo.h"
#include "trainer/rl/rollouts.h"

namespace ft {

struct PpoStep {
  RolloutSampler sampler;  // the policy: built with OutputHead::value
  const PpoConfig& config;
  const RewardRules& rules;
  const RewardModel* reward_model;  // null unless rules.model
  int32_t pad_id = 0;
  int64_t forward_rows = 1;  // rows a forward without gradients
  // One optimizer update from the gradients accumulated since the last:
  // returns the gradient norm; the gradients are zeroed after it.
  std::function<double()> update;
};

// trl's step stats (ppo_step_stats' objective/... and ppo/..., plus
// "ppo/grad_norm" the last update's, "ppo/updates", "ppo/early_stop") after
// the step; kl holds the coefficient for the next step.
nlohmann::json ppo_step(const PpoStep& s, KlController& kl, const std::vector<const PromptRow*>& prompts,
                        int64_t step);

}  // namespace ft
