// A reward model's pairwise loss as trl's RewardTrainer computes it (trl
// 1.16.0, RewardTrainer.compute_loss). With r the model's scalar score of a
// completion and m an optional per-pair margin (0 when the data has none):
//   loss = mean over pairs of -log sigmoid(r_chosen - r_rejected - m)
//          + center_rewards_coefficient * mean over pairs of (r_chosen + r_rejected)^2,
// the second term only when RewardConfig.center_rewards_coefficient is set
// (trl's default None: 0 here). trl logs min_reward, mean_reward and
// max_reward over all 2N scores, accuracy (the fraction of pairs with
// r_chosen > r_rejected, strictly) and margin (the mean of r_chosen -
// r_rejected, the margin input not subtracted).
#pragma once
#include <vector>

#include <nlohmann/json.hpp>

namespace ft {

// One pair's -log sigmoid(chosen - rejected - margin) and its derivatives.
struct RewardPairLoss {
  double loss = 0, dchosen = 0, drejected = 0;
};
RewardPairLoss reward_pair_loss(double chosen, double rejected, double margin);

// A batch of N pairs: the loss above, its derivatives in every score, and
// trl's logged figures by trl's names.
struct RewardBatchLoss {
  double loss = 0;
  std::vector<double> dchosen, drejected;  // [N]
  nlohmann::json metrics;                  // min_reward, mean_reward, max_reward, accuracy, margin
};
// margins: empty (no margin column) or [N]; center_rewards_coefficient 0: no
// centring term.
RewardBatchLoss reward_batch_loss(const std::vector<double>& chosen, const std::vector<double>& rejected,
                                  const std::vector<double>& margins, double center_rewards_coefficient);

}  // namespace ft
