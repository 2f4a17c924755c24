#include "trainer/rl/grpo_step.h"

#include <algorithm>
#include <cmath>

#include "kernels/dropout_hash.h"
#include "kernels/error.h"

namespace ft {

nlohmann::json grpo_step(const GrpoStep& s, const std::vector<const PromptRow*>& prompts, int64_t step) {
  const GrpoConfig& config = s.config;
  LanguageModel& model = s.sampler.model;
  const std::vector<Rollout> completions = generate_completions(s.sampler, prompts, config.num_generations, step);
  const Rewards rewards = compute_rewards(s.rules, completions, s.reward_model);
  const std::vector<double> advantages = grpo_advantages(rewards.total, config.num_generations, config.scale_rewards);
  double active_tokens = 0.0, clipped = 0.0;
  for (const Rollout& c : completions) {
    active_tokens += double(c.tokens.size());
    clipped += ended_by_stop(c, s.sampler.stop) ? 0.0 : 1.0;
  }
  // trl divides the grpo, bnpo and dr_grpo losses by the accumulation steps;
  // dapo and cispo are normalised by the whole generation batch's tokens.
  const bool by_items = config.loss_type == GrpoLossType::dapo || config.loss_type == GrpoLossType::cispo;
  const double scale = by_items ? 1.0 : 1.0 / double(s.grad_accum_steps);
  nlohmann::json figures = rewards.metrics(), sums = nlohmann::json::object();
  double loss = 0.0;
  int64_t micro_batches = 0;
  HostAllocator host;
  const size_t chunk = size_t(s.micro_batch_size);
  for (size_t first = 0; first < completions.size(); first += chunk, ++micro_batches) {
    const size_t end = std::min(completions.size(), first + chunk);
    const CompletionBatch batch = completion_batch(model, completions, first, end, s.pad_id, host);
    const size_t width_tokens = size_t(batch.rows * batch.width);
    GrpoTokens tokens{batch.rows, batch.width, std::vector<double>(width_tokens), {}, {},
                      completion_mask(completions, first, batch.rows, batch.width),
                      std::vector<double>(advantages.begin() + first, advantages.begin() + end),
                      by_items ? active_tokens : 0.0};
    if (config.beta != 0) {
      tokens.ref_logps.assign(width_tokens, 0.0);
      gather_completion_tokens(batch, reference_logps(model, batch), batch.width, 0, tokens.ref_logps);
    }
    model.set_dropout_seed(splitmix64(s.sampler.seed, uint64_t(step) * uint64_t(s.grad_accum_steps) + micro_batches));
    const TokenLogpsGradient gradient = [&](const std::vector<float>& token_logps) {
      gather_completion_tokens(batch, token_logps, batch.width, 0, tokens.logps);
      const GrpoLoss result = grpo_loss(config, tokens);
      loss += scale * result.loss;
      for (const auto& item : result.metrics.items())
        sums[item.key()] = sums.value(item.key(), 0.0) + item.value().get<double>();
      return scatter_completion_tokens(batch, result.dlogps, batch.width, 0, scale);
    };
    policy_token_logps_backward(model, batch, gradient);
  }
  for (const auto& item : sums.items()) figures[item.key()] = item.value().get<double>() / double(micro_batches);
  std::vector<double> group_stds;
  for (size_t g = 0; g + size_t(config.num_generations) <= rewards.total.size(); g += size_t(config.num_generations))
    group_stds.push_back(unbiased_std(rewards.total, g, g + size_t(config.num_generations)));
  figures["loss"] = loss;
  figures["reward_std"] = mean_of(group_stds);
  figures["completions/mean_length"] = active_tokens / double(completions.size());
  figures["completions/clipped_ratio"] = clipped / double(completions.size());
  return figures;
}

}  // namespace ft
