// The memory planner (trainer/plan.h) against real CPU steps: it runs the same
// model and optimizer code on the meta device, so its peak must equal, to the
// byte, the TrackingAllocator peak of a real CpuBackend step of the same
// shape. Then the caching-allocator model, errors, and the 20B headline plan.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/error.h"
#include "model/causal_lm.h"
#include "model/families.h"
#include "model/quant/formats.h"
#include "trainer/dpo.h"
#include "trainer/generate.h"
#include "model/peft_adapter.h"
#include "trainer/plan.h"
#include "tests/rl_step_peaks.h"
#include "tests/thread_group.h"
#include "trainer/rl/reward.h"
#include "trainer/train_state.h"
#include "trainer/trainer.h"

namespace fs = std::filesystem;
using namespace ft;

namespace {

const std::string kFixtures = FT_FIXTURES_DIR;

// A run config for the model folder; data.train is required but never read.
TrainConfig make_config(const std::string& model_dir, const std::string& extra_yaml) {
  const std::string yaml = "model: " + model_dir + "\ndata: {train: unused.jsonl}\nprecision: fp32\n" + extra_yaml;
  return parse_train_config(yaml, (fs::path(FT_BINARY_DIR) / "plan.yaml").string());
}

// A config.json written under the build folder (no weights: the real step fills its own).
std::string write_model(const std::string& name, const std::string& json) {
  const fs::path dir = fs::path(FT_BINARY_DIR) / "plan_models" / name;
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << json;
  return dir.string();
}

// Deterministic small values; memory does not depend on them. Quantized
// weights are quantised from these values the way load() does (assign_weight,
// into the already allocated tensors: nothing new is tracked).
void fill_weights(LanguageModel& model, Backend& backend) {
  HostAllocator host;
  uint32_t state = 12345;
  for (Parameter& p : model.parameters()) {
    Tensor values = Tensor::empty(p.shape(), DType::f32, host, MemCategory::workspace);
    for (int64_t i = 0; i < values.numel(); ++i) {
      state = state * 1664525u + 1013904223u;
      values.ptr<float>()[i] = 0.02f * (float(state >> 8) / float(1 << 24) - 0.5f);
    }
    assign_weight(backend, p, values);
  }
}

// Host i32 [rows, seq] token ids spread over the vocabulary.
Tensor token_ids(int64_t rows, int64_t seq, int64_t vocab, Allocator& host) {
  Tensor ids = Tensor::empty({rows, seq}, DType::i32, host, MemCategory::activations);
  for (int64_t i = 0; i < ids.numel(); ++i) ids.ptr<int32_t>()[i] = int32_t((i * 7 + 3) % vocab);
  return ids;
}

// The tracked peak of one real CPU training step, built as plan_step builds it
// (objective: dpo: batch pairs, the reference forward and the policy's step;
// objective: reward: batch pairs through the score head).
// With phase_peaks, after the step the tracked peaks of the run's other
// phases as a run makes them: the checkpoint's host copies, an eval forward
// of batch x seq (its logits released), and generate() over the larger of
// ROUGE's and the samples' batches with prompts of seq tokens.
size_t real_step_peak(const TrainConfig& config, int64_t batch, int64_t seq,
                      std::vector<size_t>* phase_peaks = nullptr) {
  const bool dpo = config.objective == Objective::dpo, reward = config.objective == Objective::reward;
  const ModelConfig model_config = read_model_config(config.model + "/config.json");
  HostAllocator host;
  TrackingAllocator tracker(host), host_state(host);
  CpuBackend backend(tracker);
  TrainingSetup setup = setup_training(
      config, model_config, backend, [&](LanguageModel& model) { fill_weights(model, backend); }, &host_state);
  CausalLM* model = &causal_lm(*setup.model, "real_step_peak");
  Tensor ids = token_ids(dpo || reward ? 2 * batch : batch, seq, model_config.vocab_size, host);
  model->zero_grads();
  model->set_dropout_seed(config.seed);
  const Batch pairs{ids, ids, ids.numel()};
  const double loss = dpo      ? dpo_micro_batch(*model, pairs, config.dpo, true, 1.0).loss
                      : reward ? reward_micro_batch(*model, pairs, 0, true, 1.0).loss
                               : model->forward_backward(ids, ids, 1.0f);
  CHECK(std::isfinite(loss));
  setup.optimizer->step(config.lr);
  const size_t step_peak = tracker.stats().total_peak_bytes;
  if (!phase_peaks) return step_peak;
  tracker.reset_peaks();
  train_state_tensors(*setup.optimizer, host);
  peft_adapter_tensors(*model, host);
  phase_peaks->push_back(tracker.stats().total_peak_bytes);
  tracker.reset_peaks();
  if (reward) reward_micro_batch(*model, pairs, 0, false, 0.0);  // evaluate_reward's micro-batch
  else model->forward(ids, ids);
  model->release_logits();
  phase_peaks->push_back(tracker.stats().total_peak_bytes);
  const int64_t rows = generation_batch(
      config, std::max<int64_t>(std::min<int64_t>(16, config.metric_examples), config.generate.num_samples));
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = 0; t < seq; ++t) prompts[size_t(r)].push_back(int32_t((r * 5 + t * 3 + 4) % model_config.vocab_size));
  SamplingOptions greedy;
  greedy.max_new_tokens = config.generate.max_new_tokens;
  tracker.reset_peaks();
  generate(*model, prompts, greedy, StopCondition{});
  phase_peaks->push_back(tracker.stats().total_peak_bytes);
  return step_peak;
}

void check_plan_matches_real_step(const std::string& model_dir, const std::string& extra_yaml, int64_t batch,
                                  int64_t seq) {
  CAPTURE(model_dir);
  CAPTURE(extra_yaml);
  const TrainConfig config = make_config(model_dir, extra_yaml);
  PlanOptions cpu;
  cpu.policy = MemoryPolicy::cpu;
  const StepPlan plan = plan_step(config, cpu, batch, seq);
  const size_t measured = real_step_peak(config, batch, seq);
  const std::string run = fs::path(model_dir).filename().string() +
                          (config.trainable == Trainable::all ? std::string(" full fp32")
                                                              : std::string(" ") + enum_name(config.quantization.mode) +
                                                                    " + LoRA");
  MESSAGE(run, ": planned ", plan.peak_bytes, " bytes, measured ", measured, " (peak at ",
          plan.where, ")");
  CHECK(plan.peak_bytes == measured);
}

const char* kInt8Lora = "quantization: {mode: int8}\nlora: {r: 8, lora_alpha: 16, lora_dropout: 0.05, target_modules: ";
const std::string kLlamaLora = std::string(kInt8Lora) + "[q_proj, v_proj]}\n";
const std::string kNeoxLora = std::string(kInt8Lora) + "[query_key_value]}\n";
const std::string kFullFp32 = "quantization: {mode: none}\ntrainable: all\n";
const std::string kNf4AllLinear = "quantization: {mode: nf4}\nlora: {r: 8, lora_alpha: 16, target_modules: all-linear}\n";
const std::string kNf4OffloadedAdamW =
    "quantization: {mode: nf4}\nlora: {r: 8, target_modules: all-linear}\noffload: {optimizer: host}\n";
const std::string kNf4PlainAbsmax =
    "quantization: {mode: nf4, double_quant: false}\nlora: {r: 4, target_modules: [q_proj, down_proj]}\n";

struct PlanRun {
  int exit_status = -1;  // -1: did not exit normally
  std::string output;    // stdout and stderr
};

// `finetune plan ARGS` through the binary.
PlanRun run_plan(const std::string& args) {
  const std::string command = std::string("timeout -k 10 120 ") + FT_FINETUNE_BINARY + " plan " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe);
  PlanRun run;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) run.output.append(buffer, n);
  const int status = pclose(pipe);
  if (WIFEXITED(status)) run.exit_status = WEXITSTATUS(status);
  return run;
}

}  // namespace

TEST_CASE("plan: the tiny fixtures' planned peak equals a real CPU step's, to the byte") {
  check_plan_matches_real_step(kFixtures + "/llama_gqa", kLlamaLora, 2, 16);
  check_plan_matches_real_step(kFixtures + "/llama_gqa", kFullFp32, 2, 16);
  check_plan_matches_real_step(kFixtures + "/gpt_neox_parallel", kNeoxLora, 2, 16);
  check_plan_matches_real_step(kFixtures + "/gpt_neox_parallel", kFullFp32, 2, 16);
  check_plan_matches_real_step(kFixtures + "/gpt_neox_sequential", kNeoxLora, 2, 16);
  check_plan_matches_real_step(kFixtures + "/llama_gqa", kNf4AllLinear, 2, 16);
  check_plan_matches_real_step(kFixtures + "/llama_gqa", kNf4PlainAbsmax, 2, 16);
  check_plan_matches_real_step(kFixtures + "/gpt_neox_parallel", kNf4AllLinear, 2, 16);
  check_plan_matches_real_step(kFixtures + "/llama_gqa", kNf4OffloadedAdamW, 2, 16);
  check_plan_matches_real_step(kFixtures + "/llama_gqa", kFullFp32 + "offload: {optimizer: host}\n", 2, 16);
  check_plan_matches_real_step(kFixtures + "/llama_gqa", "objective: dpo\n" + kLlamaLora, 2, 16);
  check_plan_matches_real_step(kFixtures + "/gpt_neox_parallel", "objective: dpo\nloss_chunk_tokens: 12\n" + kNeoxLora, 2, 16);
  check_plan_matches_real_step(kFixtures + "/llama_gqa", "objective: reward\n" + kLlamaLora, 2, 16);
  check_plan_matches_real_step(kFixtures + "/gpt_neox_parallel", "objective: reward\n" + kNeoxLora, 2, 16);
  // NEFTune's noise is added in place: nothing more is held.
  check_plan_matches_real_step(kFixtures + "/llama_gqa", "neftune_noise_alpha: 5\n" + kLlamaLora, 2, 16);
  check_plan_matches_real_step(kFixtures + "/gpt_neox_parallel", "neftune_noise_alpha: 5\n" + kFullFp32, 2, 16);
  // DoRA: the magnitudes, their weight norms, the norm's column tiles and the backward's recomputed output.
  const std::string dora = "quantization: {mode: int8}\nlora: {r: 8, use_dora: true, target_modules: all-linear}\n";
  check_plan_matches_real_step(kFixtures + "/llama_gqa", dora, 2, 16);
  check_plan_matches_real_step(kFixtures + "/gpt_neox_parallel", dora, 2, 16);
  // With dropout: the base's second product, over the dropped input, a column tile of W at a time.
  check_plan_matches_real_step(kFixtures + "/gpt_neox_parallel",
                               "quantization: {mode: int8}\nlora: {r: 8, lora_dropout: 0.1, use_dora: true, "
                               "target_modules: all-linear}\n",
                               2, 16);
  check_plan_matches_real_step(kFixtures + "/llama_gqa",
                               "quantization: {mode: nf4}\nlora: {r: 4, use_dora: true, target_modules: all-linear}\n",
                               2, 16);
  // rank_pattern: adapters of several ranks (their tiles, the optimizer's state, the saved copies).
  check_plan_matches_real_step(kFixtures + "/llama_gqa",
                               "quantization: {mode: nf4}\nlora: {r: 4, target_modules: all-linear, "
                               "rank_pattern: {q_proj: 16, layers.1.mlp.down_proj: 2}, alpha_pattern: {v_proj: 32}}\n",
                               2, 16);
}

// mlp_chunk_tokens: the MLP's tensors for 5 of the 32 tokens at a time (the
// last chunk 2), checkpointed or not, LoRA on the MLP (dropout) or not.
TEST_CASE("plan: with the MLP run over chunks of tokens the planned peak equals a real CPU step's, to the byte") {
  const std::string chunked = "mlp_chunk_tokens: 5\n", checkpointed = "activation_checkpointing: per_layer\n";
  check_plan_matches_real_step(kFixtures + "/llama_gqa", kLlamaLora + chunked, 2, 16);
  check_plan_matches_real_step(kFixtures + "/llama_gqa", kLlamaLora + chunked + checkpointed, 2, 16);
  check_plan_matches_real_step(kFixtures + "/llama_gqa", kNf4AllLinear + chunked + checkpointed, 2, 16);
  check_plan_matches_real_step(kFixtures + "/llama_gqa", kFullFp32 + chunked, 2, 16);
  check_plan_matches_real_step(kFixtures + "/gpt_neox_parallel", kNeoxLora + chunked + checkpointed, 2, 16);
  check_plan_matches_real_step(kFixtures + "/gpt_neox_sequential", kNf4AllLinear + chunked, 2, 16);
  const std::string dora = "quantization: {mode: int8}\nlora: {r: 8, use_dora: true, target_modules: all-linear}\n";
  check_plan_matches_real_step(kFixtures + "/llama_gqa", dora + chunked + checkpointed, 2, 16);
}

// With an eval set, the plan replays the run's evaluation and generation
// after the step: each phase's planned peak equals the real one's to the
// byte, and the run's peak is the largest.
TEST_CASE("plan: evaluation and generation after the step plan to the byte, and the run's peak covers them") {
  for (const std::string& lora : {kLlamaLora, kNf4AllLinear}) {
    CAPTURE(lora);
    TrainConfig config = make_config(kFixtures + "/llama_gqa",
                                     lora + "metric_examples: 5\ngenerate: {num_samples: 3, max_new_tokens: 4}\n");
    // The plan reads no data: naming an eval set is enough to replay its phases.
    config.data.eval = "eval.jsonl";
    config.task_metric = TaskMetric::rouge;
    PlanOptions cpu;
    cpu.policy = MemoryPolicy::cpu;
    const int64_t batch = 2, seq = 16;
    const StepPlan plan = plan_step(config, cpu, batch, seq);
    REQUIRE(plan.phases.size() == 3);
    CHECK(plan.phases[0].phase == "checkpoint");
    CHECK(plan.phases[1].phase == "evaluation");
    CHECK(plan.phases[2].phase == "generation");
    std::vector<size_t> measured;
    real_step_peak(config, batch, seq, &measured);
    for (size_t i = 0; i < 3; ++i) {
      MESSAGE(plan.phases[i].phase, ": planned ", plan.phases[i].peak_bytes, ", measured ", measured[i]);
      CHECK(plan.phases[i].peak_bytes == measured[i]);
    }
    CHECK(plan.total_bytes() == std::max({plan.peak_bytes, measured[0], measured[1], measured[2]}));
    // objective: reward evaluates its pairs through the score head, and samples nothing.
    TrainConfig reward = make_config(kFixtures + "/llama_gqa", "objective: reward\n" + lora);
    reward.data.eval = "eval.jsonl";
    const StepPlan reward_plan = plan_step(reward, cpu, batch, seq);
    REQUIRE(reward_plan.phases.size() == 2);
    CHECK(reward_plan.phases[1].phase == "evaluation");
    std::vector<size_t> reward_measured;
    real_step_peak(reward, batch, seq, &reward_measured);
    CHECK(reward_plan.phases[0].peak_bytes == reward_measured[0]);
    CHECK(reward_plan.phases[1].peak_bytes == reward_measured[1]);
    // Without an eval set a run neither evaluates nor samples; it still saves.
    config.data.eval.clear();
    config.task_metric = TaskMetric::none;
    CHECK(plan_step(config, cpu, batch, seq).phases.size() == 1);
  }
}

// A CPU backend whose tracked peaks the RL steps (tests/rl_step_peaks.h) read.
struct TrackedCpu {
  HostAllocator host;
  TrackingAllocator tracker{host}, host_state{host};
  CpuBackend backend{tracker};
  PeakMeter meter{[this] { tracker.reset_peaks(); }, [this] { return tracker.stats().total_peak_bytes; }};
  TrainingSetup setup(const TrainConfig& config, std::optional<OutputHead> head = std::nullopt) {
    return setup_training(config, read_model_config(config.model + "/config.json"), backend,
                          [&](LanguageModel& model) { fill_weights(model, backend); }, &host_state, {}, {}, head);
  }
};

// GRPO's step, planned as its phases (the rollout, with num_iterations > 1
// the policy's log-probabilities at generation, the reference forward, the
// policy's backward), equals grpo_step's measured peak on the CPU.
TEST_CASE("plan: a GRPO step (rollout, reference, policy backward) plans to the byte") {
  const std::string grpo = "objective: grpo\nrewards: {length: 8}\nmicro_batch_size: 4\nseq_len: 24\n";
  for (const std::string& extra :
       {grpo + "grpo: {num_generations: 2, max_completion_length: 8, beta: 0.04}\n" + kLlamaLora,
        grpo + "grpo: {num_generations: 2, max_completion_length: 8, beta: 0.04, num_iterations: 2}\n" + kLlamaLora,
        grpo + "grpo: {num_generations: 4, max_completion_length: 8}\ngrad_accum_steps: 2\n" + kLlamaLora,
        grpo + "grpo: {num_generations: 2, max_completion_length: 8, beta: 0.04}\nactivation_checkpointing: "
               "per_layer\n" + kNeoxLora}) {
    CAPTURE(extra);
    const bool neox = extra.find("query_key_value") != std::string::npos;
    const TrainConfig config = make_config(kFixtures + (neox ? "/gpt_neox_parallel" : "/llama_gqa"), extra);
    PlanOptions cpu;
    cpu.policy = MemoryPolicy::cpu;
    const StepPlan plan = plan_step(config, cpu, config.micro_batch_size, config.seq_len);
    TrackedCpu cpu_step;
    TrainingSetup setup = cpu_step.setup(config);
    check_grpo_plan(plan, grpo_step_peaks(config, setup, cpu_step.meter));
    CHECK(plan.phases[1].phase == (config.grpo.num_iterations > 1 ? "rollout log-probabilities"
                                   : config.grpo.beta > 0             ? "reference"
                                                                      : "checkpoint"));
  }
  // With a reward model (the fixture classifier's config, INT8 as the policy): its weights are a line of the
  // plan and its forward over the step's 4 completions a phase, in every mode of the table (a streamed base
  // streams the reward model's layers too). Its weights: per layer q, o 64 x 64, k, v 32 x 64, gate, up, down
  // 64 x 88 in INT8 with an f32 scale per row (432 rows), two f32 RMSNorms; f32 embed_tokens and lm_head
  // (320 x 64 each), the final norm and the score head.
  TrainConfig scored = make_config(kFixtures + "/llama_gqa", grpo + "grpo: {num_generations: 2, "
                                   "max_completion_length: 8}\n" + kLlamaLora);
  scored.rewards.model = kFixtures + "/reward/model";
  PlanOptions cpu;
  cpu.policy = MemoryPolicy::cpu;
  const StepPlan plan = plan_step(scored, cpu, 4, 24);
  REQUIRE(plan.phases.size() == 3);
  CHECK(plan.phases[1].phase == "reward");
  const size_t layer = 2 * 64 * 64 + 2 * 32 * 64 + 3 * 64 * 88 + 4 * 432 + 2 * 64 * 4;
  CHECK(plan.reward_model_bytes == 2 * layer + 2 * 320 * 64 * 4 + 64 * 4 + 64 * 4);
  CHECK(fit_modes(scored, PlanOptions{}).size() == 10);
}

// plan_ppo_step against a real PPO step on the CPU, phase by phase, on the
// tiny Llama and NeoX (the reward model: tests/fixtures/reward's Llama
// classifier config).
TEST_CASE("plan: a PPO step (rollout, values, reference, reward model, policy and value backward) plans to the byte") {
  const PpoPlan ppo{3, 12, 6, 2, 5, kFixtures + "/reward/model", ""};
  for (const std::string& extra : {kLlamaLora, kNeoxLora + "activation_checkpointing: per_layer\nloss_chunk_tokens: 8\n"}) {
    CAPTURE(extra);
    const bool neox = extra.find("query_key_value") != std::string::npos;
    const TrainConfig config = make_config(kFixtures + (neox ? "/gpt_neox_parallel" : "/llama_gqa"), extra);
    PlanOptions cpu;
    cpu.policy = MemoryPolicy::cpu;
    const StepPlan plan = plan_ppo_step(config, cpu, ppo);
    TrackedCpu cpu_step;
    TrainingSetup setup = cpu_step.setup(config, OutputHead::value);
    std::unique_ptr<CausalLM> reward = make_reward_model(config, ppo.reward_model, cpu_step.backend);
    fill_weights(*reward, cpu_step.backend);
    check_ppo_plan(plan, ppo_step_peaks(config, ppo, setup, *reward, cpu_step.meter));
    CHECK(setup.model->output_head().weight->grad.ptr<float>()[0] != 0.0f);  // the value head trained
  }
  const TrainConfig config = make_config(kFixtures + "/llama_gqa", kLlamaLora);
  CHECK_THROWS_WITH_AS(plan_ppo_step(config, PlanOptions{}, PpoPlan{1, 60, 8, 0, 0, "", ""}),
                       doctest::Contains("exceeds the model's max_position_embeddings (64)"), Error);
}

// One pipeline stage's share of 1F1B on a real CPU backend, as plan_pipeline
// replays it: stage.in_flight forwards (a stage after the first receives
// each input, a stage before the last each d(output), into a new tensor),
// their backwards oldest first, then AdamW. Returns the tracked peak.
size_t real_stage_peak(const TrainConfig& config, const StagePlan& stage) {
  const ModelConfig model_config = read_model_config(config.model + "/config.json");
  HostAllocator host;
  TrackingAllocator tracker(host), host_state(host);
  CpuBackend backend(tracker);
  TrainingSetup setup = setup_training(
      config, model_config, backend, [&](LanguageModel& model) { fill_weights(model, backend); }, &host_state,
      stage.layers);
  CausalLM& model = causal_lm(*setup.model, "real_stage_peak");
  const int64_t batch = config.micro_batch_size, seq = config.seq_len, C = model_config.hidden_size;
  Tensor ids = token_ids(batch, seq, model_config.vocab_size, host);
  Tensor values = Tensor::empty({batch, seq, C}, DType::f32, host, MemCategory::activations);
  for (int64_t i = 0; i < values.numel(); ++i) values.ptr<float>()[i] = 0.01f * float(i % 13);
  auto received = [&] {
    Tensor t = backend.empty({batch, seq, C}, DType::f32, MemCategory::activations);
    backend.copy(t, values);
    return t;
  };
  model.zero_grads();
  model.set_dropout_seed(config.seed);
  std::vector<std::unique_ptr<CausalLM::DecoderStep>> passes;
  for (int64_t k = 0; k < stage.in_flight; ++k) {
    Tensor output;
    float loss = 0.0f;
    passes.push_back(model.stage_forward(ids, ids, nullptr, model.first_stage() ? Tensor{} : received(), &output, 1.0f, &loss));
    CHECK(std::isfinite(loss));
  }
  for (std::unique_ptr<CausalLM::DecoderStep>& pass : passes) {
    model.stage_backward(*pass, model.last_stage() ? Tensor{} : received());
    pass.reset();
  }
  setup.optimizer->step(config.lr);
  return tracker.stats().total_peak_bytes;
}

// plan_pipeline on the CPU policy against real stages, stage by stage.
void check_pipeline_matches_real_stages(const std::string& model_dir, const std::string& extra_yaml, int64_t ranks) {
  CAPTURE(model_dir);
  CAPTURE(extra_yaml);
  const TrainConfig config = make_config(model_dir, "micro_batch_size: 2\nseq_len: 16\n" + extra_yaml);
  PlanOptions cpu;
  cpu.policy = MemoryPolicy::cpu;
  cpu.ranks = ranks;
  const PipelinePlan plan = plan_pipeline(config, cpu);
  REQUIRE(int64_t(plan.stages.size()) == config.parallel.pipeline);
  for (const StagePlan& stage : plan.stages) {
    CAPTURE(stage.layers.first_layer);
    CHECK(stage.step.peak_bytes == real_stage_peak(config, stage));
  }
}

// A model's layers run as two stages, the second taking the first's output
// and giving back d(input), compute what the whole model computes, to the
// bit: the loss and every adapter gradient (the same base weights copied by
// name; each stage initialises its adapters as the whole model does).
void check_stages_match_whole_model(const std::string& model_dir, const std::string& extra_yaml) {
  CAPTURE(model_dir);
  const TrainConfig config = make_config(model_dir, extra_yaml);
  const ModelConfig model_config = read_model_config(config.model + "/config.json");
  HostAllocator host;
  CpuBackend backend(host);
  TrainingSetup whole = setup_training(config, model_config, backend,
                                       [&](LanguageModel& model) { fill_weights(model, backend); });
  const int64_t middle = model_config.num_hidden_layers / 2;
  auto stage = [&](LayerRange layers) {
    TrainingSetup setup = setup_training(config, model_config, backend, [](LanguageModel&) {}, nullptr, layers);
    for (Parameter& p : setup.model->parameters()) {
      Parameter& from = whole.model->parameter(p.name);
      const std::vector<Tensor*> to = weight_tensors(p), source = weight_tensors(from);
      for (size_t i = 0; i < to.size(); ++i) backend.copy(*to[i], *source[i]);
      p.quantized.offset = from.quantized.offset;
    }
    for (Parameter& p : setup.model->adapters()) {
      const Tensor& expected = whole.model->parameter(p.name).value;
      CAPTURE(p.name);
      CHECK(std::memcmp(p.value.ptr<float>(), expected.ptr<float>(), size_t(expected.numel()) * 4) == 0);
    }
    setup.model->zero_grads();
    return setup;
  };
  TrainingSetup first = stage({0, middle}), last = stage({middle, model_config.num_hidden_layers});
  Tensor ids = token_ids(2, 16, model_config.vocab_size, host);
  whole.model->zero_grads();
  for (TrainingSetup* setup : {&whole, &first, &last}) setup->model->set_dropout_seed(config.seed);
  const float whole_loss = causal_lm(*whole.model, "whole").forward_backward(ids, ids, 1.0f);

  CausalLM& model0 = causal_lm(*first.model, "stage 0");
  CausalLM& model1 = causal_lm(*last.model, "stage 1");
  Tensor hidden, unused;
  float loss0 = 0.0f, loss1 = 0.0f;
  auto pass0 = model0.stage_forward(ids, ids, nullptr, Tensor{}, &hidden, 1.0f, &loss0);
  auto pass1 = model1.stage_forward(ids, ids, nullptr, std::move(hidden), &unused, 1.0f, &loss1);
  CHECK(loss0 == 0.0f);
  CHECK(loss1 == whole_loss);
  Tensor dhidden = model1.stage_backward(*pass1, Tensor{});
  CHECK(!model0.stage_backward(*pass0, std::move(dhidden)).defined());
  size_t compared = 0;
  for (TrainingSetup* setup : {&first, &last})
    for (Parameter& p : setup->model->adapters()) {
      const Tensor& expected = whole.model->parameter(p.name).grad;
      CAPTURE(p.name);
      REQUIRE(p.grad.numel() == expected.numel());
      CHECK(std::memcmp(p.grad.ptr<float>(), expected.ptr<float>(), size_t(expected.numel()) * 4) == 0);
      ++compared;
    }
  CHECK(compared == whole.model->adapters().size());
}

// Small Llama (GQA: 4 heads, 2 key/value heads) and GPT-NeoX models for the
// pipeline and tensor-parallel plans.
std::string llama_4_layers() {
  return write_model("llama_4_layers", R"({"model_type": "llama", "hidden_size": 64,
    "intermediate_size": 160, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 256, "max_position_embeddings": 64})");
}

std::string neox_5_layers() {
  return write_model("neox_5_layers", R"({"model_type": "gpt_neox", "hidden_size": 64,
    "intermediate_size": 256, "num_hidden_layers": 5, "num_attention_heads": 4, "vocab_size": 256,
    "max_position_embeddings": 64, "hidden_act": "gelu_fast"})");
}

TEST_CASE("plan: a pipeline stage's replayed peak equals a real CPU stage's share of 1F1B, to the byte") {
  const std::string llama = llama_4_layers(), neox = neox_5_layers();
  check_pipeline_matches_real_stages(llama, kLlamaLora + "parallel: {pipeline: 2}\n", 2);
  const std::string checkpointed = "activation_checkpointing: per_layer\n";
  check_pipeline_matches_real_stages(llama, kLlamaLora + checkpointed + "parallel: {pipeline: 4}\n", 8);
  check_pipeline_matches_real_stages(neox, kNeoxLora + checkpointed + "parallel: {pipeline: 3}\n", 3);
  check_pipeline_matches_real_stages(kFixtures + "/llama_tied", kLlamaLora + "parallel: {pipeline: 2}\n", 2);
}

TEST_CASE("pipeline stages compute what the whole model computes, to the bit") {
  check_stages_match_whole_model(kFixtures + "/llama_gqa", kLlamaLora);
  check_stages_match_whole_model(kFixtures + "/llama_gqa", kLlamaLora + "activation_checkpointing: per_layer\n");
  check_stages_match_whole_model(kFixtures + "/gpt_neox_parallel", kNeoxLora);
}

// ~106M parameters each (57M in int8 linears, 49M in the f32 embeddings and
// lm_head). int8 + LoRA at 32 tokens keeps each real step to a few seconds:
// the cost is per weight (quantising, packing, dequantising), not per token.
TEST_CASE("plan: ~100M-parameter Llama and NeoX configs plan to the byte") {
  const std::string llama = write_model("llama_100m", R"({"model_type": "llama", "hidden_size": 768,
    "intermediate_size": 2048, "num_hidden_layers": 8, "num_attention_heads": 12, "num_key_value_heads": 4,
    "vocab_size": 32000, "max_position_embeddings": 2048})");
  const std::string neox = write_model("neox_100m", R"({"model_type": "gpt_neox", "hidden_size": 768,
    "intermediate_size": 3072, "num_hidden_layers": 8, "num_attention_heads": 12, "vocab_size": 32000,
    "max_position_embeddings": 2048, "hidden_act": "gelu_fast"})");
  check_plan_matches_real_step(llama, kLlamaLora, 1, 32);
  check_plan_matches_real_step(neox, kNeoxLora, 1, 32);
}

TEST_CASE("plan: the caching model rounds and reuses as CachingAllocator") {
  CachingModelAllocator caching;
  caching.allocate(1000, MemCategory::activations);  // 512-byte classes up to 1 MiB
  CHECK(caching.in_use_bytes() == 1024);
  caching.deallocate(nullptr, 1000, MemCategory::activations);
  caching.allocate(600, MemCategory::activations);  // same class: the cached block
  CHECK(caching.reserved_bytes() == 1024);
  caching.allocate((size_t(3) << 20) + 1, MemCategory::activations);  // 1/8 of 2 MiB steps above 1 MiB
  CHECK(caching.in_use_bytes() == 1024 + (size_t(13) << 18));
  CHECK(caching.peak_in_use_bytes() == caching.in_use_bytes());
  // Long-lived tensors are not cached: 512-byte rounding, returned on release.
  const size_t reserved = caching.reserved_bytes();
  caching.allocate((size_t(108) << 20) + 1, MemCategory::weights);
  CHECK(caching.reserved_bytes() == reserved + (size_t(108) << 20) + 512);
  caching.deallocate(nullptr, (size_t(108) << 20) + 1, MemCategory::weights);
  CHECK(caching.reserved_bytes() == reserved);
}

TEST_CASE("plan: bad model_type or LoRA target is a clear error") {
  const std::string bad = write_model("bad_type", R"({"model_type": "bert", "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100})");
  PlanOptions options;
  CHECK_THROWS_WITH_AS(plan_step(make_config(bad, ""), options, 1, 16), doctest::Contains("not supported"), Error);
  CHECK_THROWS_WITH_AS(plan_step(make_config(kFixtures + "/gpt_neox_parallel", "lora: {target_modules: [q_proj]}\n"),
                               options, 1, 16),
                       doctest::Contains("lora.target_modules [q_proj] leaves no module of this gpt_neox model"),
                       Error);

  // Through the binary: the message reaches the user with exit status 1.
  const PlanRun run = run_plan(std::string(FT_SOURCE_DIR) +
                               "/configs/gpt-neox-20b-int8-lora.yaml --set lora.target_modules=[q_proj]");
  CHECK(run.exit_status == 1);
  CHECK(run.output.find("error: lora.target_modules [q_proj] leaves no module of this gpt_neox model") !=
        std::string::npos);
  // One name that matches nothing beside one that does: PEFT skips it, a run's config refuses it.
  const PlanRun typo = run_plan(std::string(FT_SOURCE_DIR) +
                                "/configs/gpt-neox-20b-int8-lora.yaml --set lora.target_modules=[query_key_value,q_proj]");
  CHECK(typo.exit_status == 1);
  CHECK(typo.output.find("error: lora.target_modules: \"q_proj\" matches no module of this gpt_neox model (its "
                         "linear modules are query_key_value, dense, dense_h_to_4h, dense_4h_to_h)") != std::string::npos);
  const PlanRun missing = run_plan(std::string(FT_SOURCE_DIR) + "/configs/nothing/config.json");
  CHECK(missing.exit_status == 1);
  CHECK(missing.output.find("nothing/config.json") != std::string::npos);
  // A streamed base keeps fewer layers resident than the model has.
  const PlanRun all_resident = run_plan(std::string(FT_SOURCE_DIR) +
                                        "/configs/llama-2-70b-nf4-lora-24gb.yaml --set offload.resident_layers=80");
  CHECK(all_resident.exit_status == 1);
  CHECK(all_resident.output.find("llama-2-70b-nf4-lora-24gb.yaml: offload.resident_layers must be below the model's "
                                 "num_hidden_layers (80) with offload.base: host, got 80") != std::string::npos);
  const PlanRun bad_tflops = run_plan(std::string(FT_SOURCE_DIR) + "/configs/llama-2-70b-nf4-lora-24gb.yaml --tflops 0");
  CHECK(bad_tflops.exit_status == 1);
  CHECK(bad_tflops.output.find("--tflops: expected a number in (0, 1e6], got \"0\"") != std::string::npos);
}

TEST_CASE("plan: GPT-NeoX-20B int8 + LoRA at seq 2048, micro_batch 1 (CUDA policy)") {
  const TrainConfig config = load_train_config(std::string(FT_SOURCE_DIR) + "/configs/gpt-neox-20b-int8-lora.yaml");
  const StepPlan plan = plan_step(config, PlanOptions{}, config.micro_batch_size, config.seq_len);
  MESSAGE("20B plan: ", plan.total_bytes(), " bytes (", double(plan.total_bytes()) / double(1ull << 30),
          " GiB incl. context reserve), peak at ", plan.where);
  // The 24 GB card's budget for the step: 22.5 GiB at seq_len 2048, micro_batch 1, context reserve included.
  CHECK(plan.peak_bytes + plan.context_bytes <= size_t(45) << 29);
  // The whole run (its evaluation, and generating from a 2048-token prompt with its key/value cache) fits the card.
  CHECK(plan.run_peak_phase() == "generation");
  CHECK(plan.total_bytes() <= size_t(24) << 30);
  // Frozen weights alone: 44 x 12 x 6144^2 int8 bytes = 18.6 GiB.
  CHECK(plan.quantized_weight_bytes == size_t(44) * 12 * 6144 * 6144);
  // trl's recipe: 44 x 16 x (6144 + 18432) = 17,301,504 trainable f32 adapters.
  CHECK(plan.at_peak.current(MemCategory::adapters) == size_t(17301504) * 4);
}

// docs/memory.md's data-parallel line: the same 20B run on 8 GPUs. Each rank's
// peak is the single-GPU plan; the 17,301,504 f32 adapter gradients are
// all-reduced each optimizer step, and a ring sends 2 x 7/8 of them per rank.
TEST_CASE("plan: GPT-NeoX-20B int8 + LoRA data parallel on 8 GPUs all-reduces the adapter gradients only") {
  const TrainConfig config = load_train_config(std::string(FT_SOURCE_DIR) + "/configs/gpt-neox-20b-int8-lora.yaml");
  const StepPlan plan = plan_step(config, PlanOptions{}, config.micro_batch_size, config.seq_len);
  const AllReducePlan all_reduce = plan_all_reduce(plan, 8);
  CHECK(all_reduce.gradient_bytes == size_t(17301504) * 4);  // 69,206,016: 66.0 MiB
  CHECK(all_reduce.ring_sent_per_rank_bytes == size_t(17301504) * 4 * 14 / 8);  // 121,110,528: 115.5 MiB
  CHECK(plan_all_reduce(plan, 1).ring_sent_per_rank_bytes == 0);
}

// trl's "20B on a 24 GB GPU" as PPO: GPT-NeoX-20B INT8 + LoRA r16 on
// query_key_value (configs/gpt-neox-20b-int8-lora.yaml: bf16, per-layer
// checkpointing, 256-token loss chunks), its reference the same weights with
// the adapters disabled, the value head trained beside them. A PPO batch of
// 8 rollouts of 256 prompt + 64 response tokens, scored by the reward model
// in one forward, generated and trained 4 at a time (trl's generate() batch
// and a mini_batch_size of 4). The reward model is a second model on the
// device, built with the policy's options: a second INT8 20B base
// (GPTNeoXForSequenceClassification) does not fit beside the policy, so it
// is Pythia-1B's architecture as an INT8 classifier (configs/pythia-1b).
TEST_CASE("plan: a PPO step on GPT-NeoX-20B INT8 + LoRA with a 1B reward model fits 24 GiB (CUDA policy)") {
  const TrainConfig config = load_train_config(std::string(FT_SOURCE_DIR) + "/configs/gpt-neox-20b-int8-lora.yaml");
  PpoPlan ppo{4, 256, 64, 4, 8, std::string(FT_SOURCE_DIR) + "/configs/pythia-1b", ""};
  const StepPlan plan = plan_ppo_step(config, PlanOptions{}, ppo);
  MESSAGE("20B PPO: policy and value step ", plan.peak_bytes + plan.context_bytes, " bytes, peak at ", plan.where,
          "; reward model weights ", plan.reward_model_bytes);
  for (const StepPlan::PhasePeak& phase : plan.phases)
    MESSAGE("20B PPO ", phase.phase, ": ", phase.peak_bytes + plan.context_bytes, " bytes");
  MESSAGE("20B PPO run peak ", plan.total_bytes(), " bytes (", double(plan.total_bytes()) / double(1ull << 30),
          " GiB incl. context reserve), in ", plan.run_peak_phase());
  // Pythia-1B: 16 x 12 x 2048^2 INT8 linear weights and their f32 row scales (6144 + 2048 + 8192 + 2048 rows a
  // layer); bf16 embed_in and embed_out (50304 x 2048 each), linear biases, two LayerNorms a layer, the final
  // one, and the score head (2048).
  const size_t rows_per_layer = 6144 + 2048 + 8192 + 2048;
  CHECK(plan.reward_model_bytes == 16 * (12 * size_t(2048) * 2048 + 4 * rows_per_layer) +
                                       2 * (2 * size_t(50304) * 2048 + 16 * (rows_per_layer + 4 * 2048) + 2 * 2048 +
                                            2048));
  CHECK(plan.reward_model_bytes == 1219440640);
  // The run's phases, context reserve included: the rollout (4 rows' 44-layer key/value cache, 1.3 GiB, and the
  // prompts' forward), the rollout's values and the reference (eval forwards, 4 x 319 tokens), the reward model
  // over the batch of 8 (eval, no LM head), the checkpoint (the state copied to host memory).
  const std::vector<std::pair<std::string, size_t>> phases = {{"rollout", 25198452224},
                                                              {"rollout values", 24557138944},
                                                              {"reference", 24557138944},
                                                              {"reward", 23924550656},
                                                              {"checkpoint", 23522773504}};
  REQUIRE(plan.phases.size() == phases.size());
  for (size_t i = 0; i < phases.size(); ++i) {
    CHECK(plan.phases[i].phase == phases[i].first);
    CHECK(plan.phases[i].peak_bytes + plan.context_bytes == phases[i].second);
  }
  CHECK(plan.peak_bytes + plan.context_bytes == 24633588224);  // the policy and value step: 22.94 GiB
  CHECK(plan.run_peak_phase() == "rollout");
  CHECK(plan.total_bytes() <= size_t(24) << 30);
  // The same step from the config's objective: ppo (what `finetune plan` plans): micro_batch_size rows generated
  // and scored at once, queries of seq_len - ppo.max_new_tokens tokens.
  const std::string pythia = std::string(FT_SOURCE_DIR) + "/configs/pythia-1b";
  const TrainConfig ppo_config = load_train_config(
      std::string(FT_SOURCE_DIR) + "/configs/gpt-neox-20b-int8-lora.yaml",
      {"objective=ppo", "grad_accum_steps=1", "micro_batch_size=4", "seq_len=320", "ppo.max_new_tokens=64",
       "ppo.batch_size=8", "ppo.mini_batch_size=4", "rewards.model=" + pythia});
  const StepPlan from_config = plan_step(ppo_config, PlanOptions{}, ppo_config.micro_batch_size, ppo_config.seq_len);
  CHECK(from_config.peak_bytes == plan.peak_bytes);
  CHECK(from_config.total_bytes() == plan.total_bytes());

  // Generating 8 rows at once: their key/value cache (44 layers x 8 x 320 x
  // 6144 x 2 x 2 bytes, 2.6 GiB) takes the rollout past the card.
  PpoPlan eight = ppo;
  eight.rows = 8;
  const StepPlan eight_rows = plan_ppo_step(config, PlanOptions{}, eight);
  MESSAGE("20B PPO generating 8 rows at once: ", eight_rows.total_bytes(), " bytes, in ", eight_rows.run_peak_phase());
  CHECK(eight_rows.run_peak_phase() == "rollout");
  CHECK(eight_rows.total_bytes() > size_t(24) << 30);

  // A second 20B base as the reward model: its weights alone take 19.7 GiB
  // (21,187,547,136 bytes), and the step then needs 42.4 GiB: not even a
  // 40 GiB card holds it.
  ppo.reward_model = std::string(FT_SOURCE_DIR) + "/configs/gpt-neox-20b";
  const StepPlan twice = plan_ppo_step(config, PlanOptions{}, ppo);
  MESSAGE("20B PPO with a 20B reward model: ", twice.total_bytes(), " bytes, reward model weights ",
          twice.reward_model_bytes);
  CHECK(twice.reward_model_bytes == 21187547136);
  CHECK(twice.total_bytes() == 45551122432);
}

// ZeRO-1: Llama-2-7B fully fine-tuned (bf16 weights, AdamW's f32 m, v and
// masters: 12 bytes per parameter) on 4 data-parallel ranks. Sharded, rank 0
// holds the state of the parameters that start in the first quarter of the
// elements: a quarter, give or take the largest tensor (the 32000 x 4096
// embedding); nothing else of its peak changes.
TEST_CASE("plan: parallel.shard_optimizer leaves each of 4 data-parallel ranks a quarter of AdamW's state") {
  TrainConfig config = load_train_config(std::string(FT_SOURCE_DIR) + "/configs/llama-2-7b-int8-lora.yaml");
  config.trainable = Trainable::all;
  config.quantization.mode = QuantizedBase::none;
  PlanOptions options;
  options.ranks = 4;
  const StepPlan whole = plan_step(config, options, config.micro_batch_size, config.seq_len);
  config.parallel.shard_optimizer = true;
  const StepPlan share = plan_step(config, options, config.micro_batch_size, config.seq_len);
  const size_t whole_bytes = whole.at_peak.current(MemCategory::optimizer);
  const size_t share_bytes = share.at_peak.current(MemCategory::optimizer);
  const size_t largest_bytes = size_t(32000) * 4096 * 12;
  MESSAGE("Llama-2-7B full fine-tuning, AdamW state ", whole_bytes, " bytes; rank 0's share of 4: ", share_bytes);
  CHECK(whole_bytes == size_t(6738415616) * 12);
  CHECK(share_bytes + largest_bytes >= whole_bytes / 4);
  CHECK(share_bytes <= whole_bytes / 4 + largest_bytes);
  CHECK(whole.total_bytes() - share.total_bytes() == whole_bytes - share_bytes);
}

// docs/memory.md's pipeline table ("Pipeline stages"): Llama-2-70B's 69 GB of int8 weights over four
// 24 GiB cards, a stage each. Stage s holds 4 - s micro-batches' layer inputs
// (32 MiB per layer each at seq 2048); the split trades stage 0's extra
// activations against the last stage's LM head.
TEST_CASE("plan: Llama-2-70B INT8 + LoRA as a 4-stage pipeline fits every stage in 24 GiB (CUDA policy)") {
  const TrainConfig config =
      load_train_config(std::string(FT_SOURCE_DIR) + "/configs/llama-2-70b-int8-lora-4x24gb-pipeline.yaml");
  PlanOptions options;
  options.ranks = 4;
  const PipelinePlan plan = plan_pipeline(config, options);
  CHECK(plan.data == 1);
  CHECK(plan.micro_batches == 32);
  CHECK(plan.bubble_fraction == 3.0 / 35.0);
  REQUIRE(plan.stages.size() == 4);
  const int64_t first_layers[] = {0, 19, 39, 60, 80};
  const size_t peaks[] = {21367922688, 21169299456, 21427855360, 20351385600};
  const size_t q = size_t(8192) * 8192, kv = size_t(1024) * 8192, mlp = size_t(8192) * 28672;
  for (size_t s = 0; s < 4; ++s) {
    const StagePlan& stage = plan.stages[s];
    CAPTURE(s);
    MESSAGE("70B stage ", s, ": layers ", stage.layers.first_layer, "-", stage.layers.end_layer - 1, ", peak ",
            stage.step.total_bytes(), " bytes, at ", stage.step.where);
    CHECK(stage.layers.first_layer == first_layers[s]);
    CHECK(stage.layers.end_layer == first_layers[s + 1]);
    CHECK(stage.in_flight == 4 - int64_t(s));
    const size_t layers = size_t(stage.layers.end_layer - stage.layers.first_layer);
    CHECK(stage.step.quantized_weight_bytes == layers * (2 * q + 2 * kv + 3 * mlp));
    // r = 16 on q_proj (8192 + 8192) and v_proj (8192 + 1024), f32.
    CHECK(stage.step.at_peak.current(MemCategory::adapters) == layers * 16 * (8192 + 8192 + 8192 + 1024) * 4);
    CHECK(stage.step.total_bytes() == peaks[s]);
    CHECK(stage.step.total_bytes() <= size_t(24) << 30);
  }
  // Whole, the step needs 69.5 GiB: no one card holds it.
  CHECK(plan_step(config, options, 1, 2048).total_bytes() > size_t(48) << 30);

  // Through the binary, on 8 ranks: two data-parallel copies of the pipeline,
  // each stage all-reducing its adapter gradients with its peer.
  const PlanRun run = run_plan(std::string(FT_SOURCE_DIR) +
                               "/configs/llama-2-70b-int8-lora-4x24gb-pipeline.yaml --gpu-mem 24GiB --ranks 8");
  CHECK(run.exit_status == 0);
  CHECK(run.output.find("pipeline parallel: 4 stages x 2 data parallel (8 ranks), 1F1B over 32 micro-batches") !=
        std::string::npos);
  CHECK(run.output.find("= 3 / 35 = 8.6% of the step") != std::string::npos);
  CHECK(run.output.find("0-18 + embedding") != std::string::npos);
  CHECK(run.output.find("60-79 + final norm, lm_head, loss") != std::string::npos);
  CHECK(run.output.find(" 21367922688   yes") != std::string::npos);
  CHECK(run.output.find("stage 3: per optimizer step") != std::string::npos);
  CHECK(run.output.find("all-reduced over 2 data-parallel ranks") != std::string::npos);
}

// One tensor-parallel rank's training step on a real CPU backend, all ranks
// in threads of this process (tests/thread_group.h), as replay_step replays
// rank 0's: the step's micro-batch, then AdamW. Returns rank 0's tracked peak.
size_t real_tensor_rank_peak(const TrainConfig& config) {
  const ModelConfig model_config = read_model_config(config.model + "/config.json");
  const int64_t ranks = config.parallel.tensor;
  testing::ThreadGroup group(ranks);
  std::vector<size_t> peaks(static_cast<size_t>(ranks));
  std::vector<float> losses(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int64_t rank = 0; rank < ranks; ++rank)
    threads.emplace_back([&, rank] {  // no doctest assertion in a thread: their results are checked after
      testing::ThreadGroup::Member member(group, rank);
      HostAllocator host;
      TrackingAllocator tracker(host), host_state(host);
      CpuBackend backend(tracker);
      TrainingSetup setup = setup_training(
          config, model_config, backend, [&](LanguageModel& model) { fill_weights(model, backend); }, &host_state,
          {}, {}, std::nullopt, &member);
      const int64_t batch = config.micro_batch_size, seq = config.seq_len;
      Tensor ids = token_ids(batch, seq, model_config.vocab_size, host);
      setup.model->zero_grads();
      setup.model->set_dropout_seed(config.seed);
      losses[size_t(rank)] = setup.model->forward_backward(ids, ids, 1.0f);
      setup.optimizer->step(config.lr);
      peaks[size_t(rank)] = tracker.stats().total_peak_bytes;
    });
  for (std::thread& t : threads) t.join();
  for (float loss : losses) CHECK(std::isfinite(loss));
  return peaks[0];
}

TEST_CASE("plan: a tensor-parallel rank's replayed peak equals a real CPU rank's, to the byte") {
  // At tensor 4 each of the Llama's 2 key/value heads is on 2 ranks.
  const std::string llama = llama_4_layers(), neox = neox_5_layers();
  const std::string shape = "micro_batch_size: 2\nseq_len: 16\n";
  const std::string all_linear = "lora: {r: 4, lora_alpha: 8, lora_dropout: 0.1, target_modules: all-linear}\n";
  // bf16: the sums go through f32 copies of the activations, allocated with them.
  const std::pair<std::string, Precision> cases[] = {
      {kLlamaLora + "parallel: {tensor: 2}\n", Precision::fp32},
      {all_linear + "parallel: {tensor: 2}\n", Precision::bf16},
      {all_linear + "activation_checkpointing: per_layer\nparallel: {tensor: 4}\n", Precision::fp32}};
  for (const auto& entry : cases) {
    const std::string& extra = entry.first;
    CAPTURE(extra);
    TrainConfig config = make_config(llama, shape + extra);
    config.precision = entry.second;
    PlanOptions cpu;
    cpu.policy = MemoryPolicy::cpu;
    cpu.ranks = config.parallel.tensor;
    CHECK(plan_step(config, cpu, 2, 16).peak_bytes == real_tensor_rank_peak(config));
  }
  const TrainConfig config = make_config(neox, shape + kNeoxLora + "parallel: {tensor: 2}\n");
  PlanOptions cpu;
  cpu.policy = MemoryPolicy::cpu;
  cpu.ranks = 2;
  CHECK(plan_step(config, cpu, 2, 16).peak_bytes == real_tensor_rank_peak(config));
}

// docs/parallel.md's tensor-parallel figures: Llama-2-70B INT8 + LoRA with
// every layer split over four 24 GiB cards, NeoX-20B over two 12 GiB ones.
// The embedding and lm_head stay whole on every rank (docs/parallel.md says why).
TEST_CASE("plan: Llama-2-70B INT8 + LoRA with parallel.tensor 4 fits each rank in 24 GiB (CUDA policy)") {
  const TrainConfig config =
      load_train_config(std::string(FT_SOURCE_DIR) + "/configs/llama-2-70b-int8-lora-4x24gb-tensor.yaml");
  PlanOptions options;
  options.ranks = 4;
  const StepPlan plan = plan_step(config, options, 1, 2048);
  MESSAGE("70B, tensor 4: rank 0's peak ", plan.total_bytes(), " bytes, at ", plan.where);
  const size_t C = 8192, q = C * C, kv = size_t(1024) * C, mlp = C * 28672, N = 2048;
  // A quarter of every decoder linear: 69 GB of int8 codes over four cards.
  CHECK(plan.quantized_weight_bytes == 80 * (2 * q + 2 * kv + 3 * mlp) / 4);
  // r = 16: q_proj's A whole [16, 8192] and B a quarter [2048, 16]; v_proj's A whole, B [256, 16]; f32.
  CHECK(plan.at_peak.current(MemCategory::adapters) == 80 * 16 * (C + 2048 + C + 256) * 4);
  CHECK(plan.total_bytes() == 22560997376);
  CHECK(plan.total_bytes() <= size_t(24) << 30);
  // Per layer and micro-batch, [2048, 8192] f32 sums: o_proj's and
  // down_proj's outputs, o_proj's again in the recomputation, and the two
  // input gradients (all but layer 0's attention one: nothing reads it).
  CHECK(plan.tensor_sum_bytes == (5 * 80 - 1) * N * C * 4);
  // The partial gradients: the A of q_proj and v_proj.
  CHECK(plan.tensor_gradient_bytes == 80 * 2 * 16 * C * 4);

  const PlanRun run = run_plan(std::string(FT_SOURCE_DIR) +
                               "/configs/llama-2-70b-int8-lora-4x24gb-tensor.yaml --gpu-mem 24GiB --ranks 8");
  CHECK(run.exit_status == 0);
  CHECK(run.output.find("tensor parallel: every layer split over 4 ranks x 2 data parallel (8 ranks)") !=
        std::string::npos);
  CHECK(run.output.find("all-reduced over 2 data-parallel ranks") != std::string::npos);
  CHECK(run.output.find("fits in 24.0 GiB: yes") != std::string::npos);
  // Beside a pipeline: 4 stages, each over 2 tensor ranks, on 8 cards of 12 GiB.
  const PlanRun staged = run_plan(std::string(FT_SOURCE_DIR) +
                                  "/configs/llama-2-70b-int8-lora-4x24gb-pipeline.yaml --gpu-mem 12GiB --ranks 8 "
                                  "--set parallel.tensor=2");
  CHECK(staged.exit_status == 0);
  CHECK(staged.output.find("pipeline parallel: 4 stages x 2 tensor parallel x 1 data parallel (8 ranks)") !=
        std::string::npos);
  CHECK(staged.output.find("  1     18-38 ") != std::string::npos);
  // Stage 1's 21 layers, 5 sums of [2048, 8192] f32 each: 7,046,430,720 bytes.
  CHECK(staged.output.find("stage 1: per micro-batch 6.6 GiB of activations and their gradients summed over its 2 "
                           "tensor ranks") != std::string::npos);
  CHECK(staged.output.find("   NO") == std::string::npos);  // every stage fits 12 GiB
  const PlanRun odd = run_plan(std::string(FT_SOURCE_DIR) +
                               "/configs/llama-2-70b-int8-lora-4x24gb-tensor.yaml --ranks 6");
  CHECK(odd.exit_status == 1);
  CHECK(odd.output.find("parallel.pipeline 1 x parallel.tensor 4 must divide the job's 6 ranks (--ranks 6)") !=
        std::string::npos);
  const PlanRun heads = run_plan(std::string(FT_SOURCE_DIR) +
                                 "/configs/llama-2-70b-int8-lora-4x24gb-tensor.yaml --ranks 3 --set parallel.tensor=3");
  CHECK(heads.exit_status == 1);
  CHECK(heads.output.find("tensor.yaml: parallel.tensor: 3: the ranks must divide num_attention_heads (64) and "
                          "intermediate_size (28672), and divide or be a multiple of num_key_value_heads (8)") !=
        std::string::npos);
}

TEST_CASE("plan: NeoX-20B INT8 + LoRA with parallel.tensor 2 fits each rank in 12 GiB (CUDA policy)") {
  TrainConfig config = load_train_config(std::string(FT_SOURCE_DIR) + "/configs/gpt-neox-20b-int8-lora.yaml");
  config.parallel.tensor = 2;
  PlanOptions options;
  options.ranks = 2;
  const size_t C = 6144;
  // Half of every layer's 12 C^2 int8 codes (query_key_value 3 C^2, dense C^2, the MLP 8 C^2).
  const StepPlan plan = plan_step(config, options, 1, 512);
  CHECK(plan.quantized_weight_bytes == 44 * 12 * C * C / 2);
  MESSAGE("NeoX-20B, tensor 2, seq_len 512: rank 0's peak ", plan.total_bytes(), " bytes");
  CHECK(plan.total_bytes() <= size_t(12) << 30);
  // seq_len 1024 does not fit: the whole embedding and embed_out (1.2 GiB
  // in bf16) and the context reserve leave too little for its activations.
  CHECK(plan_step(config, options, 1, 1024).total_bytes() > size_t(12) << 30);
  // One process needs twice the codes: no 12 GiB card holds it.
  config.parallel.tensor = 1;
  options.ranks = 1;
  CHECK(plan_step(config, options, 1, 512).total_bytes() > size_t(20) << 30);
}

TEST_CASE("plan: a pipeline layout the model or the ranks cannot take is one clear error") {
  const std::string yaml = std::string(FT_SOURCE_DIR) + "/configs/llama-2-70b-int8-lora-4x24gb-pipeline.yaml";
  const PlanRun ranks = run_plan(yaml + " --ranks 6");
  CHECK(ranks.exit_status == 1);
  CHECK(ranks.output.find("parallel.pipeline 4 must divide the job's 6 ranks (--ranks 6)") != std::string::npos);
  const PlanRun data = run_plan(yaml + " --ranks 4 --set parallel.data=2");
  CHECK(data.exit_status == 1);
  CHECK(data.output.find("parallel.data 2 x parallel.pipeline 4 must equal the job's 4 ranks (--ranks 4)") !=
        std::string::npos);
  const PlanRun stages = run_plan(kFixtures + "/llama_gqa --ranks 4 --set parallel.pipeline=4");
  CHECK(stages.exit_status == 1);
  CHECK(stages.output.find("parallel.pipeline: 4 stages need at least one decoder layer each; the model has 2") !=
        std::string::npos);
  const PlanRun t5 = run_plan(std::string(FT_SOURCE_DIR) +
                              "/configs/flan-t5-base-dialogsum-lora.yaml --ranks 2 --set parallel.pipeline=2");
  CHECK(t5.exit_status == 1);
  CHECK(t5.output.find("parallel.pipeline: 2: pipeline stages split a decoder-only model's layers") !=
        std::string::npos);
}

// offload.optimizer: host: the device keeps bf16 adapters (2 B) and f32
// gradients (4 B); m, v and the f32 masters (12 B) are in host memory.
static void check_offloaded_adapter_state(const StepPlan& plan, size_t adapters) {
  const MemoryStats& s = plan.at_peak;
  CHECK(s.current(MemCategory::adapters) == adapters * 2);
  CHECK(s.current(MemCategory::gradients) == adapters * 4);
  CHECK(s.current(MemCategory::optimizer) == 0);
  CHECK(plan.host_optimizer_bytes == adapters * 12);
}

TEST_CASE("plan: LLaMA-33B NF4 + LoRA r=64 on all linear layers at seq 2048 (CUDA policy)") {
  const TrainConfig config = load_train_config(std::string(FT_SOURCE_DIR) + "/configs/llama-33b-nf4-lora.yaml");
  const StepPlan plan = plan_step(config, PlanOptions{}, config.micro_batch_size, config.seq_len);
  MESSAGE("33B NF4 plan: ", plan.total_bytes(), " bytes (", double(plan.total_bytes()) / double(1ull << 30),
          " GiB incl. context reserve), peak at ", plan.where);
  // Per layer 4 x 6656^2 + 3 x 6656 x 17920 linear weights, 60 layers.
  const size_t linear_params = size_t(60) * (4 * 6656 * 6656 + 3 * size_t(6656) * 17920);
  // 4 bits each; absmax double-quantised: 1 byte per 64, an f32 per 256 blocks, two 256-entry maps per weight.
  CHECK(plan.quantized_weight_bytes == linear_params / 2);
  const size_t blocks_per_layer = 4 * (6656 * 6656 / 64) + 3 * (6656 * 17920 / 64);
  const size_t nested_per_layer = 4 * ((6656 * 6656 / 64 + 255) / 256) + 3 * ((6656 * 17920 / 64 + 255) / 256);
  CHECK(plan.quantized_constant_bytes == 60 * (blocks_per_layer + 4 * nested_per_layer + 7 * 256 * 4));
  // QLoRA's recipe: r = 64 on q, k, v, o (6656 + 6656 each) and gate, up, down (6656 + 17920 each).
  const size_t adapters = size_t(60) * 64 * (4 * (6656 + 6656) + 3 * (6656 + 17920));
  CHECK(adapters == 487587840);
  check_offloaded_adapter_state(plan, adapters);
  // The 24 GiB card's budget for the step: 22.5 GiB at seq 2048, micro_batch 1, context reserve included;
  // the whole run, generating from a 2048-token prompt (its 60-layer key/value cache 3.1 GiB), fits the card.
  CHECK(plan.peak_bytes + plan.context_bytes <= size_t(45) << 29);
  CHECK(plan.peak_bytes + plan.context_bytes == 23568419840);
  CHECK(plan.total_bytes() <= size_t(24) << 30);
}

TEST_CASE("plan: Llama-2-70B NF4 + LoRA r=64 on all linear layers at seq 2048 on a 48 GiB card (CUDA policy)") {
  const TrainConfig config = load_train_config(std::string(FT_SOURCE_DIR) + "/configs/llama-2-70b-nf4-lora.yaml");
  const StepPlan plan = plan_step(config, PlanOptions{}, config.micro_batch_size, config.seq_len);
  MESSAGE("70B NF4 plan: ", plan.total_bytes(), " bytes (", double(plan.total_bytes()) / double(1ull << 30),
          " GiB incl. context reserve), peak at ", plan.where);
  // Per layer q, o [8192, 8192], k, v [1024, 8192] (8 KV heads of 128), gate, up, down 8192 x 28672; 80 layers.
  const size_t q = size_t(8192) * 8192, kv = size_t(1024) * 8192, mlp = size_t(8192) * 28672;
  CHECK(plan.quantized_weight_bytes == 80 * (2 * q + 2 * kv + 3 * mlp) / 2);
  auto blocks = [](size_t weights) { return weights / 64; };
  auto nested = [](size_t weights) { return (weights / 64 + 255) / 256; };
  const size_t absmax_per_layer = 2 * blocks(q) + 2 * blocks(kv) + 3 * blocks(mlp) +
                                  4 * (2 * nested(q) + 2 * nested(kv) + 3 * nested(mlp)) + 7 * 256 * 4;
  CHECK(plan.quantized_constant_bytes == 80 * absmax_per_layer);
  // r = 64 on q, o (8192 + 8192), k, v (8192 + 1024) and gate, up, down (8192 + 28672).
  const size_t adapters = size_t(80) * 64 * (2 * (8192 + 8192) + 2 * (8192 + 1024) + 3 * (8192 + 28672));
  CHECK(adapters == 828375040);
  check_offloaded_adapter_state(plan, adapters);
  // A 48 GB card's budget, with the 24 GiB card's margin: 45 GiB, context reserve included.
  CHECK(plan.total_bytes() <= size_t(45) << 30);
  CHECK(plan.total_bytes() == 45872889856);
}

// offload.base: host on a 24 GiB card: the NF4 tensors of layers 0-51 in
// pinned host memory, the last 28 resident (the most the 22.5 GiB budget
// holds, as the planner finds them), two device slots for the streamed ones.
TEST_CASE("plan: Llama-2-70B NF4 + LoRA r=64 streamed from host memory fits a 24 GiB card (CUDA policy)") {
  const TrainConfig config =
      load_train_config(std::string(FT_SOURCE_DIR) + "/configs/llama-2-70b-nf4-lora-24gb.yaml");
  const StepPlan plan = plan_step(config, PlanOptions{}, config.micro_batch_size, config.seq_len);
  const StreamPlan& stream = plan.stream;
  MESSAGE("70B NF4 streamed plan: ", plan.total_bytes(), " bytes (", double(plan.total_bytes()) / double(1ull << 30),
          " GiB incl. context reserve), peak at ", plan.where, "; host ", stream.host_bytes + plan.host_optimizer_bytes,
          " bytes; PCIe ", stream.pcie_bytes, " bytes per micro-batch");
  PlanOptions budget;
  budget.gpu_mem_bytes = size_t(45) << 29;
  CHECK(fit_resident_layers(config, budget, config.micro_batch_size, config.seq_len) == 28);
  CHECK(config.resident_layers == 28);
  // One layer's NF4 codes and double-quantised absmax, as in the 48 GiB plan above.
  const size_t q = size_t(8192) * 8192, kv = size_t(1024) * 8192, mlp = size_t(8192) * 28672;
  auto blocks = [](size_t weights) { return weights / 64; };
  auto nested = [](size_t weights) { return (weights / 64 + 255) / 256; };
  const size_t codes = (2 * q + 2 * kv + 3 * mlp) / 2;
  const size_t absmax = 2 * blocks(q) + 2 * blocks(kv) + 3 * blocks(mlp) +
                        4 * (2 * nested(q) + 2 * nested(kv) + 3 * nested(mlp)) + 7 * 256 * 4;
  const size_t layer = codes + absmax;
  CHECK(layer == 441404416);
  CHECK(plan.quantized_weight_bytes + plan.quantized_constant_bytes == 28 * layer);
  CHECK(stream.streamed_layers == 52);
  CHECK(stream.slots == 2);
  CHECK(stream.layer_bytes == layer);
  CHECK(stream.host_bytes == 52 * layer);
  // A slot holds each of a layer's 28 tensors at a 256-byte offset (every
  // size here is a multiple of 256 already).
  CHECK(stream.ring_bytes == 2 * layer);
  // Per micro-batch, once the ring is warm: every streamed layer but the two
  // the ring keeps from the last pass, forward and backward.
  CHECK(stream.pcie_bytes == 2 * (52 - 2) * layer);
  const size_t adapters = size_t(80) * 64 * (2 * (8192 + 8192) + 2 * (8192 + 1024) + 3 * (8192 + 28672));
  check_offloaded_adapter_state(plan, adapters);
  // The 24 GiB card's budget: 22.5 GiB, context reserve included; the host
  // holds the streamed layers and AdamW's state.
  CHECK(plan.total_bytes() <= size_t(45) << 29);
  CHECK(plan.total_bytes() == 23802669056);
  CHECK(stream.host_bytes + plan.host_optimizer_bytes == 32893530112);

  // The time model: at 25 GB/s a layer's copy (17.7 ms) hides behind the
  // previous layer's forward (36.2 ms at 100 TFLOP/s); at 8 GB/s each of the
  // forward's 50 copies stalls by the difference, the backward's still hide.
  CHECK(stream.copy_s == double(layer) / 25e9);
  CHECK(stream.forward_s < stream.backward_s);
  CHECK(stream.copy_s < stream.forward_s);
  CHECK(stream.stall_s == 0.0);
  PlanOptions slow;
  slow.h2d_bytes_per_s = 8e9;
  const StreamPlan slow_stream = plan_step(config, slow, config.micro_batch_size, config.seq_len).stream;
  CHECK(slow_stream.copy_s > slow_stream.forward_s);
  CHECK(slow_stream.copy_s < slow_stream.backward_s);
  CHECK(slow_stream.stall_s == doctest::Approx(50 * (slow_stream.copy_s - slow_stream.forward_s)).epsilon(1e-12));
  MESSAGE("at 8 GB/s the copies stall ", slow_stream.stall_s, " s of ", slow_stream.compute_s + slow_stream.stall_s,
          " s (", 100 * slow_stream.stall_fraction(), "%)");
}

// --gpu-mem's mode table on a 24 GiB card: of the resident modes the 33B
// step fits only with the NF4 base and AdamW's state on the host, and then
// at seq 2048 with micro_batch 1 and no more; NF4 with resident state is the
// 26.49 GiB plan this config had before offloading. Every streamed mode
// fits, with the most resident layers that do, but ranks after the resident ones.
TEST_CASE("plan: the best mode for LLaMA-33B on a 24 GiB card is nf4 with the optimizer state on the host") {
  const TrainConfig config = load_train_config(std::string(FT_SOURCE_DIR) + "/configs/llama-33b-nf4-lora.yaml");
  const std::vector<ModeFit> modes = fit_modes(config, PlanOptions{});
  REQUIRE(modes.size() == 10);
  for (size_t i = 0; i < 6; ++i) {
    const ModeFit& fit = modes[i];
    CAPTURE(mode_name(fit.mode));
    const bool nf4_host = fit.mode.quantization == QuantizedBase::nf4 && fit.mode.optimizer == OffloadTarget::host;
    CHECK(fit.mode.base == OffloadTarget::device);
    CHECK(fit.fits == nf4_host);
    CHECK(fit.largest_seq_len == (nf4_host ? 2048 : 0));
    CHECK(fit.largest_micro_batch == (nf4_host ? 1 : 0));
  }
  CHECK(mode_name(modes[5].mode) == "nf4, optimizer state on the host");
  // The whole run's peaks (generation from a 2048-token prompt sets them; the step's are 23,568,419,840 and
  // 28,447,509,504 bytes).
  CHECK(modes[5].bytes == 24977009664);
  CHECK(modes[4].bytes == 29852888064);
  // Streamed, in order: int8, int8 with the state on the host, nf4, nf4 on the host.
  const int64_t resident[] = {21, 30, 43, 59}, micro_batch[] = {4, 8, 4, 8};
  for (size_t i = 6; i < 10; ++i) {
    CAPTURE(mode_name(modes[i].mode));
    CHECK(modes[i].mode.base == OffloadTarget::host);
    CHECK(modes[i].fits);
    CHECK(modes[i].mode.resident_layers == resident[i - 6]);
    CHECK(modes[i].largest_seq_len == 2048);
    CHECK(modes[i].largest_micro_batch == micro_batch[i - 6]);
  }
  CHECK(mode_name(modes[9].mode) == "nf4 streamed (59 resident), optimizer state on the host");
}

TEST_CASE("plan: a bare config.json plans as a bf16 LoRA run at seq 2048") {
  const TrainConfig config =
      plan_config_for_model(std::string(FT_SOURCE_DIR) + "/configs/llama-2-7b/config.json", {"lora.r=16"});
  CHECK(config.precision == Precision::bf16);
  CHECK(config.activation_checkpointing == ActivationCheckpointing::per_layer);
  CHECK(config.seq_len == 2048);
  CHECK(config.micro_batch_size == 1);
  CHECK(config.lora.r == 16);
  // The model folder works as well as its config.json.
  CHECK(plan_config_for_model(std::string(FT_SOURCE_DIR) + "/configs/tiny-base", {}).seq_len == 512);
  // Llama-2-7B on 24 GiB: a bf16 base fits (13.5 GB of weights), so it is the best mode.
  const std::vector<ModeFit> modes = fit_modes(config, PlanOptions{});
  CHECK(modes[0].mode.quantization == QuantizedBase::none);
  CHECK(modes[0].fits);
  CHECK(modes[0].largest_seq_len == 4096);
  CHECK_THROWS_WITH_AS(plan_config_for_model(std::string(FT_SOURCE_DIR) + "/configs/nothing.json", {}),
                       doctest::Contains("nothing.json"), Error);
}

TEST_CASE("plan: a T5's config.json (the course's FLAN-T5) plans without checkpointing, which T5 has not") {
  const PlanRun run = run_plan(std::string(FT_SOURCE_DIR) + "/configs/flan-t5-base");
  CHECK_MESSAGE(run.exit_status == 0, run.output);
  CHECK(plan_config_for_model(std::string(FT_SOURCE_DIR) + "/configs/flan-t5-base", {}).activation_checkpointing ==
        ActivationCheckpointing::none);
}

// Long context: Llama-3.1-8B (configs/llama-3.1-8b, its published
// config.json), NF4 + LoRA r16 on q/v, bf16, per-layer checkpointing, at
// micro_batch 1 on a 24 GiB card (context reserve included). The exact search
// (multiples of 256) must find a length that fits and a next one that does
// not; the per-layer checkpoints (32 x T x 4096 x 2 B) stop it at 36,864
// tokens, and with them offloaded to host memory the live layer and the
// logits stop it at 73,728. (Measured peers: unsloth publishes 78,475 tokens
// on a 24 GB card, transformers + FlashAttention-2 5,789; ours are plans,
// proven exact against measured steps on the small fixtures.)
TEST_CASE("plan: Llama-3.1-8B NF4 + LoRA's longest context on 24 GiB, with the checkpoints resident and offloaded") {
  const std::string model = std::string(FT_SOURCE_DIR) + "/configs/llama-3.1-8b/config.json";
  PlanOptions options;
  options.exact_seq_len = true;
  struct Case {
    std::vector<std::string> overrides;
    int64_t longest;
  };
  const std::vector<std::string> qlora = {"quantization.mode=nf4", "lora.r=16", "lora.target_modules=[q_proj,v_proj]"};
  std::vector<std::string> offloaded = qlora;
  offloaded.push_back("offload.activations=host");
  for (const Case& c : {Case{qlora, 36864}, Case{offloaded, 73728}}) {
    CAPTURE(c.longest);
    const TrainConfig config = plan_config_for_model(model, c.overrides);
    const std::vector<ModeFit> modes = fit_modes(config, options);
    const ModeFit& nf4 = modes[4];
    REQUIRE(mode_name(nf4.mode) == "nf4");
    MESSAGE("Llama-3.1-8B nf4 + LoRA r16 q/v", std::string(c.overrides.size() > 3 ? ", checkpoints offloaded" : ""),
            ": longest seq_len ", nf4.largest_seq_len, "; ", nf4.seq_len_limit);
    CHECK(nf4.largest_seq_len == c.longest);
    CHECK(plan_step(config, options, 1, c.longest).total_bytes() <= options.gpu_mem_bytes);
    CHECK(plan_step(config, options, 1, c.longest + kSeqLenStep).total_bytes() > options.gpu_mem_bytes);
    const std::string limit = nf4.seq_len_limit;
    CHECK(limit.starts_with("at " + std::to_string(c.longest + kSeqLenStep) + ": " +
                            (c.overrides.size() > 3 ? "the live layer and logits" : "checkpoints")));
  }
}

// The same at 131,072 tokens (Llama-3.1-8B's max_position_embeddings) with
// the MLP run 4096 tokens at a time as well: its [T, 14336] tensors were
// what stopped the offloaded run at 73,728 (and the layer's MLP-block
// activations are freed before the attention backward, the peak here).
// LoRA r16 on q/v, on every linear, and Llama-2-7B with an INT8 base, its
// 4096 positions stretched to 131,072 by linear rope scaling (factor 32, as
// its long-context fine-tunes extend it): each fits, its figure printed.
TEST_CASE("plan: Llama-3.1-8B NF4 + LoRA r16 at 131,072 tokens fits 24 GiB with the MLP chunked, and Llama-2-7B INT8") {
  const std::string configs = std::string(FT_SOURCE_DIR) + "/configs/";
  std::ostringstream text;
  text << std::ifstream(configs + "llama-2-7b/config.json").rdbuf();
  std::string llama2 = text.str();
  const auto replace = [&](const std::string& from, const std::string& to) {
    const size_t at = llama2.find(from);
    REQUIRE(at != std::string::npos);
    llama2.replace(at, from.size(), to);
  };
  replace("\"max_position_embeddings\": 4096", "\"max_position_embeddings\": 131072");
  replace("\"rope_scaling\": null", "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 32.0}");
  const std::string llama2_128k = write_model("llama-2-7b-128k", llama2);
  const std::string llama3 = configs + "llama-3.1-8b";
  const std::vector<std::string> long_context = {"offload.activations=host", "mlp_chunk_tokens=4096", "lora.r=16"};
  struct Case {
    std::string name, model;
    std::vector<std::string> overrides;
  };
  const Case cases[] = {
      {"Llama-3.1-8B nf4 + LoRA r16 q/v", llama3, {"quantization.mode=nf4", "lora.target_modules=[q_proj,v_proj]"}},
      {"Llama-3.1-8B nf4 + LoRA r16 all-linear", llama3, {"quantization.mode=nf4", "lora.target_modules=all-linear"}},
      {"Llama-2-7B int8 + LoRA r16 q/v", llama2_128k, {"quantization.mode=int8", "lora.target_modules=[q_proj,v_proj]"}}};
  PlanOptions options;
  for (const Case& c : cases) {
    CAPTURE(c.name);
    std::vector<std::string> overrides = c.overrides;
    overrides.insert(overrides.end(), long_context.begin(), long_context.end());
    const TrainConfig config = plan_config_for_model(c.model + "/config.json", overrides);
    const StepPlan plan = plan_step(config, options, 1, 131072);
    MESSAGE(c.name, ", checkpoints offloaded, MLP in 4096-token chunks, seq_len 131,072: ", plan.total_bytes(),
            " bytes (", double(plan.total_bytes()) / double(size_t(1) << 30), " GiB) of ", options.gpu_mem_bytes,
            "; peak at ", plan.where);
    CHECK(plan.total_bytes() <= options.gpu_mem_bytes);
  }
}

// The shipped tiny model's folder on a 1 GiB card: every mode fits its
// micro_batch 1 x seq_len 512 (its max_position_embeddings), so the best is
// the unquantised base; the table and the best mode reach the user.
TEST_CASE("plan: --ranks prints the all-reduce of data-parallel ranks; a bad count is refused") {
  const std::string model = std::string(FT_SOURCE_DIR) + "/configs/tiny-base";
  const TrainConfig config = plan_config_for_model(model, {});
  const AllReducePlan all_reduce =
      plan_all_reduce(plan_step(config, PlanOptions{}, config.micro_batch_size, config.seq_len), 4);
  const PlanRun run = run_plan(model + " --gpu-mem 1GiB --ranks 4");
  CHECK(run.exit_status == 0);
  CHECK(run.output.find("data parallel on 4 ranks: each rank's peak as above; per optimizer step") != std::string::npos);
  const std::string gradient_bytes = std::to_string(all_reduce.gradient_bytes);
  const std::string ring_bytes = std::to_string(all_reduce.gradient_bytes * 6 / 4);  // 2 x 3/4
  CHECK(run.output.find(gradient_bytes + " bytes), a ring sends") != std::string::npos);
  CHECK(run.output.find(ring_bytes + " bytes)") != std::string::npos);
  const PlanRun bad = run_plan(model + " --ranks 0");
  CHECK(bad.exit_status == 1);
  CHECK(bad.output.find("--ranks: expected an integer in [1, 1048576], got \"0\"") != std::string::npos);
}

TEST_CASE("plan: finetune plan MODEL_FOLDER --gpu-mem prints the mode table and the best mode") {
  const PlanRun run = run_plan(std::string(FT_SOURCE_DIR) + "/configs/tiny-base --gpu-mem 1GiB");
  CHECK(run.exit_status == 0);
  CHECK(run.output.find("micro_batch 1 x seq_len 512") != std::string::npos);
  CHECK(run.output.find("nf4, optimizer state on the host") != std::string::npos);
  CHECK(run.output.find("nf4 streamed (3 resident), optimizer state on the host") != std::string::npos);
  CHECK(run.output.find("best mode: unquantised base (") != std::string::npos);
}

// A folder saved quantised (config.json's quantization_config, as
// transformers + bitsandbytes write it) loads in its own format only: its
// plan takes that format and lists no other, and a config asking for another
// is refused as the run refuses it.
TEST_CASE("plan: a bitsandbytes-saved checkpoint is planned in its stored format") {
  const std::string fixtures = std::string(FT_SOURCE_DIR) + "/tests/fixtures/bnb_checkpoint/";
  const PlanRun nf4 = run_plan(fixtures + "llama_nf4");
  CHECK(nf4.exit_status == 0);
  CHECK(nf4.output.find("frozen NF4 linear weights") != std::string::npos);
  CHECK(nf4.output.find("(double-quantised") != std::string::npos);  // bnb_4bit_use_double_quant: true
  CHECK(nf4.output.find("best mode: nf4 (") != std::string::npos);
  for (const char* other : {"\n  int8", "\n  unquantised base"}) CHECK(nf4.output.find(other) == std::string::npos);
  const PlanRun int8 = run_plan(fixtures + "llama_int8");
  CHECK(int8.exit_status == 0);
  CHECK(int8.output.find("frozen int8 linear weights") != std::string::npos);
  CHECK(int8.output.find("best mode: int8 (") != std::string::npos);
  for (const char* other : {"\n  nf4", "\n  unquantised base"}) CHECK(int8.output.find(other) == std::string::npos);
  const PlanRun mismatch = run_plan(fixtures + "llama_nf4 --set quantization.mode=int8");
  CHECK(mismatch.exit_status == 1);
  CHECK(mismatch.output.find("llama_nf4/config.json: quantization_config.load_in_4bit is true: its decoder linears "
                             "are stored NF4 and load only with quantization.mode nf4 (this run has int8)") !=
        std::string::npos);
}

// A run with device: cpu trains on the CPU, so its plan is the CPU's unless
// --device says otherwise; device: auto plans the GPU it is meant for.
TEST_CASE("plan: follows the config's device unless --device overrides it") {
  const std::string config = std::string(FT_SOURCE_DIR) + "/configs/default.yaml";
  const PlanRun cpu = run_plan(config + " --set device=cpu");
  CHECK(cpu.exit_status == 0);
  CHECK(cpu.output.find("on cpu, micro_batch") != std::string::npos);
  const PlanRun overridden = run_plan(config + " --set device=cpu --device cuda");
  CHECK(overridden.output.find("on cuda, micro_batch") != std::string::npos);
  const PlanRun automatic = run_plan(config);
  CHECK(automatic.output.find("on cuda, micro_batch") != std::string::npos);
}

TEST_CASE("plan: every shipped kind of config plans: reward, FLAN-T5 LoRA and the course's comparison files") {
  const std::string configs = std::string(FT_SOURCE_DIR) + "/configs/";
  // objective: reward scores a row's inputs and its last target: its longest seq_len is one position short.
  const PlanRun reward = run_plan(configs + "reward-tiny.yaml");
  CHECK(reward.exit_status == 0);
  CHECK(reward.output.find("best mode: ") != std::string::npos);
  const PlanRun too_long = run_plan(configs + "reward-tiny.yaml --set seq_len=512");
  CHECK(too_long.exit_status == 1);
  CHECK(too_long.output.find("reward-tiny.yaml: seq_len 512 is larger than the model's max_position_embeddings 512 "
                             "less the scored last token") != std::string::npos);
  // A T5 keeps its base on the device: no streamed modes in its table.
  const PlanRun t5 = run_plan(configs + "flan-t5-base-dialogsum-lora.yaml");
  CHECK(t5.exit_status == 0);
  CHECK(t5.output.find("best mode: ") != std::string::npos);
  CHECK(t5.output.find("streamed") == std::string::npos);
  // A comparison plans each run.
  const PlanRun lab2 = run_plan(configs + "course-lab2.yaml");
  CHECK(lab2.exit_status == 0);
  for (const char* name : {"original model", "full fine-tuning", "LoRA"})
    CHECK(lab2.output.find(std::string("== compare run \"") + name + "\"") != std::string::npos);
  // Its original model (train: false) holds no gradients or AdamW state; full fine-tuning does.
  const size_t full = lab2.output.find("== compare run \"full fine-tuning\"");
  CHECK(lab2.output.find("train: false: nothing trainable") < full);
  const std::string no_gradients = "  gradients (f32)                                                     0 B\n";
  CHECK(lab2.output.find(no_gradients) < full);
  CHECK(lab2.output.find(no_gradients, full) == std::string::npos);
  // Lab 3's PPO trains a T5 policy, which the planner does not replay: said after the reward model's plan.
  const PlanRun lab3 = run_plan(configs + "course-lab3.yaml");
  CHECK(lab3.exit_status == 1);
  CHECK(lab3.output.find("best mode: ") < lab3.output.find("objective: ppo on a t5 (encoder-decoder) policy is not "
                                                            "planned"));
  // The same comparison over a decoder-only policy: PPO's reward adapter, written by the run above, is not there yet.
  const std::string unwritten = std::string(FT_BINARY_DIR) + "/plan_lab3_unwritten";
  const PlanRun decoder = run_plan(configs + "course-lab3.yaml --set model=" + configs +
                                   "tiny-base --set lora.target_modules=[q_proj,v_proj] --set output_dir=" + unwritten);
  CHECK(decoder.exit_status == 0);
  CHECK(decoder.output.find("note: rewards.model_adapter " + unwritten + "/reward-model/adapter is written by a run "
                            "above: the reward model is planned without its LoRA") != std::string::npos);
  CHECK(decoder.output.find("PPO: micro_batch rollouts") != std::string::npos);
}
