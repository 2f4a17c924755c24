// Classic PPO as trl's PPOTrainer computes it (trl 0.11.4, the last version
// with it: trl/trainer/ppo_trainer.py's compute_rewards, compute_advantages,
// loss, record_step_stats and _early_stop; trl/core.py's masked_mean,
// masked_var, masked_whiten, clip_by_value, entropy_from_logits;
// trl/trainer/utils.py's AdaptiveKLController and FixedKLController). The
// course's lab 3 and the "20B on a 24 GB GPU" blog post use this trainer.
// Arrays are flat row-major [rows x response_tokens]; the mask marks the
// response tokens (trl's `masks`, 1) against padding (0).
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "trainer/enum_names.h"

namespace ft {

// PPOConfig.kl_penalty: the per-token KL estimate between policy and reference.
// kl: logp - ref; abs: |logp - ref|; mse: 0.5 (logp - ref)^2; full (the KL
// over the whole vocabulary) is refused: it needs the logits.
enum class KlPenalty { kl, abs, mse, full };
EnumNames<KlPenalty> enum_names(KlPenalty);

// PPOConfig's names and trl 0.11.4's defaults (the training-loop knobs:
// learning_rate, steps, max_grad_norm belong to the run; use_score_scaling and
// use_score_norm are not implemented).
struct PpoConfig {
  bool adap_kl_ctrl = true;       // adaptive KL coefficient, else fixed
  double init_kl_coef = 0.2;
  KlPenalty kl_penalty = KlPenalty::kl;
  double target = 6.0;            // the adaptive controller's target KL (nats per sequence)
  double horizon = 10000.0;       // the adaptive controller's horizon (samples)
  double gamma = 1.0;             // GAE discount
  double lam = 0.95;              // GAE lambda
  double cliprange = 0.2;         // policy ratio clip
  double cliprange_value = 0.2;   // value clip around the rollout's values
  double vf_coef = 0.1;
  int64_t batch_size = 128;       // rollouts per PPO step
  int64_t mini_batch_size = 128;
  int64_t gradient_accumulation_steps = 1;
  int64_t ppo_epochs = 4;
  bool early_stopping = false;    // stop the epochs when policykl > 1.5 * target_kl
  double target_kl = 1.0;
  double ratio_threshold = 10.0;  // a mini-batch whose mean ratio exceeds it contributes no loss
  std::optional<double> score_clip;  // clip scores to [-score_clip, score_clip]
  bool whiten_rewards = false;
  // trl's ValueHead's summary_dropout_prob (a from_pretrained kwarg of
  // AutoModelFor*WithValueHead, 0.1 unless the model config sets it):
  // dropout on the hidden states the value head reads in the PPO epochs'
  // training forwards; the rollout's values are read without it (trl's
  // batched_forward_pass runs in eval mode).
  double summary_dropout_prob = 0.1;
};

// Refuses what trl refuses (batch_size not a multiple of mini_batch_size *
// gradient_accumulation_steps) and what is not implemented (kl_penalty full).
void validate(const PpoConfig& config);

// The KL coefficient's controller (trl's AdaptiveKLController /
// FixedKLController). Adaptive, after each step:
//   value *= 1 + clip(current_kl / target - 1, -0.2, 0.2) * n_steps / horizon.
struct KlController {
  bool adaptive = true;
  double value = 0.2, target = 6.0, horizon = 10000.0;
  void update(double current_kl, int64_t n_steps);
  nlohmann::json to_json() const;               // its state, for resume (doubles round-trip exactly)
  static KlController from_json(const nlohmann::json& state);
};
KlController make_kl_controller(const PpoConfig& config);

// One PPO step's rollouts as scored and re-read before the epochs.
struct PpoRollout {
  int64_t rows = 0, response_tokens = 0;
  std::vector<double> scores;        // [rows] the reward model's scores, after clip_scores
  std::vector<double> logprobs;      // the policy's per-token log-probabilities at rollout
  std::vector<double> ref_logprobs;  // the reference's (adapters off)
  std::vector<double> values;        // the value head's
  std::vector<uint8_t> mask;         // every row needs at least one response token
};

// The scores after score_clip (trl's step() applies it before everything else).
std::vector<double> clip_scores(const PpoConfig& config, const std::vector<double>& scores);

// compute_rewards: per token kls = the kl_penalty estimate, non_score_reward
// = -kl_coef * kls, rewards = non_score_reward plus the row's score at its
// last response token.
struct PpoRewards {
  std::vector<double> rewards, non_score_reward, kls;  // [rows x response_tokens]
};
PpoRewards ppo_rewards(const PpoConfig& config, double kl_coef, const PpoRollout& rollout);

// compute_advantages: values and rewards masked, rewards whitened without
// shifting their mean if whiten_rewards, GAE over every position (gamma,
// lam), returns = advantages + values, advantages whitened over the batch's
// mask (masked_var with Bessel's correction, + 1e-8 under the rsqrt).
struct PpoAdvantages {
  std::vector<double> values, advantages, returns;  // values: the masked values the loss clips around
};
PpoAdvantages ppo_advantages(const PpoConfig& config, const PpoRollout& rollout, const std::vector<double>& rewards);

// One mini-batch's loss (trl's loss()): ratio = exp(logprobs - old_logprobs),
//   pg_loss = masked_mean(max(-A ratio, -A clip(ratio, 1 +- cliprange))),
//   vf_loss = 0.5 masked_mean(max((vpred - R)^2, (clip(vpred, V +- cliprange_value) - R)^2)),
//   loss = pg_loss + vf_coef * vf_loss,
// all three zero (and the gradients) when masked_mean(ratio) > ratio_threshold.
struct PpoMiniBatch {
  int64_t rows = 0, response_tokens = 0;
  std::vector<double> old_logprobs, values;  // from the rollout (values: PpoAdvantages::values)
  std::vector<double> logprobs, vpreds;      // the current forward's (differentiated)
  std::vector<double> advantages, returns;   // PpoAdvantages'
  std::vector<uint8_t> mask;
  std::vector<double> entropy;  // optional per-token entropy (entropy_from_logits); empty: not logged
};
struct PpoLoss {
  double pg_loss = 0, vf_loss = 0, loss = 0;
  bool skipped = false;                  // the mean ratio exceeded ratio_threshold
  std::vector<double> dlogprobs, dvpreds;  // d(loss)/d(logprobs[n]), d(loss)/d(vpreds[n]); 0 where masked
  // trl's names without the "ppo/" prefix: loss/policy, loss/value (vf_loss,
  // before vf_coef), loss/total, policy/entropy (when given), policy/approxkl,
  // policy/policykl, policy/clipfrac, policy/advantages_mean, returns/mean,
  // returns/var, val/vpred, val/error, val/clipfrac, val/mean, val/var.
  nlohmann::json stats;
};
PpoLoss ppo_loss(const PpoConfig& config, const PpoMiniBatch& batch);

// trl's entropy_from_logits for one position: logsumexp(l) - sum softmax(l) l.
double entropy_from_logits(const double* logits, int64_t vocab);

// _early_stop: with early_stopping, the epochs stop once a mini-batch's
// policykl exceeds 1.5 * target_kl.
bool ppo_early_stop(const PpoConfig& config, double policykl);

// record_step_stats: objective/kl (the mean over rows of the masked kls'
// sum), objective/kl_coef (the coefficient the rewards used),
// objective/entropy (the mean over rows of -sum of masked logprobs),
// ppo/mean_non_score_reward, ppo/mean_scores, ppo/std_scores (unbiased), each
// mini-batch stat averaged over the step's mini-batches under "ppo/", and
// ppo/val/var_explained = 1 - ppo/val/error / ppo/returns/var.
nlohmann::json ppo_step_stats(double kl_coef, const PpoRollout& rollout, const PpoRewards& rewards,
                              const std::vector<nlohmann::json>& mini_batch_stats);

}  // namespace ft
