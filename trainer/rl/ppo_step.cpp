#include "trainer/rl/ppo_step.h"

#include <algorithm>

#include "kernels/dropout_hash.h"
#include "kernels/error.h"
#include "model/output_head.h"

namespace ft {
namespace {

constexpr uint64_t kValueHeadStream = 0x76686561ULL;  // "vhea"

// The rollouts' log-probabilities, values and reference log-probabilities
// ([rows x width]), forward_rows rows a forward, nothing kept for a backward.
void score_rollouts(const PpoStep& s, const std::vector<Rollout>& rollouts, PpoRollout& out) {
  LanguageModel& model = s.sampler.model;
  const int64_t width = out.response_tokens;
  out.logprobs.assign(size_t(out.rows * width), 0.0);
  out.values = out.ref_logprobs = out.logprobs;
  HostAllocator host;
  for (size_t first = 0; first < rollouts.size(); first += size_t(s.forward_rows)) {
    const size_t end = std::min(rollouts.size(), first + size_t(s.forward_rows));
    const CompletionBatch batch = completion_batch(model, rollouts, first, end, s.pad_id, host);
    std::vector<float> values;
    const HiddenHead value_head = [&](const Tensor& hidden, Tensor*) {
      values = head_outputs(model.backend(), model.output_head(), hidden);
    };
    gather_completion_tokens(batch, policy_token_logps(model, batch, &value_head), width, int64_t(first),
                             out.logprobs);
    gather_completion_tokens(batch, values, width, int64_t(first), out.values);
    gather_completion_tokens(batch, reference_logps(model, batch), width, int64_t(first), out.ref_logprobs);
  }
}

// Rows `rows` of a [rows x width] array, in that order.
template <class T>
std::vector<T> pick_rows(const std::vector<T>& values, const std::vector<int64_t>& rows, int64_t width) {
  std::vector<T> out;
  for (int64_t r : rows) out.insert(out.end(), values.begin() + r * width, values.begin() + (r + 1) * width);
  return out;
}

// One mini-batch's forward and backward: ppo_loss's policy gradient through
// the LM head's log-probabilities, its value gradient through the value head
// (reading dropout(hidden) with ppo.summary_dropout_prob, mask from dropout_seed).
nlohmann::json train_mini_batch(const PpoStep& s, const std::vector<Rollout>& rollouts, const PpoRollout& rollout,
                                const PpoAdvantages& advantages, const std::vector<int64_t>& rows,
                                uint64_t dropout_seed) {
  LanguageModel& model = s.sampler.model;
  const int64_t width = rollout.response_tokens, R = int64_t(rows.size());
  std::vector<Rollout> picked;
  for (int64_t r : rows) picked.push_back(rollouts[size_t(r)]);
  HostAllocator host;
  const CompletionBatch batch = completion_batch(model, picked, 0, picked.size(), s.pad_id, host);
  PpoMiniBatch mini{R, width, pick_rows(rollout.logprobs, rows, width), pick_rows(advantages.values, rows, width),
                    std::vector<double>(size_t(R * width), 0.0), pick_rows(advantages.values, rows, width),
                    pick_rows(advantages.advantages, rows, width), pick_rows(advantages.returns, rows, width),
                    pick_rows(rollout.mask, rows, width), {}};
  PpoLoss loss;
  const HeadDropout dropout{float(s.config.summary_dropout_prob), dropout_seed};
  // The LM head's gradient comes first, before the value head has run: the
  // policy part of ppo_loss needs no values (vpreds stand at the rollout's
  // values for now); the value head then computes the whole loss again with
  // its vpreds, for the value gradient and the stats.
  const TokenLogpsGradient policy_gradient = [&](const std::vector<float>& token_logps) {
    gather_completion_tokens(batch, token_logps, width, 0, mini.logprobs);
    return scatter_completion_tokens(batch, ppo_loss(s.config, mini).dlogprobs, width, 0, 1.0);
  };
  const HiddenHead value_head = [&](const Tensor& hidden, Tensor* dhidden) {
    std::vector<double> vpreds(size_t(R * width), 0.0);
    gather_completion_tokens(batch, head_outputs(model.backend(), model.output_head(), hidden, dropout), width, 0,
                             vpreds);
    mini.vpreds = vpreds;
    loss = ppo_loss(s.config, mini);
    const std::vector<float> dvalues = scatter_completion_tokens(batch, loss.dvpreds, width, 0, 1.0);
    head_backward(model.backend(), model.output_head(), hidden, dvalues, *dhidden, dropout);
  };
  policy_token_logps_backward(model, batch, policy_gradient, &value_head);
  return loss.stats;
}

}  // namespace

nlohmann::json ppo_step(const PpoStep& s, KlController& kl, const std::vector<const PromptRow*>& prompts,
                        int64_t step) {
  const PpoConfig& config = s.config;
  FT_CHECK(int64_t(prompts.size()) == config.batch_size, "ppo_step: ", prompts.size(), " prompts for ppo.batch_size ",
           config.batch_size);
  const std::vector<Rollout> rollouts = generate_completions(s.sampler, prompts, 1, step);
  PpoRollout rollout;
  rollout.rows = int64_t(rollouts.size());
  for (const Rollout& r : rollouts) rollout.response_tokens = std::max<int64_t>(rollout.response_tokens, int64_t(r.tokens.size()));
  rollout.mask = completion_mask(rollouts, 0, rollout.rows, rollout.response_tokens);
  const Rewards rewards = compute_rewards(s.rules, rollouts, s.reward_model);
  rollout.scores = clip_scores(config, rewards.total);
  score_rollouts(s, rollouts, rollout);
  const double kl_coef = kl.value;
  const PpoRewards per_token = ppo_rewards(config, kl_coef, rollout);
  const PpoAdvantages advantages = ppo_advantages(config, rollout, per_token.rewards);

  std::vector<nlohmann::json> mini_batch_stats;
  double grad_norm = 0.0;
  int64_t updates = 0, mini_batch = 0;
  bool early_stop = false;
  const int64_t backward_rows = config.mini_batch_size * config.gradient_accumulation_steps;
  for (int64_t epoch = 0; epoch < config.ppo_epochs && !early_stop; ++epoch) {
    const std::vector<int64_t> order =
        shuffled_order(rollout.rows, splitmix64(s.sampler.seed, 0x70706f00ULL + uint64_t(step)), epoch);
    for (int64_t first = 0; first < rollout.rows && !early_stop; first += backward_rows) {
      for (int64_t m = first; m < first + backward_rows && !early_stop; m += config.mini_batch_size) {
        const std::vector<int64_t> rows(order.begin() + m, order.begin() + m + config.mini_batch_size);
        const uint64_t dropout_seed = splitmix64(s.sampler.seed, (uint64_t(step) << 20) + uint64_t(mini_batch++));
        s.sampler.model.set_dropout_seed(dropout_seed);
        // The value head's mask: a stream of its own beside the LoRA layers'.
        mini_batch_stats.push_back(
            train_mini_batch(s, rollouts, rollout, advantages, rows, splitmix64(dropout_seed, kValueHeadStream)));
        early_stop = ppo_early_stop(config, mini_batch_stats.back()["policy/policykl"].get<double>());
      }
      grad_norm = s.update();
      ++updates;
    }
  }
  nlohmann::json stats = ppo_step_stats(kl_coef, rollout, per_token, mini_batch_stats);
  const nlohmann::json reward_figures = rewards.metrics();  // kept: items() views it
  for (const auto& item : reward_figures.items()) stats["env/" + item.key()] = item.value();
  double response_tokens = 0.0;
  for (const Rollout& r : rollouts) response_tokens += double(r.tokens.size());
  stats["tokens/responses_len_mean"] = response_tokens / double(rollouts.size());  // trl's name
  stats["ppo/grad_norm"] = grad_norm;
  stats["ppo/updates"] = updates;
  stats["ppo/early_stop"] = early_stop ? 1.0 : 0.0;
  kl.update(stats["objective/kl"].get<double>(), config.batch_size);
  return stats;
}

}  // namespace ft
