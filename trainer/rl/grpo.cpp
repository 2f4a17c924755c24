#include "trainer/rl/grpo.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/error.h"

namespace ft {

EnumNames<GrpoLossType> enum_names(GrpoLossType) {
  static constexpr EnumName<GrpoLossType> names[] = {{"grpo", GrpoLossType::grpo},
                                                     {"bnpo", GrpoLossType::bnpo},
                                                     {"dr_grpo", GrpoLossType::dr_grpo},
                                                     {"dapo", GrpoLossType::dapo},
                                                     {"cispo", GrpoLossType::cispo}};
  return names;
}

EnumNames<GrpoScaleRewards> enum_names(GrpoScaleRewards) {
  static constexpr EnumName<GrpoScaleRewards> names[] = {
      {"group", GrpoScaleRewards::group}, {"batch", GrpoScaleRewards::batch}, {"none", GrpoScaleRewards::none}};
  return names;
}

void validate(const GrpoConfig& config) {
  // trl's GRPOConfig.__post_init__: a group of one has no baseline to compare with.
  FT_CHECK(config.num_generations >= 2, "grpo.num_generations: expected at least 2 completions per prompt, got ",
           config.num_generations);
  FT_CHECK(config.num_iterations >= 1, "grpo.num_iterations: expected at least 1, got ", config.num_iterations);
  FT_CHECK(config.epsilon >= 0 && config.epsilon_high.value_or(0) >= 0, "grpo.epsilon: expected >= 0");
  FT_CHECK(config.beta >= 0, "grpo.beta: expected >= 0, got ", config.beta);
  FT_CHECK(config.max_completion_length >= 1, "grpo.max_completion_length: expected >= 1, got ",
           config.max_completion_length);
}

double mean_of(const std::vector<double>& values) {
  double sum = 0.0;
  for (double v : values) sum += v;
  return values.empty() ? 0.0 : sum / double(values.size());
}

double unbiased_std(const std::vector<double>& values, size_t begin, size_t end) {
  const double n = double(end - begin);
  double mean = 0, squares = 0;
  for (size_t i = begin; i < end; ++i) mean += values[i] / n;
  for (size_t i = begin; i < end; ++i) squares += (values[i] - mean) * (values[i] - mean);
  return std::sqrt(squares / n * (n / (n - 1)));  // trl's nanstd: the mean square times n / (n - 1)
}

std::vector<double> grpo_advantages(const std::vector<double>& rewards, int64_t group_size,
                                    GrpoScaleRewards scale_rewards) {
  FT_CHECK(group_size >= 2, "grpo: a group of ", group_size,
           " completion(s) per prompt has no baseline; num_generations must be at least 2");
  FT_CHECK(!rewards.empty() && rewards.size() % size_t(group_size) == 0, "grpo: ", rewards.size(),
           " rewards are not whole groups of num_generations = ", group_size);
  const size_t G = size_t(group_size);
  const double batch_std = rewards.size() > 1 ? unbiased_std(rewards, 0, rewards.size()) : 0.0;
  std::vector<double> advantages(rewards.size());
  for (size_t begin = 0; begin < rewards.size(); begin += G) {
    double mean = 0;
    for (size_t i = begin; i < begin + G; ++i) mean += rewards[i] / double(G);
    const double std = scale_rewards == GrpoScaleRewards::batch ? batch_std : unbiased_std(rewards, begin, begin + G);
    for (size_t i = begin; i < begin + G; ++i)
      advantages[i] = scale_rewards == GrpoScaleRewards::none ? rewards[i] - mean : (rewards[i] - mean) / (std + 1e-4);
  }
  return advantages;
}

static void check_shapes(const GrpoConfig& config, const GrpoTokens& tokens) {
  const size_t n = size_t(tokens.rows * tokens.completion_tokens);
  FT_CHECK(tokens.rows > 0 && tokens.completion_tokens > 0, "grpo loss: empty batch (", tokens.rows, " rows x ",
           tokens.completion_tokens, " tokens)");
  FT_CHECK(tokens.logps.size() == n, "grpo loss: logps holds ", tokens.logps.size(),
           " values, expected rows x tokens = ", n);
  FT_CHECK(tokens.old_logps.empty() || tokens.old_logps.size() == n, "grpo loss: old_logps holds ",
           tokens.old_logps.size(), " values, expected ", n);
  FT_CHECK(config.beta == 0 || tokens.ref_logps.size() == n, "grpo loss: ref_logps holds ", tokens.ref_logps.size(),
           " values, expected ", n, " (beta is ", config.beta, ")");
  FT_CHECK(tokens.mask.size() == n, "grpo loss: mask holds ", tokens.mask.size(), " values, expected ", n);
  FT_CHECK(tokens.advantages.size() == size_t(tokens.rows), "grpo loss: ", tokens.advantages.size(),
           " advantages for ", tokens.rows, " rows");
}

// One token's loss and its derivative in logp (trl's per_token_loss before
// masking), and whether its ratio is clipped low / high.
struct TokenLoss {
  double loss = 0, dlogp = 0, kl = 0;
  bool low = false, high = false;
};

// d min(a, b): torch's minimum splits the gradient in half on a tie.
static double share_of_min(double a, double b) { return a < b ? 1.0 : a == b ? 0.5 : 0.0; }

static TokenLoss token_loss(const GrpoConfig& config, double logp, double old_logp, double ref_logp, double A) {
  const double eps_low = config.epsilon, eps_high = config.epsilon_high.value_or(config.epsilon);
  const double r = std::exp(logp - old_logp);  // dr/dlogp = r
  TokenLoss out;
  if (config.loss_type == GrpoLossType::cispo) {
    const double clamped = std::min(r, eps_high);  // detached: only logp is differentiated
    out.loss = -clamped * A * logp;
    out.dlogp = -clamped * A;
    out.high = r > eps_high && A > 0;  // trl's cispo_clip_ratio
  } else {
    const double coef2 = std::clamp(r, 1 - eps_low, 1 + eps_high);
    const double dcoef2 = r >= 1 - eps_low && r <= 1 + eps_high ? 1.0 : 0.0;  // torch.clamp passes the bounds
    const double coef1 = config.delta ? std::min(r, *config.delta) : r;
    const double dcoef1 = config.delta && r > *config.delta ? 0.0 : 1.0;
    const double loss1 = coef1 * A, loss2 = coef2 * A;
    out.loss = -std::min(loss1, loss2);
    out.dlogp = -(share_of_min(loss1, loss2) * dcoef1 + share_of_min(loss2, loss1) * dcoef2) * A * r;
    out.low = r < 1 - eps_low && A < 0;
    out.high = r > 1 + eps_high && A > 0;
  }
  if (config.beta != 0) {
    const double d = ref_logp - logp;
    double kl = std::exp(d) - d - 1, dkl = 1 - std::exp(d);
    if (config.use_bias_correction_kl) {
      dkl = dkl * r + kl * r;
      kl *= r;
    }
    out.kl = kl;
    out.loss += config.beta * kl;
    out.dlogp += config.beta * dkl;
  }
  return out;
}

// The weight of each active token's loss in the aggregated loss, by loss_type.
static std::vector<double> row_weights(const GrpoConfig& config, const GrpoTokens& tokens, double active_tokens) {
  const int64_t T = tokens.completion_tokens;
  std::vector<double> weights(size_t(tokens.rows));
  for (int64_t b = 0; b < tokens.rows; ++b) {
    double row_tokens = 0;
    for (int64_t t = 0; t < T; ++t) row_tokens += tokens.mask[size_t(b * T + t)];
    switch (config.loss_type) {
      case GrpoLossType::grpo: weights[size_t(b)] = 1.0 / (std::max(row_tokens, 1.0) * double(tokens.rows)); break;
      case GrpoLossType::bnpo: weights[size_t(b)] = 1.0 / std::max(active_tokens, 1.0); break;
      case GrpoLossType::dr_grpo:
        weights[size_t(b)] = 1.0 / (double(tokens.rows) * double(config.max_completion_length));
        break;
      case GrpoLossType::dapo:
      case GrpoLossType::cispo:
        const double items = tokens.num_items_in_batch > 0 ? tokens.num_items_in_batch : active_tokens;
        weights[size_t(b)] = 1.0 / std::max(items, 1.0);
        break;
    }
  }
  return weights;
}

GrpoLoss grpo_loss(const GrpoConfig& config, const GrpoTokens& tokens) {
  validate(config);
  check_shapes(config, tokens);
  const int64_t T = tokens.completion_tokens;
  double active_tokens = 0;
  for (uint8_t m : tokens.mask) active_tokens += m;
  const std::vector<double> weights = row_weights(config, tokens, active_tokens);
  GrpoLoss out;
  out.dlogps.assign(tokens.logps.size(), 0.0);
  double kl = 0, low = 0, high = 0, region = 0;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  double low_min = nan, high_max = nan;  // trl's nanmin / nanmax over rows' own clip fractions
  for (int64_t b = 0; b < tokens.rows; ++b) {
    double row_low = 0, row_high = 0, row_tokens = 0;
    for (int64_t t = 0; t < T; ++t) {
      const size_t n = size_t(b * T + t);
      if (!tokens.mask[n]) continue;
      const double old = tokens.old_logps.empty() ? tokens.logps[n] : tokens.old_logps[n];
      const double ref = config.beta != 0 ? tokens.ref_logps[n] : 0.0;
      const TokenLoss token = token_loss(config, tokens.logps[n], old, ref, tokens.advantages[size_t(b)]);
      out.loss += weights[size_t(b)] * token.loss;
      out.dlogps[n] = weights[size_t(b)] * token.dlogp;
      kl += token.kl;
      row_low += token.low;
      row_high += token.high;
      region += token.low || token.high;
      row_tokens += 1;
    }
    low += row_low;
    high += row_high;
    if (row_tokens > 0) {
      low_min = std::isnan(low_min) ? row_low / row_tokens : std::min(low_min, row_low / row_tokens);
      high_max = std::isnan(high_max) ? row_high / row_tokens : std::max(high_max, row_high / row_tokens);
    }
  }
  const double count = std::max(active_tokens, 1.0);  // trl's global_masked_mean
  if (config.beta != 0) out.metrics["kl"] = kl / count;
  if (config.loss_type == GrpoLossType::cispo) {
    out.metrics["cispo_clip_ratio"] = high / count;
  } else {
    out.metrics["clip_ratio/low_mean"] = low / count;
    out.metrics["clip_ratio/high_mean"] = high / count;
    out.metrics["clip_ratio/region_mean"] = region / count;
    out.metrics["clip_ratio/low_min"] = low_min;
    out.metrics["clip_ratio/high_max"] = high_max;
  }
  return out;
}

}  // namespace ft
