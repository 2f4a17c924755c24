#include "trainer/rl/ppo.h"

#include <algorithm>
#include <cmath>

#include "kernels/error.h"

namespace ft {

EnumNames<KlPenalty> enum_names(KlPenalty) {
  static constexpr EnumName<KlPenalty> names[] = {
      {"kl", KlPenalty::kl}, {"abs", KlPenalty::abs}, {"mse", KlPenalty::mse}, {"full", KlPenalty::full}};
  return names;
}

void validate(const PpoConfig& config) {
  FT_CHECK(config.kl_penalty != KlPenalty::full,
           "ppo.kl_penalty: full (the KL over the whole vocabulary) is not supported; expected kl, abs or mse");
  FT_CHECK(config.mini_batch_size >= 1 && config.gradient_accumulation_steps >= 1 && config.batch_size >= 1,
           "ppo: batch_size, mini_batch_size and gradient_accumulation_steps must be at least 1");
  FT_CHECK(config.batch_size % (config.mini_batch_size * config.gradient_accumulation_steps) == 0,
           "ppo.batch_size: ", config.batch_size,
           " is not a multiple of mini_batch_size * gradient_accumulation_steps = ",
           config.mini_batch_size * config.gradient_accumulation_steps);
  FT_CHECK(config.ppo_epochs >= 1, "ppo.ppo_epochs: expected at least 1, got ", config.ppo_epochs);
}

void KlController::update(double current_kl, int64_t n_steps) {
  if (!adaptive) return;
  const double proportional_error = std::clamp(current_kl / target - 1.0, -0.2, 0.2);
  value *= 1.0 + proportional_error * double(n_steps) / horizon;
}

nlohmann::json KlController::to_json() const {
  return {{"adaptive", adaptive}, {"value", value}, {"target", target}, {"horizon", horizon}};
}

KlController KlController::from_json(const nlohmann::json& state) {
  FT_CHECK(state.is_object() && state.contains("adaptive") && state.contains("value") && state.contains("target") &&
               state.contains("horizon"),
           "ppo KL controller state: expected {adaptive, value, target, horizon}, got ", state.dump());
  return {state["adaptive"].get<bool>(), state["value"].get<double>(), state["target"].get<double>(),
          state["horizon"].get<double>()};
}

KlController make_kl_controller(const PpoConfig& config) {
  return {config.adap_kl_ctrl, config.init_kl_coef, config.target, config.horizon};
}

std::vector<double> clip_scores(const PpoConfig& config, const std::vector<double>& scores) {
  std::vector<double> clipped = scores;
  if (config.score_clip)
    for (double& s : clipped) s = std::clamp(s, -*config.score_clip, *config.score_clip);
  return clipped;
}

static void check_rollout(const PpoRollout& rollout) {
  const size_t n = size_t(rollout.rows * rollout.response_tokens);
  FT_CHECK(rollout.rows > 0 && rollout.response_tokens > 0, "ppo: empty rollout batch");
  FT_CHECK(rollout.scores.size() == size_t(rollout.rows), "ppo: ", rollout.scores.size(), " scores for ",
           rollout.rows, " rollouts");
  FT_CHECK(rollout.logprobs.size() == n && rollout.ref_logprobs.size() == n && rollout.values.size() == n &&
               rollout.mask.size() == n,
           "ppo: logprobs, ref_logprobs, values and mask must each hold rows x response_tokens = ", n,
           " values; got ", rollout.logprobs.size(), ", ", rollout.ref_logprobs.size(), ", ", rollout.values.size(),
           ", ", rollout.mask.size());
}

// trl's masked_mean: sum(x * m) / sum(m) over the whole batch.
static double masked_mean(const std::vector<double>& x, const std::vector<uint8_t>& mask) {
  double sum = 0, count = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sum += x[i] * mask[i];
    count += mask[i];
  }
  return sum / count;
}

// trl's masked_var with unbiased=True: the masked mean square times n / (n - 1).
static double masked_var(const std::vector<double>& x, const std::vector<uint8_t>& mask) {
  const double mean = masked_mean(x, mask);
  double squares = 0, count = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    squares += (x[i] - mean) * (x[i] - mean) * mask[i];
    count += mask[i];
  }
  FT_CHECK(count > 0, "ppo: the mask holds no response token (increase mini_batch_size)");
  return squares / count * (count / (count - 1));
}

// trl's masked_whiten: (x - mean) / sqrt(var + 1e-8), the mean added back without shift_mean.
static std::vector<double> masked_whiten(const std::vector<double>& x, const std::vector<uint8_t>& mask,
                                         bool shift_mean) {
  const double mean = masked_mean(x, mask), scale = 1.0 / std::sqrt(masked_var(x, mask) + 1e-8);
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = (x[i] - mean) * scale + (shift_mean ? 0.0 : mean);
  return out;
}

static double kl_estimate(KlPenalty penalty, double logprob, double ref_logprob) {
  const double d = logprob - ref_logprob;
  if (penalty == KlPenalty::abs) return std::abs(d);
  if (penalty == KlPenalty::mse) return 0.5 * d * d;
  return d;
}

PpoRewards ppo_rewards(const PpoConfig& config, double kl_coef, const PpoRollout& rollout) {
  validate(config);
  check_rollout(rollout);
  const int64_t T = rollout.response_tokens;
  PpoRewards out;
  out.rewards.resize(rollout.logprobs.size());
  out.non_score_reward.resize(rollout.logprobs.size());
  out.kls.resize(rollout.logprobs.size());
  for (int64_t b = 0; b < rollout.rows; ++b) {
    int64_t last = -1;
    for (int64_t t = 0; t < T; ++t) {
      const size_t n = size_t(b * T + t);
      out.kls[n] = kl_estimate(config.kl_penalty, rollout.logprobs[n], rollout.ref_logprobs[n]);
      out.non_score_reward[n] = -kl_coef * out.kls[n];
      out.rewards[n] = out.non_score_reward[n];
      if (rollout.mask[n]) last = t;
    }
    FT_CHECK(last >= 0, "ppo: rollout ", b, " has no response token to receive its score");
    out.rewards[size_t(b * T + last)] += rollout.scores[size_t(b)];
  }
  return out;
}

PpoAdvantages ppo_advantages(const PpoConfig& config, const PpoRollout& rollout, const std::vector<double>& rewards) {
  check_rollout(rollout);
  FT_CHECK(rewards.size() == rollout.logprobs.size(), "ppo: ", rewards.size(), " rewards for ",
           rollout.logprobs.size(), " tokens");
  const int64_t T = rollout.response_tokens;
  PpoAdvantages out;
  out.values.resize(rewards.size());
  std::vector<double> masked_rewards(rewards.size());
  for (size_t n = 0; n < rewards.size(); ++n) {
    out.values[n] = rollout.values[n] * rollout.mask[n];
    masked_rewards[n] = rewards[n] * rollout.mask[n];
  }
  if (config.whiten_rewards) masked_rewards = masked_whiten(masked_rewards, rollout.mask, false);
  std::vector<double> advantages(rewards.size());
  out.returns.resize(rewards.size());
  for (int64_t b = 0; b < rollout.rows; ++b) {
    double lastgaelam = 0;
    for (int64_t t = T - 1; t >= 0; --t) {
      const size_t n = size_t(b * T + t);
      const double next_value = t < T - 1 ? out.values[n + 1] : 0.0;
      const double delta = masked_rewards[n] + config.gamma * next_value - out.values[n];
      lastgaelam = delta + config.gamma * config.lam * lastgaelam;
      advantages[n] = lastgaelam;
      out.returns[n] = lastgaelam + out.values[n];
    }
  }
  out.advantages = masked_whiten(advantages, rollout.mask, true);
  return out;
}

static void check_mini_batch(const PpoMiniBatch& batch) {
  const size_t n = size_t(batch.rows * batch.response_tokens);
  FT_CHECK(n > 0, "ppo loss: empty mini-batch");
  for (const std::vector<double>* v : {&batch.old_logprobs, &batch.values, &batch.logprobs, &batch.vpreds,
                                       &batch.advantages, &batch.returns})
    FT_CHECK(v->size() == n, "ppo loss: a per-token input holds ", v->size(), " values, expected rows x tokens = ", n);
  FT_CHECK(batch.mask.size() == n, "ppo loss: mask holds ", batch.mask.size(), " values, expected ", n);
  FT_CHECK(batch.entropy.empty() || batch.entropy.size() == n, "ppo loss: entropy holds ", batch.entropy.size(),
           " values, expected ", n);
}

// torch's maximum / minimum split the gradient in half on a tie.
static double share_of_max(double a, double b) { return a > b ? 1.0 : a == b ? 0.5 : 0.0; }
static double share_of_min(double a, double b) { return a < b ? 1.0 : a == b ? 0.5 : 0.0; }

// trl's clip_by_value = max(min(x, hi), lo) and its derivative in x.
static std::pair<double, double> clip_by_value(double x, double lo, double hi) {
  const double upper = std::min(x, hi);
  return {std::max(upper, lo), share_of_min(x, hi) * share_of_max(upper, lo)};
}

PpoLoss ppo_loss(const PpoConfig& config, const PpoMiniBatch& batch) {
  check_mini_batch(batch);
  const size_t N = batch.logprobs.size();
  double count = 0;
  for (uint8_t m : batch.mask) count += m;
  FT_CHECK(count > 0, "ppo loss: the mini-batch's mask holds no response token");
  std::vector<double> ratio(N), squared_error(N), log_ratio_sq(N), policykl(N), pg(N), vf(N), pg_clipped(N),
      vf_clipped(N);
  PpoLoss out;
  out.dlogprobs.assign(N, 0.0);
  out.dvpreds.assign(N, 0.0);
  for (size_t n = 0; n < N; ++n) {
    const double A = batch.advantages[n], R = batch.returns[n], vpred = batch.vpreds[n];
    const auto [vclipped, dvclipped] =
        clip_by_value(vpred, batch.values[n] - config.cliprange_value, batch.values[n] + config.cliprange_value);
    const double vf1 = (vpred - R) * (vpred - R), vf2 = (vclipped - R) * (vclipped - R);
    vf[n] = std::max(vf1, vf2);
    vf_clipped[n] = vf2 > vf1;
    squared_error[n] = vf1;
    const double log_ratio = batch.logprobs[n] - batch.old_logprobs[n];
    ratio[n] = std::exp(log_ratio);
    const double r_clipped = std::clamp(ratio[n], 1.0 - config.cliprange, 1.0 + config.cliprange);
    const double dr_clipped = ratio[n] >= 1.0 - config.cliprange && ratio[n] <= 1.0 + config.cliprange ? 1.0 : 0.0;
    const double pg1 = -A * ratio[n], pg2 = -A * r_clipped;
    pg[n] = std::max(pg1, pg2);
    pg_clipped[n] = pg2 > pg1;
    log_ratio_sq[n] = log_ratio * log_ratio;
    policykl[n] = -log_ratio;
    if (!batch.mask[n]) continue;
    // d masked_mean(x)/dx[n] = 1 / count; dratio/dlogprob = ratio.
    out.dlogprobs[n] = -A * ratio[n] * (share_of_max(pg1, pg2) + share_of_max(pg2, pg1) * dr_clipped) / count;
    const double dvf =
        share_of_max(vf1, vf2) * 2 * (vpred - R) + share_of_max(vf2, vf1) * 2 * (vclipped - R) * dvclipped;
    out.dvpreds[n] = config.vf_coef * 0.5 / count * dvf;
  }
  out.pg_loss = masked_mean(pg, batch.mask);
  out.vf_loss = 0.5 * masked_mean(vf, batch.mask);
  out.loss = out.pg_loss + config.vf_coef * out.vf_loss;
  if (masked_mean(ratio, batch.mask) > config.ratio_threshold) {
    // trl multiplies the losses by 0: the mini-batch moves nothing.
    out.skipped = true;
    out.pg_loss = out.vf_loss = out.loss = 0;
    std::fill(out.dlogprobs.begin(), out.dlogprobs.end(), 0.0);
    std::fill(out.dvpreds.begin(), out.dvpreds.end(), 0.0);
  }
  out.stats = {{"loss/policy", out.pg_loss},
               {"loss/value", out.vf_loss},
               {"loss/total", out.loss},
               {"policy/approxkl", 0.5 * masked_mean(log_ratio_sq, batch.mask)},
               {"policy/policykl", masked_mean(policykl, batch.mask)},
               {"policy/clipfrac", masked_mean(pg_clipped, batch.mask)},
               {"policy/advantages_mean", masked_mean(batch.advantages, batch.mask)},
               {"returns/mean", masked_mean(batch.returns, batch.mask)},
               {"returns/var", masked_var(batch.returns, batch.mask)},
               {"val/vpred", masked_mean(batch.vpreds, batch.mask)},
               {"val/error", masked_mean(squared_error, batch.mask)},
               {"val/clipfrac", masked_mean(vf_clipped, batch.mask)},
               {"val/mean", masked_mean(batch.values, batch.mask)},
               {"val/var", masked_var(batch.values, batch.mask)}};
  if (!batch.entropy.empty()) out.stats["policy/entropy"] = masked_mean(batch.entropy, batch.mask);
  return out;
}

double entropy_from_logits(const double* logits, int64_t vocab) {
  const double top = *std::max_element(logits, logits + vocab);
  double z = 0, weighted = 0;
  for (int64_t v = 0; v < vocab; ++v) {
    const double e = std::exp(logits[v] - top);
    z += e;
    weighted += e * logits[v];
  }
  return top + std::log(z) - weighted / z;
}

bool ppo_early_stop(const PpoConfig& config, double policykl) {
  return config.early_stopping && policykl > 1.5 * config.target_kl;
}

nlohmann::json ppo_step_stats(double kl_coef, const PpoRollout& rollout, const PpoRewards& rewards,
                              const std::vector<nlohmann::json>& mini_batch_stats) {
  check_rollout(rollout);
  FT_CHECK(!mini_batch_stats.empty(), "ppo step stats: no mini-batch stats");
  const int64_t T = rollout.response_tokens;
  double kl = 0, entropy = 0, score_mean = 0;
  for (int64_t b = 0; b < rollout.rows; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const size_t n = size_t(b * T + t);
      kl += rewards.kls[n] * rollout.mask[n] / double(rollout.rows);
      entropy += -rollout.logprobs[n] * rollout.mask[n] / double(rollout.rows);
    }
    score_mean += rollout.scores[size_t(b)] / double(rollout.rows);
  }
  double score_squares = 0;
  for (double s : rollout.scores) score_squares += (s - score_mean) * (s - score_mean);
  nlohmann::json stats = {{"objective/kl", kl},
                          {"objective/kl_coef", kl_coef},
                          {"objective/entropy", entropy},
                          {"ppo/mean_non_score_reward", masked_mean(rewards.non_score_reward, rollout.mask)},
                          {"ppo/mean_scores", score_mean},
                          {"ppo/std_scores", std::sqrt(score_squares / double(rollout.rows - 1))}};
  for (const auto& [name, first] : mini_batch_stats.front().items()) {
    double sum = 0;
    for (const nlohmann::json& mini : mini_batch_stats) sum += mini.at(name).get<double>();
    stats["ppo/" + name] = sum / double(mini_batch_stats.size());
  }
  stats["ppo/val/var_explained"] = 1.0 - stats["ppo/val/error"].get<double>() / stats["ppo/returns/var"].get<double>();
  return stats;
}

}  // namespace ft
