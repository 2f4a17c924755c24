#include "trainer/rl/grpo_step.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "kernels/dropout_hash.h"
#include "kernels/error.h"

namespace ft {
namespace {

// The generation's completions [first, first + micro_batch_size) as training rows.
CompletionBatch micro_batch_rows(const GrpoStep& s, const std::vector<Rollout>& completions, size_t first,
                                 HostAllocator& host) {
  const size_t end = std::min(completions.size(), first + size_t(s.micro_batch_size));
  return completion_batch(s.sampler.model, completions, first, end, s.pad_id, host);
}

std::vector<double> completion_logps(const CompletionBatch& batch, const std::vector<float>& token_logps) {
  std::vector<double> out(size_t(batch.rows * batch.width), 0.0);
  gather_completion_tokens(batch, token_logps, batch.width, 0, out);
  return out;
}

}  // namespace

GrpoGeneration grpo_generate(const GrpoStep& s, const std::vector<const PromptRow*>& prompts, int64_t step) {
  const GrpoConfig& config = s.config;
  LanguageModel& model = s.sampler.model;
  GrpoGeneration out;
  out.step = step;
  out.completions = generate_completions(s.sampler, prompts, config.num_generations, step);
  const Rewards rewards = compute_rewards(s.rules, out.completions, s.reward_model);
  out.advantages = grpo_advantages(rewards.total, config.num_generations, config.scale_rewards);
  out.reward_figures = rewards.metrics();
  std::vector<double> group_stds;
  for (size_t g = 0; g + size_t(config.num_generations) <= rewards.total.size(); g += size_t(config.num_generations))
    group_stds.push_back(unbiased_std(rewards.total, g, g + size_t(config.num_generations)));
  out.reward_figures["reward_std"] = mean_of(group_stds);
  HostAllocator host;
  for (size_t first = 0; first < out.completions.size(); first += size_t(s.micro_batch_size)) {
    const CompletionBatch batch = micro_batch_rows(s, out.completions, first, host);
    if (config.num_iterations > 1) out.old_logps.push_back(completion_logps(batch, policy_token_logps(model, batch)));
    if (config.beta != 0) out.ref_logps.push_back(completion_logps(batch, reference_logps(model, batch)));
  }
  return out;
}

nlohmann::json grpo_step(const GrpoStep& s, const GrpoGeneration& generation, int64_t step) {
  const GrpoConfig& config = s.config;
  LanguageModel& model = s.sampler.model;
  const std::vector<Rollout>& completions = generation.completions;
  double active_tokens = 0.0, clipped = 0.0;
  for (const Rollout& c : completions) {
    active_tokens += double(c.tokens.size());
    clipped += ended_by_stop(c, s.sampler.stop) ? 0.0 : 1.0;
  }
  // trl divides the grpo, bnpo and dr_grpo losses by the accumulation steps;
  // dapo and cispo are normalised by the whole generation batch's tokens.
  const bool by_items = config.loss_type == GrpoLossType::dapo || config.loss_type == GrpoLossType::cispo;
  const double scale = by_items ? 1.0 : 1.0 / double(s.grad_accum_steps);
  nlohmann::json figures = generation.reward_figures, sums = nlohmann::json::object();
  double loss = 0.0;
  size_t micro_batches = 0;
  HostAllocator host;
  for (size_t first = 0; first < completions.size(); first += size_t(s.micro_batch_size), ++micro_batches) {
    const CompletionBatch batch = micro_batch_rows(s, completions, first, host);
    const size_t width_tokens = size_t(batch.rows * batch.width);
    GrpoTokens tokens{batch.rows, batch.width, std::vector<double>(width_tokens), {}, {},
                      completion_mask(completions, first, batch.rows, batch.width),
                      std::vector<double>(generation.advantages.begin() + int64_t(first),
                                          generation.advantages.begin() + int64_t(first) + batch.rows),
                      by_items ? active_tokens : 0.0};
    if (!generation.old_logps.empty()) tokens.old_logps = generation.old_logps[micro_batches];
    if (config.beta != 0) tokens.ref_logps = generation.ref_logps[micro_batches];
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
  figures["loss"] = loss;
  figures["completions/mean_length"] = active_tokens / double(completions.size());
  figures["completions/clipped_ratio"] = clipped / double(completions.size());
  return figures;
}

nlohmann::json to_json(const GrpoGeneration& generation, const std::vector<PromptRow>& rows) {
  std::map<const nlohmann::json*, size_t> index;
  for (size_t i = 0; i < rows.size(); ++i) index[&rows[i].row] = i;
  nlohmann::json prompts = nlohmann::json::array(), tokens = nlohmann::json::array();
  for (const Rollout& c : generation.completions) {
    const auto found = index.find(c.row);
    FT_CHECK(found != index.end(), "grpo: a completion's prompt is not among the train prompts");
    prompts.push_back(found->second);
    tokens.push_back(c.tokens);
  }
  return {{"step", generation.step},          {"prompts", prompts},
          {"tokens", tokens},                 {"reward_figures", generation.reward_figures},
          {"advantages", generation.advantages}, {"old_logps", generation.old_logps},
          {"ref_logps", generation.ref_logps}};
}

GrpoGeneration grpo_generation_from_json(const nlohmann::json& state, const std::vector<PromptRow>& rows,
                                         const std::string& where) {
  GrpoGeneration out;
  try {
    out.step = state.at("step").get<int64_t>();
    const auto prompts = state.at("prompts").get<std::vector<size_t>>();
    const auto tokens = state.at("tokens").get<std::vector<std::vector<int32_t>>>();
    FT_CHECK(prompts.size() == tokens.size(), where, ": ", prompts.size(), " prompts for ", tokens.size(),
             " completions");
    for (size_t i = 0; i < prompts.size(); ++i) {
      FT_CHECK(prompts[i] < rows.size(), where, ": prompt index ", prompts[i], " past the ", rows.size(),
               " train prompts");
      const PromptRow& row = rows[prompts[i]];
      out.completions.push_back({&row.row, row.prompt, row.tokens, tokens[i], "", &row.messages});
    }
    out.reward_figures = state.at("reward_figures");
    out.advantages = state.at("advantages").get<std::vector<double>>();
    out.old_logps = state.at("old_logps").get<std::vector<std::vector<double>>>();
    out.ref_logps = state.at("ref_logps").get<std::vector<std::vector<double>>>();
  } catch (const nlohmann::json::exception& e) {
    fail(where, ": the saved GRPO generation batch is malformed: ", e.what());
  }
  FT_CHECK(out.advantages.size() == out.completions.size(), where, ": ", out.advantages.size(),
           " advantages for ", out.completions.size(), " completions");
  return out;
}

}  // namespace ft
