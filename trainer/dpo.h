// Direct Preference Optimization as trl's DPOTrainer computes it (trl 1.16.0,
// DPOTrainer._compute_loss; loss_type sigmoid or ipo, no label smoothing).
// The policy is the model with its LoRA adapters, the reference the same
// model with them disabled (PEFT's disable_adapter(), as trl does for a PEFT
// model): one copy of the weights. Per pair, with logps the summed
// log-probabilities of the completion tokens (eos included, prompt masked):
//   chosen = logp_policy(chosen) - logp_ref(chosen), rejected likewise,
//   sigmoid: -log sigmoid(beta * (chosen - rejected)),
//   ipo:     (chosen / n_chosen - rejected / n_rejected - 1 / (2 beta))^2
//            (n: the completion's token count, as trl averages for IPO),
// the loss being the mean over pairs; rewards are beta * chosen and
// beta * rejected (sums, for both losses).
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "model/causal_lm.h"
#include "trainer/data/data.h"
#include "trainer/data/preference_data.h"
#include "trainer/train_config.h"

namespace ft {

struct PairLogps {
  double policy_chosen = 0, policy_rejected = 0, reference_chosen = 0, reference_rejected = 0;
  int64_t chosen_tokens = 0, rejected_tokens = 0;
};

// One pair's loss and its derivatives in the policy's two log-probabilities.
struct PairLoss {
  double loss = 0, dchosen = 0, drejected = 0;
};
PairLoss dpo_pair_loss(const DpoConfig& config, const PairLogps& logps);

// trl's logged figures summed over pairs; means() gives them by trl's names
// ("loss", "rewards/chosen", "rewards/rejected", "rewards/margins",
// "rewards/accuracies", "logps/chosen", "logps/rejected"), each prefixed.
struct DpoFigures {
  int64_t pairs = 0;
  double loss = 0, rewards_chosen = 0, rewards_rejected = 0, accuracies = 0, logps_chosen = 0, logps_rejected = 0;
  void add(const DpoFigures& other);
  nlohmann::json means(const std::string& prefix = "") const;
};

// The pairs of a micro-batch: its chosen rows' sequences (rows, or with
// padding-free packing the examples) that carry loss tokens; the rest are
// padding.
int64_t count_pairs(const Batch& batch);

// One micro-batch of pairs (preference_data.h's layout; a pair whose rows
// carry no loss token, an epoch's padding, is left out). The reference
// forward runs first, adapters off and without backward state, then the
// policy's. With train, the gradients of pair_weight * (the sum of the pairs'
// losses) are added to the trainable parameters' grads.
DpoFigures dpo_micro_batch(CausalLM& model, const Batch& batch, const DpoConfig& config, bool train,
                           double pair_weight);

// The figures over the first max_batches (0: all) batches of an eval set.
DpoFigures evaluate_dpo(CausalLM& model, const PreferenceLoader& eval, const DpoConfig& config, int64_t max_batches);

}  // namespace ft
