#include "trainer/rl/reward_loss.h"

#include <algorithm>
#include <cmath>

#include "kernels/error.h"
#include "trainer/log_sigmoid.h"

namespace ft {

RewardPairLoss reward_pair_loss(double chosen, double rejected, double margin) {
  const double z = chosen - rejected - margin;
  const double dz = -1.0 / (1.0 + std::exp(z));  // d(-log sigmoid(z))/dz = -sigmoid(-z)
  return {softplus_of_minus(z), dz, -dz};
}

RewardBatchLoss reward_batch_loss(const std::vector<double>& chosen, const std::vector<double>& rejected,
                                  const std::vector<double>& margins, double center_rewards_coefficient) {
  const size_t N = chosen.size();
  FT_CHECK(N > 0, "reward loss: no pairs");
  FT_CHECK(rejected.size() == N, "reward loss: ", N, " chosen scores but ", rejected.size(), " rejected");
  FT_CHECK(margins.empty() || margins.size() == N, "reward loss: ", N, " pairs but ", margins.size(), " margins");
  RewardBatchLoss out;
  out.dchosen.resize(N);
  out.drejected.resize(N);
  double accuracy = 0, margin = 0, sum = 0;
  double lowest = chosen[0], highest = chosen[0];
  for (size_t i = 0; i < N; ++i) {
    const RewardPairLoss pair = reward_pair_loss(chosen[i], rejected[i], margins.empty() ? 0.0 : margins[i]);
    // The centring term's derivative: c * d/dr mean((rc + rr)^2) = 2 c (rc + rr) / N for both scores.
    const double centring = 2.0 * center_rewards_coefficient * (chosen[i] + rejected[i]) / double(N);
    out.loss += (pair.loss + center_rewards_coefficient * (chosen[i] + rejected[i]) * (chosen[i] + rejected[i])) /
                double(N);
    out.dchosen[i] = pair.dchosen / double(N) + centring;
    out.drejected[i] = pair.drejected / double(N) + centring;
    accuracy += chosen[i] > rejected[i] ? 1.0 : 0.0;
    margin += chosen[i] - rejected[i];
    sum += chosen[i] + rejected[i];
    lowest = std::min({lowest, chosen[i], rejected[i]});
    highest = std::max({highest, chosen[i], rejected[i]});
  }
  out.metrics = {{"min_reward", lowest},
                 {"mean_reward", sum / double(2 * N)},
                 {"max_reward", highest},
                 {"accuracy", accuracy / double(N)},
                 {"margin", margin / double(N)}};
  return out;
}

}  // namespace ft
