#include "trainer/rl/grpo_step.h"

#include <algorithm>
#include <cmath>

#include "kernels/dropout_hash.h"
#include "kernels/error.h"

namespace ft {
namespace {

// Completions [begin, end) as training rows: prompt + completion, inputs
// and next-token targets (the completion's tokens only), right-padded.
// Rollout token j of row r is the target at r * T + first_target[r] + j.
struct CompletionBatch {
  Tensor ids, targets;
  std::vector<int64_t> first_target;
  int64_t rows = 0, T = 0, width = 0;  // width: the longest completion's tokens
};

CompletionBatch completion_batch(const std::vector<Rollout>& completions, size_t begin, size_t end,
                                 int32_t pad_id, Allocator& host) {
  CompletionBatch batch;
  batch.rows = int64_t(end - begin);
  for (size_t i = begin; i < end; ++i) {
    const Rollout& c = completions[i];
    batch.T = std::max<int64_t>(batch.T, int64_t(c.prompt_tokens.size() + c.tokens.size()) - 1);
    batch.width = std::max<int64_t>(batch.width, int64_t(c.tokens.size()));
  }
  batch.T = std::max<int64_t>(batch.T, 1);
  batch.ids = Tensor::empty({batch.rows, batch.T}, DType::i32, host, MemCategory::activations);
  batch.targets = Tensor::empty({batch.rows, batch.T}, DType::i32, host, MemCategory::activations);
  int32_t* ids = batch.ids.ptr<int32_t>();
  int32_t* targets = batch.targets.ptr<int32_t>();
  std::fill_n(ids, batch.rows * batch.T, pad_id);
  std::fill_n(targets, batch.rows * batch.T, kIgnoreIndex);
  for (int64_t r = 0; r < batch.rows; ++r) {
    const Rollout& c = completions[begin + size_t(r)];
    std::vector<int32_t> sequence = c.prompt_tokens;
    sequence.insert(sequence.end(), c.tokens.begin(), c.tokens.end());
    for (size_t t = 0; t + 1 < sequence.size(); ++t) ids[r * batch.T + int64_t(t)] = sequence[t];
    batch.first_target.push_back(int64_t(c.prompt_tokens.size()) - 1);
    for (size_t j = 0; j < c.tokens.size(); ++j) targets[r * batch.T + batch.first_target.back() + int64_t(j)] = c.tokens[j];
  }
  return batch;
}

// The batch's per-token values (token_logps' [rows * T]) as [rows * width] completion tokens.
std::vector<double> by_completion_token(const CompletionBatch& batch, const std::vector<float>& token_values) {
  std::vector<double> out(size_t(batch.rows * batch.width), 0.0);
  const int32_t* targets = batch.targets.ptr<int32_t>();
  for (int64_t r = 0; r < batch.rows; ++r)
    for (int64_t j = 0; j < batch.width; ++j) {
      const int64_t n = r * batch.T + batch.first_target[size_t(r)] + j;
      if (batch.first_target[size_t(r)] + j < batch.T && targets[n] != kIgnoreIndex)
        out[size_t(r * batch.width + j)] = token_values[size_t(n)];
    }
  return out;
}

std::vector<uint8_t> completion_mask(const std::vector<Rollout>& completions, size_t begin, const CompletionBatch& batch) {
  std::vector<uint8_t> mask(size_t(batch.rows * batch.width), 0);
  for (int64_t r = 0; r < batch.rows; ++r)
    std::fill_n(mask.begin() + r * batch.width, completions[begin + size_t(r)].tokens.size(), uint8_t(1));
  return mask;
}

// The reference's token log-probabilities: the same model, adapters off.
std::vector<float> reference_logps(CausalLM& model, const CompletionBatch& batch) {
  AdaptersDisabled off(model);
  return model.token_logps(batch.ids, batch.targets);
}

double mean_of(const std::vector<double>& values) {
  double sum = 0.0;
  for (double v : values) sum += v;
  return values.empty() ? 0.0 : sum / double(values.size());
}

}  // namespace

std::vector<Rollout> generate_completions(const GrpoStep& s, const std::vector<const PromptRow*>& prompts,
                                             int64_t repeats, int64_t step) {
  std::vector<Rollout> completions;
  for (const PromptRow* prompt : prompts)
    for (int64_t g = 0; g < repeats; ++g)
      completions.push_back({&prompt->row, prompt->prompt, prompt->tokens, {}, ""});
  const size_t chunk = size_t(std::max<int64_t>(s.micro_batch_size, 1));
  for (size_t first = 0; first < completions.size(); first += chunk) {
    const size_t end = std::min(completions.size(), first + chunk);
    std::vector<std::vector<int32_t>> inputs;
    for (size_t i = first; i < end; ++i) inputs.push_back(completions[i].prompt_tokens);
    SamplingOptions sampling = s.sampling;
    sampling.seed = splitmix64(splitmix64(s.seed, 0x67656e00ULL + uint64_t(step)), uint64_t(first));
    sampling.keep_stop_id = true;
    const std::vector<std::vector<int32_t>> generated = generate(s.model, inputs, sampling, s.stop);
    for (size_t i = first; i < end; ++i) {
      Rollout& c = completions[i];
      c.tokens = generated[i - first];
      std::vector<int32_t> text_tokens = c.tokens;
      if (!text_tokens.empty() &&
          std::find(s.stop.ids.begin(), s.stop.ids.end(), text_tokens.back()) != s.stop.ids.end())
        text_tokens.pop_back();
      c.text = s.tokenizer.decode(text_tokens);
    }
  }
  return completions;
}

nlohmann::json grpo_step(const GrpoStep& s, const std::vector<const PromptRow*>& prompts, int64_t step) {
  const GrpoConfig& config = s.config;
  std::vector<Rollout> completions = generate_completions(s, prompts, config.num_generations, step);
  const Rewards rewards = compute_rewards(s.rules, completions, s.reward_model);
  const std::vector<double> advantages = grpo_advantages(rewards.total, config.num_generations, config.scale_rewards);
  double active_tokens = 0.0, clipped = 0.0, length_sum = 0.0;
  for (const Rollout& c : completions) {
    active_tokens += double(c.tokens.size());
    length_sum += double(c.tokens.size());
    const bool ended = !c.tokens.empty() &&
                       std::find(s.stop.ids.begin(), s.stop.ids.end(), c.tokens.back()) != s.stop.ids.end();
    clipped += ended ? 0.0 : 1.0;
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
    const CompletionBatch batch = completion_batch(completions, first, end, s.pad_id, host);
    GrpoTokens tokens{batch.rows, batch.width, {}, {}, {}, completion_mask(completions, first, batch),
                      std::vector<double>(advantages.begin() + first, advantages.begin() + end),
                      by_items ? active_tokens : 0.0};
    if (config.beta != 0) tokens.ref_logps = by_completion_token(batch, reference_logps(s.model, batch));
    s.model.set_dropout_seed(splitmix64(s.seed, uint64_t(step) * uint64_t(s.grad_accum_steps) + micro_batches));
    const TokenLogpsGradient gradient = [&](const std::vector<float>& token_logps) {
      tokens.logps = by_completion_token(batch, token_logps);
      const GrpoLoss result = grpo_loss(config, tokens);
      loss += scale * result.loss;
      for (const auto& item : result.metrics.items())
        sums[item.key()] = sums.value(item.key(), 0.0) + item.value().get<double>();
      std::vector<float> dtokens(token_logps.size(), 0.0f);
      for (int64_t r = 0; r < batch.rows; ++r)
        for (int64_t j = 0; j < batch.width; ++j)
          if (tokens.mask[size_t(r * batch.width + j)])
            dtokens[size_t(r * batch.T + batch.first_target[size_t(r)] + j)] =
                float(scale * result.dlogps[size_t(r * batch.width + j)]);
      return dtokens;
    };
    s.model.token_logps_backward(batch.ids, batch.targets, gradient);
  }
  for (const auto& item : sums.items()) figures[item.key()] = item.value().get<double>() / double(micro_batches);
  std::vector<double> group_stds;
  for (size_t g = 0; g + size_t(config.num_generations) <= rewards.total.size(); g += size_t(config.num_generations))
    group_stds.push_back(unbiased_std(rewards.total, g, g + size_t(config.num_generations)));
  figures["loss"] = loss;
  figures["reward_std"] = mean_of(group_stds);
  figures["completions/mean_length"] = length_sum / double(completions.size());
  figures["completions/clipped_ratio"] = clipped / double(completions.size());
  return figures;
}

nlohmann::json evaluate_rollouts(const GrpoStep& s, const std::vector<const PromptRow*>& prompts) {
  // A step number no training step reaches: the same draws at every evaluation.
  const std::vector<Rollout> completions = generate_completions(s, prompts, 1, -1);
  const Rewards rewards = compute_rewards(s.rules, completions, s.reward_model);
  double kl_sum = 0.0;
  HostAllocator host;
  const size_t chunk = size_t(s.micro_batch_size);
  for (size_t first = 0; first < completions.size(); first += chunk) {
    const size_t end = std::min(completions.size(), first + chunk);
    const CompletionBatch batch = completion_batch(completions, first, end, s.pad_id, host);
    const std::vector<double> policy = by_completion_token(batch, s.model.token_logps(batch.ids, batch.targets));
    const std::vector<double> reference = by_completion_token(batch, reference_logps(s.model, batch));
    for (size_t n = 0; n < policy.size(); ++n) kl_sum += policy[n] - reference[n];
  }
  nlohmann::json figures = rewards.metrics();
  figures["kl"] = kl_sum / double(completions.size());
  return figures;
}

}  // namespace ft
