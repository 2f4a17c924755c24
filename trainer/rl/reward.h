// Reward models as trl's RewardTrainer trains them: a decoder with
// transformers' score head (model/output_head.h, num_labels 1) scores each
// sequence at its last non-padding token, as *ForSequenceClassification
// does, and each preference pair's loss is -log sigmoid(r_chosen -
// r_rejected), the mean over pairs. The pairs come as DPO's
// (preference_data.h): rows [0, P) the chosen sequences, [P, 2P) the
// rejected ones, prompt and completion scored together.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/causal_lm.h"
#include "trainer/data/data.h"
#include "trainer/data/preference_data.h"

namespace ft {

// A batch's rows as a sequence classifier reads them: each row's whole
// sequence -- its inputs and its last target -- host i32 [R, T + 1], padded
// with pad_id; and where transformers reads the score: the last position
// not holding pad_id (-1: a row with no loss token, an epoch's padding).
struct ScoredRows {
  Tensor ids;
  std::vector<int64_t> score_positions;
};
ScoredRows scored_rows(const Batch& batch, int32_t pad_id, Allocator& host);
// The same from whole sequences (tokenize_example's tokens: prompt,
// completion, eos), as `finetune score` reads rows.
ScoredRows scored_sequences(const std::vector<TokenSequence>& sequences, int32_t pad_id, Allocator& host);

// Each row's score (host [R]; 0 for rows at position -1) from one forward.
std::vector<double> sequence_scores(CausalLM& model, const ScoredRows& rows);

// trl's logged figures over pairs (reward_loss.h); means() gives them by
// trl's names ("loss", "accuracy", "margin", "mean_reward", "min_reward",
// "max_reward"), each prefixed.
struct RewardFigures {
  int64_t pairs = 0;
  double loss = 0, accuracy = 0, margin = 0, rewards = 0;  // sums; rewards: of both scores
  double min_reward = INFINITY, max_reward = -INFINITY;
  void add(const RewardFigures& other);
  nlohmann::json means(const std::string& prefix = "") const;
};

// One micro-batch of pairs (padding pairs left out). With train, the
// gradients of pair_weight * (the sum of the pairs' losses) are added to the
// trainable parameters' grads (adapters and the score head).
RewardFigures reward_micro_batch(CausalLM& model, const Batch& batch, int32_t pad_id, bool train,
                                 double pair_weight);

// The figures over the first max_batches (0: all) batches of an eval set.
RewardFigures evaluate_reward(CausalLM& model, const PreferenceLoader& eval, int32_t pad_id, int64_t max_batches);

}  // namespace ft
