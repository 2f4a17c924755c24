#include "trainer/dpo.h"

#include <algorithm>
#include <cmath>

#include "kernels/error.h"
#include "trainer/evaluate.h"
#include "trainer/log_sigmoid.h"

namespace ft {

PairLoss dpo_pair_loss(const DpoConfig& config, const PairLogps& logps) {
  const double chosen = logps.policy_chosen - logps.reference_chosen;
  const double rejected = logps.policy_rejected - logps.reference_rejected;
  const double beta = config.beta;
  PairLoss out;
  if (config.loss == DpoLoss::sigmoid) {
    const double z = beta * (chosen - rejected);
    out.loss = softplus_of_minus(z);
    const double dz = -beta / (1.0 + std::exp(z));  // d(-log sigmoid(z))/dz = -sigmoid(-z), times dz/dh = beta
    out.dchosen = dz;
    out.drejected = -dz;
    return out;
  }
  const double n_chosen = double(std::max<int64_t>(logps.chosen_tokens, 1));
  const double n_rejected = double(std::max<int64_t>(logps.rejected_tokens, 1));
  const double gap = chosen / n_chosen - rejected / n_rejected - 1.0 / (2.0 * beta);
  out.loss = gap * gap;
  out.dchosen = 2.0 * gap / n_chosen;
  out.drejected = -2.0 * gap / n_rejected;
  return out;
}

void DpoFigures::add(const DpoFigures& other) {
  pairs += other.pairs;
  loss += other.loss;
  rewards_chosen += other.rewards_chosen;
  rewards_rejected += other.rewards_rejected;
  accuracies += other.accuracies;
  logps_chosen += other.logps_chosen;
  logps_rejected += other.logps_rejected;
}

nlohmann::json DpoFigures::means(const std::string& prefix) const {
  const double n = double(std::max<int64_t>(pairs, 1));
  return {{prefix + "loss", loss / n},
          {prefix + "rewards/chosen", rewards_chosen / n},
          {prefix + "rewards/rejected", rewards_rejected / n},
          {prefix + "rewards/margins", (rewards_chosen - rewards_rejected) / n},
          {prefix + "rewards/accuracies", accuracies / n},
          {prefix + "logps/chosen", logps_chosen / n},
          {prefix + "logps/rejected", logps_rejected / n}};
}

namespace {

PairLogps pair_logps(const SequenceLogps& policy, const SequenceLogps& reference, size_t chosen, size_t rejected) {
  return {policy.logps[chosen],           policy.logps[rejected], reference.logps[chosen], reference.logps[rejected],
          policy.counted_tokens[chosen], policy.counted_tokens[rejected]};
}

// Pair j: the j-th sequence that carries loss among the chosen rows [0, P)
// and the j-th among the rejected rows [P, 2P): a row each, or with packed
// rows the examples, which PreferenceLoader lays out in the same order on
// both sides. Padding (rows and packed rows' tails) carries no loss.
std::vector<std::pair<size_t, size_t>> pairs_of(const SequenceLogps& logps, int64_t P) {
  std::vector<size_t> chosen, rejected;
  for (size_t s = 0; s < logps.logps.size(); ++s)
    if (logps.counted_tokens[s] > 0) (logps.rows[s] < P ? chosen : rejected).push_back(s);
  FT_CHECK(chosen.size() == rejected.size(), "objective: dpo: a micro-batch holds ", chosen.size(),
           " chosen and ", rejected.size(), " rejected completions");
  std::vector<std::pair<size_t, size_t>> pairs;
  for (size_t j = 0; j < chosen.size(); ++j) pairs.emplace_back(chosen[j], rejected[j]);
  return pairs;
}

}  // namespace

// The chosen rows' sequences -- rows, or packed examples split where
// position_ids restart -- that carry loss.
int64_t count_pairs(const Batch& batch) {
  const int64_t P = batch.targets.dim(0) / 2, T = batch.targets.dim(1);
  const int32_t* targets = batch.targets.ptr<int32_t>();
  const int32_t* positions = batch.position_ids.defined() ? batch.position_ids.ptr<int32_t>() : nullptr;
  int64_t pairs = 0;
  bool counted = false;  // the current sequence has a loss token
  for (int64_t n = 0; n < P * T; ++n) {
    if (n % T == 0 || (positions && positions[n] == 0)) counted = false;
    if (targets[n] != kIgnoreIndex && !counted) pairs++, counted = true;
  }
  return pairs;
}

DpoFigures dpo_micro_batch(CausalLM& model, const Batch& batch, const DpoConfig& config, bool train,
                           double pair_weight) {
  const int64_t P = batch.input_ids.dim(0) / 2;
  SequenceLogps reference;
  {
    AdaptersDisabled off(model);
    reference = model.sequence_logps(batch.input_ids, batch.targets, batch.positions());
  }
  DpoFigures figures;
  // The figures and the gradient from the policy's log-probabilities; called
  // once, by the policy's step, between its forward and its backward.
  auto score = [&](const SequenceLogps& policy) {
    std::vector<double> dlogps(policy.logps.size(), 0.0);
    for (const auto& [chosen, rejected] : pairs_of(policy, P)) {
      const PairLogps logps = pair_logps(policy, reference, chosen, rejected);
      const PairLoss loss = dpo_pair_loss(config, logps);
      const double reward_chosen = config.beta * (logps.policy_chosen - logps.reference_chosen);
      const double reward_rejected = config.beta * (logps.policy_rejected - logps.reference_rejected);
      figures.add({1, loss.loss, reward_chosen, reward_rejected, reward_chosen > reward_rejected ? 1.0 : 0.0,
                   logps.policy_chosen, logps.policy_rejected});
      dlogps[chosen] = pair_weight * loss.dchosen;
      dlogps[rejected] = pair_weight * loss.drejected;
    }
    return dlogps;
  };
  if (train) model.sequence_logps_backward(batch.input_ids, batch.targets, score, batch.positions());
  else score(model.sequence_logps(batch.input_ids, batch.targets, batch.positions()));
  return figures;
}

DpoFigures evaluate_dpo(CausalLM& model, const PreferenceLoader& eval, const DpoConfig& config, int64_t max_batches) {
  HostAllocator host;
  const int64_t batches = max_batches > 0 ? std::min(max_batches, eval.batches_per_epoch()) : eval.batches_per_epoch();
  DpoFigures figures;
  for (int64_t i = 0; i < batches; ++i)
    figures.add(dpo_micro_batch(model, trim_padding(eval.batch_in_order(i), host), config, false, 0.0));
  return figures;
}

}  // namespace ft
