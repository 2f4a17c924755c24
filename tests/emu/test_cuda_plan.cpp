// The memory planner's CUDA policy against a real training step on the
// CUDA backend: the planner must model the CUDA path's real allocations.
// Both run the same model code; the planner on the meta device
// with kernels/meta's model of CudaBackend's scratch and CachingAllocator's
// size classes, the measured step on CudaBackend over CachingAllocator. So the
// planned peak must equal the caching allocator's measured peak to the byte.
//
// The one difference, removed rather than explained away: this build's GEMM
// is the tiled kernel (the emulator has no cuBLASLt), which needs no
// workspace, so the plan is made with gemm_workspace_bytes = 0 instead of
// cuBLASLt's 32 MiB. On a real GPU (tests/gpu) it is cuBLASLt and 32 MiB.
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <string>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_allocator.h"
#include "model/causal_lm.h"
#include "model/families.h"
#include "tests/emu/cuda_device_skip.h"
#include "tests/rl_step_peaks.h"
#include "trainer/generate.h"
#include "trainer/rl/reward.h"
#include "model/peft_adapter.h"
#include "trainer/plan.h"
#include "trainer/train_state.h"
#include "trainer/train_config.h"
#include "trainer/trainer.h"

using namespace ft;

namespace {

const bool cuda_device_present = cuda_test::exit_skipped_without_cuda_device();
const std::string kFixtures = FT_FIXTURES_DIR;

TrainConfig make_config(const std::string& model, const std::string& extra_yaml) {
  return parse_train_config("model: " + kFixtures + "/" + model + "\ndata: {train: unused.jsonl}\n" + extra_yaml,
                            "test_cuda_plan.yaml");
}

// The planner's options for this build's CudaBackend.
PlanOptions cuda_plan_options() {
  PlanOptions options;
  options.gemm_workspace_bytes = cuda::default_gemm_kind() == cuda::GemmKind::cublaslt
                                     ? cuda::kCublasLtWorkspaceBytes : 0;
  options.library_attention = cuda::library_attention_built() && cuda::library_attention_wanted();
  options.library_int8_gemm = cuda::library_int8_gemm_available();
  return options;
}

// The caching allocator's peak over one training step built as plan_step
// builds it (random INT8 base instead of the planner's absent weights;
// objective: reward: batch pairs through the score head). With
// phase_peaks, after the step the peaks of the run's other phases as a run
// makes them: the checkpoint's host copies, an eval forward (its logits
// released), and generate() over the larger of ROUGE's and the samples'
// batches (at most micro_batch_size rows) with prompts of seq tokens.
size_t measured_step_peak(const TrainConfig& config, int64_t batch, int64_t seq,
                          std::vector<size_t>* phase_peaks = nullptr) {
  const ModelConfig model_config = read_model_config(config.model + "/config.json");
  DeviceAllocator device;
  CachingAllocator caching(device);
  TrackingAllocator tracker(caching);
  CudaBackend backend(tracker, cuda::default_gemm_kind());
  HostAllocator host;
  TrackingAllocator host_state(host);
  TrainingSetup setup = setup_training(
      config, model_config, backend, [&](LanguageModel& model) { model.init_random(config.seed); }, &host_state);
  CausalLM* model = &causal_lm(*setup.model, "this test");
  const bool reward = config.objective == Objective::reward;
  Tensor ids = Tensor::empty({reward ? 2 * batch : batch, seq}, DType::i32, host, MemCategory::activations);
  for (int64_t i = 0; i < ids.numel(); ++i) ids.ptr<int32_t>()[i] = int32_t((i * 7 + 3) % model_config.vocab_size);
  caching.reset_peak();  // init_random's staging is not part of a step
  model->zero_grads();
  model->set_dropout_seed(config.seed);
  if (reward) reward_micro_batch(*model, Batch{ids, ids, ids.numel()}, 0, true, 1.0);
  else model->forward_backward(ids, ids, 1.0f);
  setup.optimizer->step(config.lr);
  const size_t step_peak = caching.stats().peak_bytes;
  if (!phase_peaks) return step_peak;
  caching.reset_peak();
  train_state_tensors(*setup.optimizer, host);
  peft_adapter_tensors(*model, host);
  phase_peaks->push_back(caching.stats().peak_bytes);
  caching.reset_peak();
  model->forward(ids, ids);
  model->release_logits();
  phase_peaks->push_back(caching.stats().peak_bytes);
  const size_t rows = size_t(generation_batch(
      config, std::max<int64_t>(std::min<int64_t>(16, config.metric_examples), config.generate.num_samples)));
  std::vector<std::vector<int32_t>> prompts(rows, std::vector<int32_t>(size_t(seq), 7));
  SamplingOptions greedy;
  greedy.max_new_tokens = config.generate.max_new_tokens;
  caching.reset_peak();
  generate(*model, prompts, greedy, StopCondition{});
  phase_peaks->push_back(caching.stats().peak_bytes);
  return step_peak;
}

void check_plan_matches_cuda_step(const std::string& model, const std::string& extra_yaml) {
  CAPTURE(model);
  CAPTURE(extra_yaml);
  const TrainConfig config = make_config(model, extra_yaml);
  const int64_t batch = 2, seq = 24;
  const StepPlan plan = plan_step(config, cuda_plan_options(), batch, seq);
  const size_t measured = measured_step_peak(config, batch, seq);
  MESSAGE(model, ": planned ", plan.peak_bytes, " bytes, measured ", measured, " (peak at ", plan.where, ")");
  CHECK(plan.peak_bytes == measured);
}

const char* kInt8Lora = "quantization: {mode: int8}\nlora: {r: 8, lora_alpha: 16, lora_dropout: 0.05, target_modules: ";

// The caching allocator's peaks for tests/rl_step_peaks.h's RL steps.
struct CachedCuda {
  DeviceAllocator device;
  CachingAllocator caching{device};
  TrackingAllocator tracker{caching};
  CudaBackend backend{tracker, cuda::default_gemm_kind()};
  HostAllocator host;
  TrackingAllocator host_state{host};
  PeakMeter meter{[this] { caching.reset_peak(); }, [this] { return caching.stats().peak_bytes; }};
  TrainingSetup setup(const TrainConfig& config, std::optional<OutputHead> head = std::nullopt) {
    return setup_training(config, read_model_config(config.model + "/config.json"), backend,
                          [&](LanguageModel& model) { model.init_random(config.seed); }, &host_state, {}, {}, head);
  }
};

}  // namespace

TEST_CASE("plan: the CUDA policy's peak equals a CUDA training step's, to the byte") {
  REQUIRE(cuda_device_present);
  const std::string llama = std::string(kInt8Lora) + "[q_proj, v_proj]}\n";
  const std::string neox = std::string(kInt8Lora) + "[query_key_value]}\n";
  for (const char* precision : {"precision: fp32\n", "precision: bf16\n"}) {
    check_plan_matches_cuda_step("llama_gqa", llama + precision);
    check_plan_matches_cuda_step("llama_gqa", llama + precision + "activation_checkpointing: per_layer\n");
    check_plan_matches_cuda_step("gpt_neox_sequential", neox + precision);
    check_plan_matches_cuda_step("gpt_neox_parallel", neox + precision + "activation_checkpointing: per_layer\n");
  }
}

// offload.optimizer: host: bf16 (or f32) adapters and f32 gradients on the
// device, AdamW's state in host memory, streamed through staging buffers in
// the optimizer step; an NF4 base with LoRA on every linear, as QLoRA trains.
TEST_CASE("plan: with AdamW's state offloaded the CUDA policy's peak equals a CUDA step's, to the byte") {
  REQUIRE(cuda_device_present);
  const std::string qlora = "quantization: {mode: nf4}\nlora: {r: 8, target_modules: all-linear}\n"
                            "offload: {optimizer: host}\nactivation_checkpointing: per_layer\n";
  for (const char* precision : {"precision: fp32\n", "precision: bf16\n"})
    check_plan_matches_cuda_step("llama_gqa", qlora + precision);
}

// offload.base: host: the streamed layers' tensors in pinned host memory (not
// the device's), their device slots in the weights, and the planner's second
// micro-batch (its PCIe traffic) repeats the first's allocations.
TEST_CASE("plan: with the base streamed from host memory the CUDA policy's peak equals a CUDA step's, to the byte") {
  REQUIRE(cuda_device_present);
  const std::string base = "lora: {r: 8, target_modules: all-linear}\nactivation_checkpointing: per_layer\n"
                           "precision: bf16\n";
  for (const char* quantization : {"quantization: {mode: nf4}\n", "quantization: {mode: int8}\n"}) {
    check_plan_matches_cuda_step("llama_gqa", base + quantization + "offload: {base: host, stream_slots: 1}\n");
    check_plan_matches_cuda_step("llama_gqa",
                                 base + quantization + "offload: {base: host, optimizer: host, resident_layers: 1}\n");
  }
}

// offload.activations: host: every per-layer checkpoint but the last in
// pinned host memory; the device holds at most the one leaving and the one
// coming back. The plan's pinned host bytes are what the offload holds.
TEST_CASE("plan: with the checkpoints offloaded the CUDA policy's peak equals a CUDA step's, to the byte") {
  REQUIRE(cuda_device_present);
  const std::string base = std::string(kInt8Lora) + "[q_proj, v_proj]}\nactivation_checkpointing: per_layer\n"
                                                    "offload: {activations: host}\n";
  for (const char* precision : {"precision: fp32\n", "precision: bf16\n"}) {
    check_plan_matches_cuda_step("llama_gqa", base + precision);
    check_plan_matches_cuda_step("gpt_neox_parallel",
                                 std::string(kInt8Lora) + "[query_key_value]}\nactivation_checkpointing: per_layer\n"
                                                          "offload: {activations: host}\n" + precision);
  }
  // With the MLP run 5 tokens at a time (the last of 48 tokens' chunks has 3),
  // its LoRA's dropout included.
  const std::string chunked = "mlp_chunk_tokens: 5\nlora: {r: 8, lora_dropout: 0.05, target_modules: all-linear}\n"
                              "quantization: {mode: nf4}\nactivation_checkpointing: per_layer\n"
                              "offload: {activations: host}\n";
  for (const char* precision : {"precision: fp32\n", "precision: bf16\n"}) {
    check_plan_matches_cuda_step("llama_gqa", chunked + precision);
    check_plan_matches_cuda_step("gpt_neox_sequential", chunked + precision);
  }
  const TrainConfig config = make_config("llama_gqa", base + "precision: bf16\n");
  const StepPlan plan = plan_step(config, PlanOptions{}, 2, 24);
  const ModelConfig model = read_model_config(config.model + "/config.json");
  const size_t checkpoint_bytes = size_t(2 * 24 * model.hidden_size) * 2;  // bf16
  CHECK(plan.host_activation_bytes == size_t(model.num_hidden_layers - 1) * checkpoint_bytes);
  CHECK(plan.activation_pcie_bytes == 2 * plan.host_activation_bytes);
}

// The run's phases after the step (tests/test_plan.cpp checks them on the
// CPU): an eval forward and generate() over ROUGE's and the samples' larger
// batch, planned against the caching allocator's measured peaks, to the byte.
TEST_CASE("plan: evaluation and generation after a CUDA step plan to the byte") {
  REQUIRE(cuda_device_present);
  for (const char* precision : {"precision: fp32\n", "precision: bf16\n"}) {
    CAPTURE(precision);
    TrainConfig config = make_config("llama_gqa", std::string(kInt8Lora) + "[q_proj, v_proj]}\n" + precision +
                                                      "metric_examples: 5\ngenerate: {num_samples: 3, max_new_tokens: 4}\n");
    config.data.eval = "eval.jsonl";  // the plan reads no data
    config.task_metric = TaskMetric::rouge;
    const int64_t batch = 2, seq = 24;
    const StepPlan plan = plan_step(config, cuda_plan_options(), batch, seq);
    REQUIRE(plan.phases.size() == 3);
    std::vector<size_t> measured;
    measured_step_peak(config, batch, seq, &measured);
    REQUIRE(measured.size() == 3);
    for (size_t i = 0; i < 3; ++i) {
      MESSAGE(plan.phases[i].phase, ": planned ", plan.phases[i].peak_bytes, ", measured ", measured[i]);
      CHECK(plan.phases[i].peak_bytes == measured[i]);
    }
  }
}

// Online RL on the CUDA policy (tests/test_plan.cpp checks the same on the
// CPU): objective: reward's step; a GRPO step (its rollout, reference and
// policy backward, grpo_step's peak); a PPO step phase by phase (rollout,
// values, reference, a reward model's scores, the policy and value step).
TEST_CASE("plan: reward, GRPO and PPO steps on the CUDA policy plan to the byte") {
  REQUIRE(cuda_device_present);
  const std::string llama = std::string(kInt8Lora) + "[q_proj, v_proj]}\n";
  for (const char* precision : {"precision: fp32\n", "precision: bf16\n"}) {
    CAPTURE(precision);
    check_plan_matches_cuda_step("llama_gqa", "objective: reward\n" + llama + precision);

    const TrainConfig grpo = make_config("llama_gqa", "objective: grpo\nrewards: {length: 8}\nmicro_batch_size: 4\n"
                                         "seq_len: 24\ngrpo: {num_generations: 2, max_completion_length: 8, beta: "
                                         "0.04, num_iterations: 2}\n" + llama + precision);
    const StepPlan grpo_plan = plan_step(grpo, cuda_plan_options(), grpo.micro_batch_size, grpo.seq_len);
    CachedCuda grpo_cuda;
    TrainingSetup grpo_setup = grpo_cuda.setup(grpo);
    check_grpo_plan(grpo_plan, grpo_step_peaks(grpo, grpo_setup, grpo_cuda.meter));

    const TrainConfig policy = make_config("gpt_neox_parallel", std::string(kInt8Lora) + "[query_key_value]}\n" +
                                           "activation_checkpointing: per_layer\n" + precision);
    const PpoPlan ppo{3, 12, 6, 2, 5, kFixtures + "/reward/model", ""};
    const StepPlan ppo_plan = plan_ppo_step(policy, cuda_plan_options(), ppo);
    CachedCuda ppo_cuda;
    TrainingSetup ppo_setup = ppo_cuda.setup(policy, OutputHead::value);
    std::unique_ptr<CausalLM> reward = make_reward_model(policy, ppo.reward_model, ppo_cuda.backend);
    reward->init_random(policy.seed);
    check_ppo_plan(ppo_plan, ppo_step_peaks(policy, ppo, ppo_setup, *reward, ppo_cuda.meter));
  }
}
