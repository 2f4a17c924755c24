// GRPO's advantages and loss as trl's GRPOTrainer computes them (trl 1.16.0:
// _generate_and_score_completions for the advantages, _compute_loss for the
// loss), with importance_sampling_level "token" (trl's default; "sequence",
// GSPO, is not implemented), one reward function (or several already summed
// with their weights: multi_objective_aggregation "sum_then_normalize", the
// default), no vLLM importance-sampling correction, no off-policy mask, no
// entropy mask or bonus (top_entropy_quantile 1, entropy_coef 0: the
// defaults). Per token, with r = exp(logp - old_logp) and A the row's advantage:
//   loss_t = -min(r' A, clip(r, 1 - epsilon, 1 + epsilon_high) A) + beta * kl_t,
//   r' = min(r, delta) when delta is set (two-sided GRPO), else r,
//   kl_t = exp(ref - logp) - (ref - logp) - 1 (k3), times r when
//   use_bias_correction_kl (trl's default; r's gradient is kept);
// cispo instead: loss_t = -min(r, epsilon_high) A logp with the clipped
// ratio held constant. Aggregation by loss_type over the completion mask:
//   grpo:    mean over rows of (sum_t loss_t / the row's tokens),
//   bnpo:    sum / the batch's tokens,
//   dr_grpo: sum / (rows * max_completion_length),
//   dapo, cispo: sum / num_items_in_batch (trl: the generation batch's
//            active tokens over processes, times gradient_accumulation_steps /
//            steps_per_generation; 0 here: this batch's tokens).
// trl divides the grpo, bnpo and dr_grpo losses (not dapo's or cispo's) by
// the gradient accumulation steps in training; grpo_loss returns them
// undivided, as trl logs them, and the caller scales.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "trainer/enum_names.h"

namespace ft {

// trl 1.16.0's GRPOConfig.loss_type values this implements (sapo, luspo and
// vespo are not implemented).
enum class GrpoLossType { grpo, bnpo, dr_grpo, dapo, cispo };
// GRPOConfig.scale_rewards: divide the advantages by the group's reward std,
// the batch's, or not at all.
enum class GrpoScaleRewards { group, batch, none };
EnumNames<GrpoLossType> enum_names(GrpoLossType);
EnumNames<GrpoScaleRewards> enum_names(GrpoScaleRewards);

// GRPOConfig's names and trl 1.16.0's defaults.
struct GrpoConfig {
  int64_t num_generations = 8;                       // completions per prompt: the group size
  int64_t num_iterations = 1;                        // optimisation passes per generation batch (mu); above 1
                                                     // the loss needs old_logps
  double beta = 0.0;                                 // KL coefficient; 0: no reference forward
  double epsilon = 0.2;                              // lower clip: ratio >= 1 - epsilon
  std::optional<double> epsilon_high;                // upper clip 1 + epsilon_high; unset: epsilon
  std::optional<double> delta;                       // two-sided clipping's ratio cap; unset: none
  GrpoLossType loss_type = GrpoLossType::dapo;
  GrpoScaleRewards scale_rewards = GrpoScaleRewards::group;
  int64_t max_completion_length = 512;               // tokens; dr_grpo's constant
  bool use_bias_correction_kl = true;                // KL term times the ratio
};

// Refuses a config trl refuses: num_generations below 2, num_iterations
// below 1, a negative epsilon or beta, max_completion_length below 1.
void validate(const GrpoConfig& config);

// torch.std's unbiased (Bessel-corrected) standard deviation of
// values[begin, end), at least two values.
double unbiased_std(const std::vector<double>& values, size_t begin, size_t end);
// The plain mean of values (0 when empty).
double mean_of(const std::vector<double>& values);

// Per-completion advantages from per-completion rewards laid out group after
// group (group_size consecutive completions of one prompt): reward minus the
// group's mean, divided by (std + 1e-4) with std torch's unbiased one (of the
// group, or of the whole batch for "batch"), not divided for "none".
std::vector<double> grpo_advantages(const std::vector<double>& rewards, int64_t group_size,
                                    GrpoScaleRewards scale_rewards);

// One micro-batch of completions, rows x completion_tokens, flat row-major.
struct GrpoTokens {
  int64_t rows = 0, completion_tokens = 0;
  std::vector<double> logps;      // the policy's per-token log-probabilities (differentiated)
  std::vector<double> old_logps;  // at generation; empty: logps (trl's on-policy case, ratio 1)
  std::vector<double> ref_logps;  // the reference's; needed when beta != 0
  std::vector<uint8_t> mask;      // completion mask: 1 for a completion token, 0 for padding
  std::vector<double> advantages; // [rows]
  double num_items_in_batch = 0;  // dapo/cispo normaliser; 0: this batch's mask sum
};

struct GrpoLoss {
  double loss = 0;
  std::vector<double> dlogps;  // d(loss)/d(logps[n]); 0 where masked
  // trl's names: kl (beta != 0), clip_ratio/low_mean, clip_ratio/high_mean,
  // clip_ratio/region_mean, clip_ratio/low_min, clip_ratio/high_max (cispo:
  // cispo_clip_ratio).
  nlohmann::json metrics;
};
GrpoLoss grpo_loss(const GrpoConfig& config, const GrpoTokens& tokens);

}  // namespace ft
