// Online-RL steps run for real on any backend, for the memory planner's
// tests (tests/test_plan.cpp on the CPU, tests/emu/test_cuda_plan.cpp on the
// emulated CUDA backend): their measured peaks against plan_step's GRPO
// phases and plan_ppo_step's PPO phases. The caller builds the models (its
// own weights, its own allocator) and says how its peak is read.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/causal_lm.h"
#include "model/families.h"
#include "trainer/generate.h"
#include "trainer/plan.h"
#include "trainer/rl/grpo_step.h"
#include "trainer/rl/reward.h"
#include "trainer/rl/rollouts.h"
#include "trainer/setup.h"
#include "tokenizer/tokenizer.h"

namespace ft {

// A phase's peak: reset() starts it from what is held now, peak() reads it.
struct PeakMeter {
  std::function<void()> reset;
  std::function<size_t()> peak;
};

// The largest of a plan's online-RL phases (all but the run's checkpoint)
// and its step: what a whole RL step holds at its peak.
inline size_t rl_step_peak(const StepPlan& plan) {
  size_t peak = plan.peak_bytes;
  for (const StepPlan::PhasePeak& phase : plan.phases)
    if (phase.phase != "checkpoint") peak = std::max(peak, phase.peak_bytes);
  return peak;
}

// The reward model as RewardModel builds it (no adapter); weights left to the caller.
inline std::unique_ptr<CausalLM> make_reward_model(const TrainConfig& config, const std::string& folder,
                                                   Backend& backend) {
  return make_causal_lm(read_model_config(folder + "/config.json"), backend,
                        reward_model_options(model_options(config), ""));
}

// Prompt r's tokens t: fixed, inside the vocabulary.
inline std::vector<int32_t> test_prompt(int64_t r, int64_t tokens, int64_t vocab_size) {
  std::vector<int32_t> prompt;
  for (int64_t t = 0; t < tokens; ++t) prompt.push_back(int32_t((r * 5 + t * 3 + 4) % vocab_size));
  return prompt;
}

// GRPO's completions are rewarded by length here; their text is never read.
class NoTextTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(const std::string&) const override { return {}; }
  std::string decode(const std::vector<int32_t>&) const override { return ""; }
  std::string token_text(int32_t) const override { return ""; }
  int64_t vocab_size() const override { return 0; }
  int32_t bos_id() const override { return -1; }
  int32_t eos_id() const override { return -1; }
  int32_t pad_id() const override { return -1; }
  std::string file_name() const override { return "tokenizer.json"; }
};

// The peaks of a GRPO step's rollout alone (generate_completions, as
// grpo_generate generates) and of the whole step (grpo_generate: rollouts,
// rewards, per micro-batch the policy's log-probabilities with
// grpo.num_iterations > 1 and the reference's; grpo_step: per micro-batch
// the policy's backward; then AdamW's step), over setup's model (config's objective: grpo, a rule reward).
// Prompts of seq_len - max_completion_length tokens and no stop token:
// every completion is max_completion_length long, the most a run's are.
struct GrpoPeaks {
  size_t rollout = 0, step = 0;
};
inline GrpoPeaks grpo_step_peaks(const TrainConfig& config, TrainingSetup& setup, const PeakMeter& meter) {
  CausalLM& model = causal_lm(*setup.model, "grpo_step_peak");
  const int64_t prompt_tokens = config.seq_len - config.grpo.max_completion_length;
  std::vector<PromptRow> rows(size_t(config.micro_batch_size * config.grad_accum_steps / config.grpo.num_generations));
  for (size_t r = 0; r < rows.size(); ++r)
    rows[r].tokens = test_prompt(int64_t(r), prompt_tokens, model.config().vocab_size);
  std::vector<const PromptRow*> prompts;
  for (const PromptRow& row : rows) prompts.push_back(&row);
  const NoTextTokenizer tokenizer;
  SamplingOptions sampling;
  sampling.max_new_tokens = config.grpo.max_completion_length;
  sampling.temperature = 1.0;
  const GrpoStep step{RolloutSampler{model, tokenizer, sampling, StopCondition{}, config.micro_batch_size, config.seed},
                      config.grpo, config.rewards, nullptr, 0, config.micro_batch_size, config.grad_accum_steps};
  GrpoPeaks peaks;
  meter.reset();
  generate_completions(step.sampler, prompts, config.grpo.num_generations, 0);
  peaks.rollout = meter.peak();
  meter.reset();
  model.zero_grads();
  const GrpoGeneration generation = grpo_generate(step, prompts, 0);
  const nlohmann::json figures = grpo_step(step, generation, 0);
  CHECK(figures["completions/mean_length"].get<double>() == double(config.grpo.max_completion_length));
  setup.optimizer->step(config.lr);
  peaks.step = meter.peak();
  return peaks;
}

// A GRPO plan's rollout phase and whole step against the measured ones.
inline void check_grpo_plan(const StepPlan& plan, const GrpoPeaks& measured) {
  REQUIRE(plan.phases.size() >= 2);
  CHECK(plan.phases[0].phase == "rollout");
  MESSAGE("GRPO: planned ", rl_step_peak(plan), " bytes (rollout ", plan.phases[0].peak_bytes, "), measured ",
          measured.step, " (rollout ", measured.rollout, ")");
  CHECK(plan.phases[0].peak_bytes == measured.rollout);
  CHECK(rl_step_peak(plan) == measured.step);
}

// One PPO step phase by phase, as plan_ppo_step replays it, over setup's
// policy (built with OutputHead::value) and a reward model (score head):
// the rollout of ppo.rows (generate with the KV cache, no stop token), their
// log-probabilities and values, the reference's (adapters disabled), the
// reward model's scores of reward_rows sequences of prompt + response (the
// rollouts repeated), then the policy and value backward over
// mini_batch_rows of them and AdamW. Each phase's peak, by the plan's names
// ("step" last).
inline std::vector<std::pair<std::string, size_t>> ppo_step_peaks(const TrainConfig& config, const PpoPlan& ppo,
                                                                  TrainingSetup& setup, CausalLM& reward,
                                                                  const PeakMeter& meter) {
  CausalLM& model = causal_lm(*setup.model, "ppo_step_peaks");
  REQUIRE(model.output_head().bias);
  Backend& backend = model.backend();
  const int64_t R = ppo.rows, P = ppo.prompt_tokens, length = ppo.prompt_tokens + ppo.response_tokens;
  const int64_t scored_rows = ppo.reward_rows > 0 ? ppo.reward_rows : R;
  const int64_t mini_batch_rows = ppo.mini_batch_rows > 0 ? ppo.mini_batch_rows : R;
  REQUIRE(mini_batch_rows <= R);
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t r = 0; r < R; ++r) prompts.push_back(test_prompt(r, P, model.config().vocab_size));
  SamplingOptions sampling;
  sampling.max_new_tokens = ppo.response_tokens;
  sampling.temperature = 1.0;
  std::vector<std::pair<std::string, size_t>> peaks;
  auto phase = [&](const char* name, const std::function<void()>& run) {
    meter.reset();
    run();
    peaks.push_back({name, meter.peak()});
  };
  std::vector<std::vector<int32_t>> responses;
  phase("rollout", [&] { responses = generate(model, prompts, sampling, StopCondition{}); });
  // Inputs and next-token targets (the response's only), and the whole sequences the reward model scores.
  HostAllocator host;
  Tensor ids = Tensor::empty({R, length - 1}, DType::i32, host, MemCategory::activations);
  Tensor targets = Tensor::empty({R, length - 1}, DType::i32, host, MemCategory::activations);
  Tensor scored = Tensor::empty({scored_rows, length}, DType::i32, host, MemCategory::activations);
  for (int64_t r = 0; r < R; ++r) {
    REQUIRE(int64_t(responses[size_t(r)].size()) == ppo.response_tokens);
    std::vector<int32_t> sequence = prompts[size_t(r)];
    sequence.insert(sequence.end(), responses[size_t(r)].begin(), responses[size_t(r)].end());
    for (int64_t copy = r; copy < scored_rows; copy += R)
      std::copy(sequence.begin(), sequence.end(), scored.ptr<int32_t>() + copy * length);
    for (int64_t t = 0; t + 1 < length; ++t) {
      ids.ptr<int32_t>()[r * (length - 1) + t] = sequence[size_t(t)];
      targets.ptr<int32_t>()[r * (length - 1) + t] = t + 1 >= P ? sequence[size_t(t + 1)] : -100;
    }
  }
  // Training (dhidden) reads dropout(hidden), ppo.summary_dropout_prob, as ppo_step's mini-batches do.
  const HiddenHead value_head = [&](const Tensor& hidden, Tensor* dhidden) {
    const HeadDropout dropout{dhidden ? float(config.ppo.summary_dropout_prob) : 0.0f, 7};
    const std::vector<float> values = head_outputs(backend, model.output_head(), hidden, dropout);
    if (dhidden)
      head_backward(backend, model.output_head(), hidden, std::vector<float>(values.size(), 0.01f), *dhidden, dropout);
  };
  phase("rollout values", [&] { model.token_logps(ids, targets, nullptr, &value_head); });
  phase("reference", [&] {
    AdaptersDisabled off(model);
    model.token_logps(ids, targets);
  });
  phase("reward",
        [&] { sequence_scores(reward, ScoredRows{scored, std::vector<int64_t>(size_t(scored_rows), length - 1)}); });
  phase("step", [&] {
    model.zero_grads();
    model.set_dropout_seed(config.seed);
    const TokenLogpsGradient gradient = [](const std::vector<float>& logps) {
      return std::vector<float>(logps.size(), 0.01f);
    };
    model.token_logps_backward(ids.slice_rows(0, mini_batch_rows), targets.slice_rows(0, mini_batch_rows), gradient,
                               nullptr, &value_head);
    setup.optimizer->step(config.lr);
  });
  return peaks;
}

// A PPO plan's phases (rollout, rollout values, reference, reward) and its
// step against ppo_step_peaks' measured ones.
inline void check_ppo_plan(const StepPlan& plan, const std::vector<std::pair<std::string, size_t>>& measured) {
  REQUIRE(plan.phases.size() == 5);
  REQUIRE(measured.size() == 5);
  for (size_t i = 0; i < 4; ++i) {
    MESSAGE("PPO ", plan.phases[i].phase, ": planned ", plan.phases[i].peak_bytes, ", measured ", measured[i].second);
    CHECK(plan.phases[i].phase == measured[i].first);
    CHECK(plan.phases[i].peak_bytes == measured[i].second);
  }
  MESSAGE("PPO policy and value step: planned ", plan.peak_bytes, ", measured ", measured[4].second);
  CHECK(plan.peak_bytes == measured[4].second);
  CHECK(plan.reward_model_bytes > 0);
}

}  // namespace ft
