#include "trainer/plan.h"

#include <algorithm>
#include <cmath>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "kernels/checked_mul.h"
#include "kernels/error.h"
#include "model/causal_lm.h"
#include "model/families.h"
#include "model/layer_stream.h"
#include "model/peft_adapter.h"
#include "model/quant/formats.h"
#include "trainer/dpo.h"
#include "trainer/evaluate.h"
#include "trainer/parallel/data_parallel.h"
#include "trainer/parallel/pipeline.h"
#include "trainer/parallel/tensor_parallel.h"
#include "trainer/report/progress.h"
#include "trainer/rl/reward.h"
#include "trainer/setup.h"
#include "trainer/train_state.h"

namespace ft {

namespace {

// Sits above the tracker and remembers the tracker's per-category state, the
// step phase and the backend's last op whenever the held bytes reach a new
// maximum. Held bytes are the tracker's total (cpu) or the caching model's
// rounded bytes in use (cuda).
class PeakWatch final : public Allocator {
 public:
  PeakWatch(TrackingAllocator& tracker, const CachingModelAllocator* caching) : tracker_(tracker), caching_(caching) {}
  Device device() const override { return tracker_.device(); }
  void* allocate(size_t bytes, MemCategory category) override {
    void* ptr = tracker_.allocate(bytes, category);
    const size_t held = caching_ ? caching_->in_use_bytes() : tracker_.stats().total_current_bytes;
    if (held > peak_bytes) {
      peak_bytes = held;
      at_peak = tracker_.stats();
      phase_at_peak = phase;
      cursor_at_peak = backend ? backend->cursor() : MetaCursor{};
    }
    phase_peak_bytes = std::max(phase_peak_bytes, held);
    return ptr;
  }
  // A phase of the run after the step: its own peak starts from what is held now.
  void start_phase(const char* name) {
    phase = name;
    phase_peak_bytes = caching_ ? caching_->in_use_bytes() : tracker_.stats().total_current_bytes;
  }
  void deallocate(void* ptr, size_t bytes, MemCategory category) override {
    tracker_.deallocate(ptr, bytes, category);
  }

  const MetaBackend* backend = nullptr;
  const char* phase = "backend setup";
  size_t peak_bytes = 0;
  MemoryStats at_peak;
  const char* phase_at_peak = "";
  MetaCursor cursor_at_peak;
  size_t phase_peak_bytes = 0;  // since start_phase

 private:
  TrackingAllocator& tracker_;
  const CachingModelAllocator* caching_;
};

// "backward, last op int8_linear_backward on gpt_neox.layers.43.attention.query_key_value.weight":
// the peak allocation was made inside that op (its scratch) or just after it.
std::string describe_peak(const PeakWatch& watch, LanguageModel& model) {
  std::string where = watch.phase_at_peak;
  if (where != "training step") return where;
  const MetaCursor& cursor = watch.cursor_at_peak;
  where = std::string(cursor.backward ? "backward" : "forward") + ", last op " + cursor.op;
  for (std::deque<Parameter>* list : {&model.parameters(), &model.adapters()})
    for (const Parameter& p : *list)
      if (p.value.storage.get() == cursor.parameter) return where + " on " + p.name;
  return where;
}

// The device's weights by kind; a streamed layer's tensors (host memory)
// are StreamPlan's.
void split_weights(StepPlan& plan, LanguageModel& model) {
  plan.quantized_base = model.options().quantized_base;
  for (const Parameter& p : model.parameters()) {
    if (p.value.device == Device::cpu) continue;
    if (p.is_quantized()) {
      plan.quantized_weight_bytes += p.value.size_bytes();
      for (const Tensor& constant : p.quantized.constants) plan.quantized_constant_bytes += constant.size_bytes();
    } else {
      plan.dense_weight_bytes += p.value.size_bytes();
      plan.dense_weight_dtype = p.value.dtype;
    }
  }
}

// The frozen linear weights of the model's first decoder layer (all layers
// are alike) and the LoRA parameters of an average one (rank_pattern and
// layers_to_transform make them differ), for the time model.
struct LayerParameters {
  double linear = 0.0, lora = 0.0;
};
LayerParameters layer_parameters(LanguageModel& model) {
  const std::string layer = ".layers." + std::to_string(model.layers().first_layer) + ".";
  LayerParameters counts;
  for (const Parameter& p : model.parameters())
    if (p.name.find(layer) != std::string::npos && p.is_quantized()) counts.linear += double(shape_numel(p.shape()));
  for (const Parameter& p : model.adapters())
    if (p.name.find(".layers.") != std::string::npos) counts.lora += double(p.value.numel());
  counts.lora /= double(model.layers().end_layer - model.layers().first_layer);
  return counts;
}

// The time model's FLOPs over N = B x T tokens. One layer: forward 2N
// (linear + LoRA parameters) plus causal attention 2 B T^2 x (heads x
// head_dim) (QK^T and PV, half of each masked); backward 2N linear (dx only:
// the base is frozen), 4N LoRA (dx and its gradients), attention twice its
// forward, and the forward again when checkpointed. The LM head: 2 N hidden
// vocab forward and as much for dhidden.
struct LayerFlops {
  double forward = 0.0, backward = 0.0, lm_head = 0.0;
};
LayerFlops layer_flops(LanguageModel& model, const TrainConfig& config, int64_t micro_batch, int64_t seq_len) {
  const ModelConfig& mc = model.config();
  const double tokens = double(micro_batch) * double(seq_len);
  const LayerParameters counts = layer_parameters(model);
  const double attention = 2.0 * double(micro_batch) * double(seq_len) * double(seq_len) *
                           double(mc.num_attention_heads * mc.head_dim);
  LayerFlops flops;
  flops.forward = 2.0 * tokens * (counts.linear + counts.lora) + attention;
  const double recompute = config.activation_checkpointing == ActivationCheckpointing::per_layer ? flops.forward : 0.0;
  flops.backward = 2.0 * tokens * counts.linear + 4.0 * tokens * counts.lora + 2.0 * attention + recompute;
  flops.lm_head = 4.0 * tokens * double(mc.hidden_size) * double(mc.vocab_size);
  return flops;
}

// StreamPlan's time model at options.flops_per_s. Each copied layer overlaps
// the compute of the layer before it (the copy stream moves one layer while
// the compute stream runs one), so it stalls the pass by max(0, copy - that
// layer's compute).
void model_stream_time(StreamPlan& stream, const LayerFlops& flops, const PlanOptions& options) {
  const double rate = options.flops_per_s;
  stream.copy_s = double(stream.layer_bytes) / options.h2d_bytes_per_s;
  stream.forward_s = flops.forward / rate;
  stream.backward_s = flops.backward / rate;
  stream.compute_s = (double(stream.layers) * (flops.forward + flops.backward) + flops.lm_head) / rate;
  const double copies_per_pass = double(stream.pcie_bytes) / double(stream.layer_bytes) / 2.0;
  stream.stall_s = copies_per_pass * (std::max(0.0, stream.copy_s - stream.forward_s) +
                                      std::max(0.0, stream.copy_s - stream.backward_s));
}

// offload.activations: host over one micro-batch: every checkpoint but the
// last layer's goes out once and comes back once, each overlapping one
// layer's forward (out) or backward (back) at options' rates.
void model_activation_offload(StepPlan& plan, const LanguageModel& model, const ActivationOffload& offload,
                              const LayerFlops& flops, const PlanOptions& options) {
  const LayerRange& layers = model.layers();
  const int64_t offloaded = layers.end_layer - layers.first_layer - 1;
  const size_t checkpoint_bytes = size_t(plan.micro_batch * plan.seq_len * model.config().hidden_size) *
                                  dtype_size_bytes(model.options().activation_dtype);
  plan.host_activation_bytes = offload.host_bytes();
  FT_CHECK(plan.host_activation_bytes == size_t(offloaded) * checkpoint_bytes,
           "plan: the offloaded checkpoints hold ", plan.host_activation_bytes, " host bytes, not ", offloaded,
           " x ", checkpoint_bytes);
  plan.activation_pcie_bytes = 2 * plan.host_activation_bytes;
  plan.activation_copy_s = double(checkpoint_bytes) / options.h2d_bytes_per_s;
  const double forward_s = flops.forward / options.flops_per_s, backward_s = flops.backward / options.flops_per_s;
  plan.activation_stall_s = double(offloaded) * (std::max(0.0, plan.activation_copy_s - forward_s) +
                                                 std::max(0.0, plan.activation_copy_s - backward_s));
}

// generate()'s cached path as it allocates: the cache for rows of
// prompt_tokens + new_tokens positions (at most max_position_embeddings),
// the prompts' forward, one decoding step (each later step repeats its
// allocations).
void replay_generation(CausalLM& model, int64_t rows, int64_t prompt_tokens, int64_t new_tokens) {
  HostAllocator host;
  const ModelConfig& model_config = model.config();
  const int64_t capacity = std::min(prompt_tokens + new_tokens, model_config.position_limit());
  KvCache cache = model.make_kv_cache(rows, capacity);
  Tensor prompt = Tensor::empty({rows, prompt_tokens}, DType::i32, host, MemCategory::activations);
  std::fill_n(prompt.ptr<int32_t>(), prompt.numel(), 0);
  Tensor logits = Tensor::empty({rows, model_config.vocab_size}, DType::f32, host, MemCategory::activations);
  model.backend().copy(logits,
                       model.forward_cached(cache, prompt, std::vector<int64_t>(size_t(rows), prompt_tokens)));
  if (new_tokens > 1 && prompt_tokens < capacity) {  // a prompt filling every position ends there
    Tensor step = Tensor::empty({rows, 1}, DType::i32, host, MemCategory::activations);
    std::fill_n(step.ptr<int32_t>(), rows, 0);
    model.backend().copy(logits, model.forward_cached(cache, step, std::vector<int64_t>(size_t(rows), 1)));
  }
}

// What a run does besides its steps, after the step as a run does it:
// evaluation forwards and generation (ROUGE, the samples), a decoder-only
// model's. Online RL (rl) evaluates on held-out prompts at its step's
// shapes: its rollout and forwards, phases of the step already.
void replay_run_phases(StepPlan& plan, PeakWatch& watch, const TrainConfig& config, LanguageModel& model,
                       AdamW& optimizer, const Tensor& ids, const Tensor& targets, bool rl) {
  // Every run saves: the training state and the adapter, copied to host
  // memory (a dtype conversion on the way takes device scratch).
  {
    watch.start_phase("checkpoint");
    MetaHostAllocator host;  // host copies without bytes: only the device side counts (a 33B state is GBs)
    train_state_tensors(optimizer, host);
    if (config.trainable == Trainable::lora) peft_adapter_tensors(model, host);
    plan.phases.push_back({"checkpoint", watch.phase_peak_bytes});
  }
  CausalLM* causal = model.as_causal_lm();
  if (config.data.eval.empty() || !causal || rl) return;
  const int64_t micro_batch = plan.micro_batch, seq_len = plan.seq_len;
  watch.start_phase("evaluation");
  if (config.objective == Objective::dpo) {
    dpo_micro_batch(*causal, Batch{ids, targets, ids.numel()}, config.dpo, false, 1.0);
  } else if (config.objective == Objective::reward) {
    reward_micro_batch(*causal, Batch{ids, targets, ids.numel()}, 0, false, 0.0);
  } else {
    causal->forward(ids.slice_rows(0, micro_batch), targets.slice_rows(0, micro_batch));
    causal->release_logits();
  }
  plan.phases.push_back({"evaluation", watch.phase_peak_bytes});
  const int64_t rouge_rows = config.task_metric == TaskMetric::rouge ? std::min<int64_t>(16, config.metric_examples) : 0;
  const int64_t wanted = std::max(rouge_rows, config.generate.num_samples);
  const int64_t rows = wanted > 0 ? generation_batch(config, wanted) : 0;
  const int64_t new_tokens = config.generate.max_new_tokens;
  if (config.objective != Objective::sft || rows == 0 || new_tokens == 0) return;
  watch.start_phase("generation");
  replay_generation(*causal, rows, seq_len, new_tokens);
  plan.phases.push_back({"generation", watch.phase_peak_bytes});
}

// An online-RL step's shapes: objective: grpo's from its config, PPO's
// from PpoPlan. Rollouts of prompt + completion tokens, generated and run
// through the eval forwards micro_batch rows at a time.
struct RlReplay {
  int64_t prompt_tokens = 0, completion_tokens = 0;
  int64_t train_rows = 0;                    // the policy's forward and backward
  int64_t reward_rows = 0;                   // sequences the reward model scores in one forward
  std::string reward_model, reward_adapter;  // folders; "" = none
  bool reference = false;                    // a KL to the reference: its forward, adapters disabled
  bool value_head = false;                   // PPO: the policy's value head, read and trained
  bool rollout_logps = false;                // GRPO with num_iterations > 1: the policy's log-probabilities at generation
};

// GRPO's step at micro_batch x seq_len: prompts cut to leave
// max_completion_length (trainer.cpp), every completion that long; the
// reward model scores the step's micro_batch x grad_accum_steps completions
// in one forward (compute_rewards). The fit searches' short seq_len keep
// one token each.
RlReplay grpo_replay(const TrainConfig& config, int64_t micro_batch, int64_t seq_len) {
  RlReplay rl;
  rl.completion_tokens = std::max<int64_t>(1, std::min(config.grpo.max_completion_length, seq_len - 1));
  rl.prompt_tokens = std::max<int64_t>(1, seq_len - rl.completion_tokens);
  rl.train_rows = micro_batch;
  rl.reward_rows = micro_batch;  // RewardModel scores micro_batch_size rows a forward
  rl.reward_model = config.rewards.model;
  rl.reward_adapter = config.rewards.model_adapter;
  rl.reference = config.grpo.beta != 0;
  rl.rollout_logps = config.grpo.num_iterations > 1;
  return rl;
}

// The reward model as RewardModel (trainer/rl/rewards.h) builds it.
std::unique_ptr<CausalLM> make_reward_model(const TrainConfig& config, const RlReplay& rl, Backend& backend) {
  const std::string config_json = (std::filesystem::path(rl.reward_model) / "config.json").string();
  return make_causal_lm(read_model_config(config_json), backend,
                        reward_model_options(model_options(config), rl.reward_adapter));
}

// A model's weights on the device: its resident parameters and, with a
// streamed base, its layer stream's slots.
size_t device_weight_bytes(LanguageModel& model) {
  size_t bytes = 0;
  for (const Parameter& p : model.parameters()) {
    if (p.value.device == Device::cpu) continue;  // a streamed layer's: host memory
    bytes += p.value.size_bytes();
    for (const Tensor& constant : p.quantized.constants) bytes += constant.size_bytes();
  }
  if (const LayerStream* stream = model.layer_stream()) bytes += stream->slot_bytes() * size_t(stream->slot_count());
  return bytes;
}

// The value head as a PPO step reads it: every token's value to the host,
// and in training (with ppo.summary_dropout_prob's dropout) its gradient
// into dhidden (zeros here: memory does not depend on them).
HiddenHead value_head(CausalLM& model, double dropout_p) {
  return [&model, dropout_p](const Tensor& hidden, Tensor* dhidden) {
    const HeadDropout dropout{float(dropout_p), 0};
    const std::vector<float> values = head_outputs(model.backend(), model.output_head(), hidden, dropout);
    if (dhidden)
      head_backward(model.backend(), model.output_head(), hidden, std::vector<float>(values.size()), *dhidden, dropout);
  };
}

// The rollout phases of an online-RL step, after its policy step (what they
// hold then, the optimizer state included, is what every later step's hold):
// the rollout's generation, with PPO the policy's values forward (GRPO with
// grpo.num_iterations > 1: its log-probabilities), the
// reference forward (rows of prompt + completion, micro_batch at a time),
// the reward model's scores.
void replay_rl_phases(StepPlan& plan, PeakWatch& watch, CausalLM& model, CausalLM* reward_model,
                      const RlReplay& rl, int64_t micro_batch) {
  HostAllocator host;
  const int64_t tokens = rl.prompt_tokens + rl.completion_tokens - 1;
  Tensor ids = Tensor::empty({micro_batch, tokens}, DType::i32, host, MemCategory::activations);
  std::fill_n(ids.ptr<int32_t>(), ids.numel(), 0);
  const Tensor& targets = ids;
  watch.start_phase("rollout");
  replay_generation(model, micro_batch, rl.prompt_tokens, rl.completion_tokens);
  plan.phases.push_back({"rollout", watch.phase_peak_bytes});
  if (rl.value_head || rl.rollout_logps) {
    const char* name = rl.value_head ? "rollout values" : "rollout log-probabilities";
    watch.start_phase(name);
    const HiddenHead values = value_head(model, 0.0);  // eval mode: no dropout
    model.token_logps(ids, targets, nullptr, rl.value_head ? &values : nullptr);
    plan.phases.push_back({name, watch.phase_peak_bytes});
  }
  if (rl.reference) {
    watch.start_phase("reference");
    AdaptersDisabled off(model);
    model.token_logps(ids, targets);
    plan.phases.push_back({"reference", watch.phase_peak_bytes});
  }
  if (reward_model) {
    watch.start_phase("reward");
    const int64_t length = rl.prompt_tokens + rl.completion_tokens;
    ScoredRows rows{Tensor::empty({rl.reward_rows, length}, DType::i32, host, MemCategory::activations),
                    std::vector<int64_t>(size_t(rl.reward_rows), length - 1)};
    std::fill_n(rows.ids.ptr<int32_t>(), rows.ids.numel(), 0);
    sequence_scores(*reward_model, rows);
    plan.phases.push_back({"reward", watch.phase_peak_bytes});
  }
}

// A pipeline stage's share of 1F1B: in_flight micro-batches' forwards, then
// their backwards, oldest first. A stage after the first receives each input
// (and a stage before the last each d(output)) into a new activations
// tensor; what it sends on is freed once sent.
void replay_stage(CausalLM& model, Backend& backend, const Tensor& ids, const Tensor& targets,
                  const Tensor* position_ids, int64_t in_flight) {
  const Shape hidden{ids.dim(0), ids.dim(1), model.config().hidden_size};
  const DType activation_dtype = model.options().activation_dtype;
  auto received = [&] { return backend.empty(hidden, activation_dtype, MemCategory::activations); };
  std::vector<std::unique_ptr<CausalLM::DecoderStep>> passes;
  for (int64_t k = 0; k < in_flight; ++k) {
    Tensor output;
    float loss = 0.0f;
    passes.push_back(
        model.stage_forward(ids, targets, position_ids, model.first_stage() ? Tensor{} : received(), &output, 1.0f,
                            &loss));
  }
  for (std::unique_ptr<CausalLM::DecoderStep>& pass : passes) {
    model.stage_backward(*pass, model.last_stage() ? Tensor{} : received());
    pass.reset();
  }
}

// One micro-batch of the step's training: every target counts, so nothing
// is skipped. objective: dpo: micro_batch pairs, a chosen and a rejected row
// each, and the reference forward (adapters off, transient activations)
// before the policy's forward and backward, as dpo_train_step runs them;
// objective: reward: the pairs through the score head (reward_micro_batch);
// online RL (rl): the policy's token_logps_backward over the completions,
// PPO's value head trained beside it.
void replay_micro_batch(const TrainConfig& config, LanguageModel& model, const Batch& batch, int64_t micro_batch,
                        const RlReplay* rl) {
  const float grad_scale = 1.0f;
  if (rl) {
    CausalLM& policy = causal_lm(model, "online RL");
    const TokenLogpsGradient zeros = [](const std::vector<float>& logps) { return std::vector<float>(logps.size()); };
    const HiddenHead values = value_head(policy, config.ppo.summary_dropout_prob);
    policy.token_logps_backward(batch.input_ids, batch.targets, zeros, nullptr, rl->value_head ? &values : nullptr);
  } else if (config.objective == Objective::dpo) {
    dpo_micro_batch(causal_lm(model, "objective: dpo"), batch, config.dpo, true, 1.0 / double(micro_batch));
  } else if (config.objective == Objective::reward) {
    reward_micro_batch(causal_lm(model, "objective: reward"), batch, 0, true, 1.0 / double(micro_batch));
  } else {
    micro_batch_loss(model, batch, &grad_scale);
  }
}

// plan_step, or with a stage (end_layer > 0) that pipeline stage's replay
// holding in_flight micro-batches; with rl, an online-RL step's.
StepPlan replay_step(const TrainConfig& config, const PlanOptions& options, int64_t micro_batch, int64_t seq_len,
                     const LayerRange& stage, int64_t in_flight, const RlReplay* rl = nullptr) {
  const ModelConfig model_config =
      read_model_config((std::filesystem::path(config.model) / "config.json").string());
  FT_CHECK(config.offload_activations == OffloadTarget::device || options.policy == MemoryPolicy::cuda,
           config.source, ": offload.activations: host moves the checkpoints from a GPU to host memory; a CPU plan "
           "keeps them in host memory already");
  MetaAllocator meta;
  TrackingAllocator host_state(meta);  // offloaded optimizer state: host memory, not the device's
  CachingModelAllocator caching;
  const bool cuda = options.policy == MemoryPolicy::cuda;
  TrackingAllocator tracker(cuda ? static_cast<Allocator&>(caching) : meta);
  PeakWatch watch(tracker, cuda ? &caching : nullptr);
  MetaBackend backend(watch, options.policy, options.gemm_workspace_bytes, options.library_attention,
                      options.library_int8_gemm);
  watch.backend = &backend;

  // As a run builds it, minus reading weights: the meta device has no values.
  watch.phase = "model weights";
  // parallel.shard_optimizer: rank 0's share of AdamW's state over the data-parallel ranks.
  OptimizerShard shard;
  if (config.parallel.shard_optimizer)
    shard.ranks = parallel_layout(config, options.ranks, "--ranks " + std::to_string(options.ranks)).data;
  const std::optional<OutputHead> head = rl && rl->value_head ? std::optional(OutputHead::value) : std::nullopt;
  // parallel.tensor: rank 0's share of every layer (it also holds the row-parallel biases).
  PlannedTensorGroup tensor(0, config.parallel.tensor);
  TrainingSetup setup = setup_training(config, model_config, backend,
                                       [&](LanguageModel&) { watch.phase = "gradients and optimizer state"; },
                                       &host_state, stage, shard, head, config.parallel.tensor > 1 ? &tensor : nullptr);
  LanguageModel& model = *setup.model;
  std::unique_ptr<CausalLM> reward_model;
  if (rl && !rl->reward_model.empty()) {
    watch.phase = "reward model weights";
    reward_model = make_reward_model(config, *rl, backend);
  }

  // Pairs (objective: dpo, reward) take two rows each; an online-RL row is
  // a rollout's prompt and completion, inputs and next-token targets.
  const bool pairs = config.objective == Objective::dpo || config.objective == Objective::reward;
  const int64_t rows = pairs ? 2 * micro_batch : rl ? rl->train_rows : micro_batch;
  const int64_t tokens = rl ? rl->prompt_tokens + rl->completion_tokens - 1 : seq_len;
  HostAllocator host;
  Tensor ids = Tensor::empty({rows, tokens}, DType::i32, host, MemCategory::activations);
  Tensor targets = Tensor::empty({rows, tokens}, DType::i32, host, MemCategory::activations);
  for (int64_t i = 0; i < ids.numel(); ++i) ids.ptr<int32_t>()[i] = targets.ptr<int32_t>()[i] = 0;
  // Padding-free packing: position 0 everywhere, every token an example of
  // its own, is the most sequences a micro-batch can hold: the largest
  // cu_seqlens, and attention on the kernels that take it.
  const Tensor position_ids = config.data.packing == Packing::padding_free && !rl ? ids : Tensor{};
  auto micro_batch_step = [&] {
    replay_micro_batch(config, model, Batch{ids, targets, ids.numel(), position_ids}, micro_batch, rl);
  };
  watch.phase = "training step";
  backend.reset_cursor();
  model.zero_grads();
  model.set_dropout_seed(config.seed);
  if (stage.end_layer > 0)
    replay_stage(causal_lm(model, "parallel.pipeline"), backend, ids, targets, position_ids.defined() ? &position_ids : nullptr,
                 in_flight);
  else micro_batch_step();
  const size_t tensor_sum_bytes = tensor.summed_bytes();
  watch.phase = "optimizer step";
  setup.optimizer->step(config.lr);
  // A streamed base: the next micro-batch's copies, with the ring as the
  // last one left it (its allocations repeat the first's, so the peak stays).
  const LayerStream* stream = model.layer_stream();
  const size_t cold_copied_bytes = stream ? stream->copied_bytes() : 0;
  if (stream && options.plan_stream_traffic) {
    watch.phase = "second micro-batch";
    micro_batch_step();
  }

  StepPlan plan;
  plan.micro_batch = micro_batch;
  plan.seq_len = seq_len;
  plan.tensor_sum_bytes = tensor_sum_bytes;
  for (const Parameter* p : setup.trainable)
    if (p->partial_grad) plan.tensor_gradient_bytes += p->grad.size_bytes();
  split_weights(plan, model);
  const LayerFlops flops = layer_flops(model, config, micro_batch, seq_len);
  plan.layer_flops = flops.forward + flops.backward;
  plan.lm_head_flops = flops.lm_head;
  if (stream) {
    StreamPlan& s = plan.stream;
    s.layers = model_config.num_hidden_layers;
    s.streamed_layers = int64_t(stream->layer_count());
    s.resident_layers = s.layers - s.streamed_layers;
    s.slots = stream->slot_count();
    s.layer_bytes = stream->layer_bytes(0);
    s.host_bytes = backend.pinned_host_allocator().stats().current(MemCategory::weights);
    s.ring_bytes = stream->slot_bytes() * size_t(s.slots);
    s.pcie_bytes = stream->copied_bytes() - cold_copied_bytes;
    if (options.plan_stream_traffic) model_stream_time(s, flops, options);
  }
  plan.reward_model_bytes = reward_model ? device_weight_bytes(*reward_model) : 0;
  FT_CHECK(plan.quantized_weight_bytes + plan.quantized_constant_bytes + plan.dense_weight_bytes +
                   plan.stream.ring_bytes + plan.reward_model_bytes ==
               watch.at_peak.current(MemCategory::weights),
           "plan: the weights category holds more than the model's parameters");
  plan.at_peak = watch.at_peak;
  plan.peak_bytes = watch.peak_bytes;
  plan.reserved_bytes = cuda ? caching.reserved_bytes() : 0;
  plan.context_bytes = cuda ? options.context_reserve_bytes : 0;
  plan.where = describe_peak(watch, model);
  if (!model.adapters().empty()) plan.adapter_dtype = model.adapters().front().value.dtype;
  plan.host_optimizer_bytes = host_state.stats().current(MemCategory::optimizer);
  if (rl && stage.end_layer == 0)
    replay_rl_phases(plan, watch, causal_lm(model, "online RL"), reward_model.get(), *rl, micro_batch);
  if (stage.end_layer == 0) replay_run_phases(plan, watch, config, model, *setup.optimizer, ids, targets, rl);
  if (const CausalLM* causal = model.as_causal_lm(); causal && causal->activation_offload_state())
    model_activation_offload(plan, model, *causal->activation_offload_state(), flops, options);
  return plan;
}

}  // namespace

size_t StepPlan::run_peak_bytes() const {
  size_t peak = peak_bytes;
  for (const PhasePeak& p : phases) peak = std::max(peak, p.peak_bytes);
  return peak;
}

std::string StepPlan::run_peak_phase() const {
  std::string phase = "the training step";
  size_t peak = peak_bytes;
  for (const PhasePeak& p : phases)
    if (p.peak_bytes > peak) peak = p.peak_bytes, phase = p.phase;
  return phase;
}

StepPlan plan_step(const TrainConfig& config, const PlanOptions& options, int64_t micro_batch, int64_t seq_len) {
  if (config.objective == Objective::grpo) {
    const RlReplay rl = grpo_replay(config, micro_batch, seq_len);
    return replay_step(config, options, micro_batch, seq_len, LayerRange{}, 1, &rl);
  }
  if (config.objective == Objective::ppo) return plan_ppo_step(config, options, ppo_plan(config, micro_batch, seq_len));
  return replay_step(config, options, micro_batch, seq_len, LayerRange{}, 1);
}

PpoPlan ppo_plan(const TrainConfig& config, int64_t micro_batch, int64_t seq_len) {
  PpoPlan ppo;
  ppo.rows = micro_batch;
  ppo.response_tokens = std::max<int64_t>(1, std::min(config.ppo_max_new_tokens, seq_len - 1));
  ppo.prompt_tokens = std::max<int64_t>(1, seq_len - ppo.response_tokens);
  ppo.mini_batch_rows = config.ppo.mini_batch_size;
  ppo.reward_rows = micro_batch;  // RewardModel scores micro_batch_size rows a forward
  ppo.reward_model = config.rewards.model;
  ppo.reward_adapter = config.rewards.model_adapter;
  return ppo;
}

StepPlan plan_ppo_step(const TrainConfig& config, const PlanOptions& options, const PpoPlan& ppo) {
  const ModelConfig model_config =
      read_model_config((std::filesystem::path(config.model) / "config.json").string());
  FT_CHECK(ppo.rows >= 1 && ppo.prompt_tokens >= 1 && ppo.response_tokens >= 1 && ppo.mini_batch_rows >= 0 &&
               ppo.reward_rows >= 0,
           config.source, ": a PPO plan needs at least one row of one prompt and one response token, got ", ppo.rows,
           " rows of ", ppo.prompt_tokens, " + ", ppo.response_tokens);
  const int64_t length = ppo.prompt_tokens + ppo.response_tokens;
  FT_CHECK(length <= model_config.position_limit(), config.source, ": a rollout of ", ppo.prompt_tokens,
           " prompt + ", ppo.response_tokens, " response tokens exceeds the model's max_position_embeddings (",
           model_config.max_position_embeddings, ")");
  RlReplay rl;
  rl.prompt_tokens = ppo.prompt_tokens;
  rl.completion_tokens = ppo.response_tokens;
  rl.train_rows = ppo.mini_batch_rows > 0 ? ppo.mini_batch_rows : ppo.rows;
  rl.reward_rows = ppo.reward_rows > 0 ? ppo.reward_rows : ppo.rows;
  rl.reward_model = ppo.reward_model;
  rl.reward_adapter = ppo.reward_adapter;
  rl.reference = true;
  rl.value_head = true;
  return replay_step(config, options, ppo.rows, length, LayerRange{}, 1, &rl);
}

namespace {

void print_row(const char* label, size_t bytes) {
  std::printf("  %-58s %12s\n", label, format_bytes(bytes).c_str());
}

void print_stream(const StreamPlan& s, size_t host_optimizer_bytes, const PlanOptions& options) {
  std::printf("  layer streaming (offload.base: host): %lld of %lld decoder layers in pinned host memory (%s, %s "
              "each), the last %lld resident, %lld device slots\n",
              (long long)s.streamed_layers, (long long)s.layers, format_bytes(s.host_bytes).c_str(),
              format_bytes(s.layer_bytes).c_str(), (long long)s.resident_layers, (long long)s.slots);
  std::printf("  host memory: streamed layers %s + optimizer state %s = %s (%zu bytes)\n",
              format_bytes(s.host_bytes).c_str(), format_bytes(host_optimizer_bytes).c_str(),
              format_bytes(s.host_bytes + host_optimizer_bytes).c_str(), s.host_bytes + host_optimizer_bytes);
  std::printf("  PCIe host to device per micro-batch: %zu bytes (%s; the ring keeps the last %lld layers of each "
              "pass for the next)\n",
              s.pcie_bytes, format_bytes(s.pcie_bytes).c_str(), (long long)s.slots);
  std::printf("  time model at %.1f GB/s host to device and %.0f TFLOP/s: a layer's copy %.1f ms, its forward %.1f "
              "ms, its backward %.1f ms; the copies stall %.1f ms of a %.2f s micro-batch (%.1f%%)\n",
              options.h2d_bytes_per_s / 1e9, options.flops_per_s / 1e12, 1e3 * s.copy_s, 1e3 * s.forward_s,
              1e3 * s.backward_s, 1e3 * s.stall_s, s.compute_s + s.stall_s, 100.0 * s.stall_fraction());
}

void print_breakdown(const StepPlan& plan, const PlanOptions& options) {
  const MemoryStats& s = plan.at_peak;
  const std::string dense = std::string("dense weights (embeddings, norms, biases, lm_head), ") +
                            dtype_name(plan.dense_weight_dtype);
  const char* resident = plan.stream.layers ? ", resident layers" : "";
  if (plan.quantized_base != QuantizedBase::none) {
    const QuantizedFormat::Names& names = quantized_format(plan.quantized_base).names;
    print_row((std::string(names.codes_row) + resident).c_str(), plan.quantized_weight_bytes);
    print_row(names.constants_row, plan.quantized_constant_bytes);
  }
  if (plan.stream.layers) {
    const std::string ring = "streamed layers' device ring (" + std::to_string(plan.stream.slots) + " slots)";
    print_row(ring.c_str(), plan.stream.ring_bytes);
  }
  print_row(dense.c_str(), plan.dense_weight_bytes);
  if (plan.reward_model_bytes) print_row("reward model (rewards.model, score head): weights", plan.reward_model_bytes);
  print_row((std::string("LoRA adapters (") + dtype_name(plan.adapter_dtype) + ")").c_str(),
            s.current(MemCategory::adapters));
  print_row("gradients (f32)", s.current(MemCategory::gradients));
  print_row(plan.host_optimizer_bytes ? "optimizer state on the device (none: offloaded)"
                                      : "optimizer state (AdamW m, v, f32 masters)",
            s.current(MemCategory::optimizer));
  print_row("activations (saved for backward + the live layer + logits)", s.current(MemCategory::activations));
  print_row(options.policy == MemoryPolicy::cuda ? "workspace (cuBLASLt 32 MiB, int8 scratch, dequant tiles)"
                                                 : "workspace (int8 dequant tiles)",
            s.current(MemCategory::workspace));
  if (options.policy == MemoryPolicy::cuda) {
    print_row("caching-allocator rounding (size classes, 512 B)", plan.peak_bytes - s.total_current_bytes);
    print_row("CUDA context reserve", plan.context_bytes);
  }
  std::printf("  %-58s %12s\n", "----------------------------------------", "----------");
  print_row("peak", plan.peak_bytes + plan.context_bytes);
  std::printf("  peak in bytes: %zu\n", plan.peak_bytes + plan.context_bytes);
  std::printf("  peak at: %s\n", plan.where.c_str());
  for (const StepPlan::PhasePeak& phase : plan.phases)
    std::printf("  %s phase: peak %s (%zu bytes)\n", phase.phase.c_str(),
                format_bytes(phase.peak_bytes + plan.context_bytes).c_str(), phase.peak_bytes + plan.context_bytes);
  if (!plan.phases.empty())
    std::printf("  the run's peak: %s, in %s\n", format_bytes(plan.total_bytes()).c_str(),
                plan.run_peak_phase().c_str());
  if (options.policy == MemoryPolicy::cuda)
    std::printf("  reserved by the caching allocator after the step (cache never flushed): %s\n",
                format_bytes(plan.reserved_bytes + plan.context_bytes).c_str());
  if (plan.host_optimizer_bytes)
    std::printf("  host memory (offload.optimizer: host): AdamW m, v and f32 masters %s; PCIe %s each way per "
                "optimizer step\n",
                format_bytes(plan.host_optimizer_bytes).c_str(), format_bytes(plan.host_optimizer_bytes).c_str());
  if (plan.stream.layers) print_stream(plan.stream, plan.host_optimizer_bytes, options);
  if (plan.host_activation_bytes)
    std::printf("  checkpoint offload (offload.activations: host): %s of pinned host memory (%zu bytes); PCIe %s per "
                "micro-batch, out and back; at %.1f GB/s a checkpoint's copy takes %.1f ms, and the copies stall "
                "%.1f ms of the micro-batch\n",
                format_bytes(plan.host_activation_bytes).c_str(), plan.host_activation_bytes,
                format_bytes(plan.activation_pcie_bytes).c_str(), options.h2d_bytes_per_s / 1e9,
                1e3 * plan.activation_copy_s, 1e3 * plan.activation_stall_s);
}

// "0-19 + embedding", "60-79 + final norm, lm_head, loss", "3" (one layer)
std::string stage_layers_text(const LayerRange& layers, bool first, bool last) {
  std::string text = std::to_string(layers.first_layer);
  if (layers.end_layer - 1 > layers.first_layer) text += '-' + std::to_string(layers.end_layer - 1);
  if (first) text += " + embedding";
  if (last) text += " + final norm, lm_head, loss";
  return text;
}

void print_pipeline(const PipelinePlan& plan, const PlanOptions& options) {
  const int64_t stages = int64_t(plan.stages.size());
  const std::string tensor = plan.tensor > 1 ? " x " + std::to_string(plan.tensor) + " tensor parallel" : "";
  std::printf("pipeline parallel: %lld stages%s x %lld data parallel (%lld ranks), 1F1B over %lld micro-batches per "
              "optimizer step: each stage idles (P - 1) / (m + P - 1) = %lld / %lld = %.1f%% of the step "
              "(the bubble)\n",
              (long long)stages, tensor.c_str(), (long long)plan.data, (long long)options.ranks,
              (long long)plan.micro_batches, (long long)(stages - 1), (long long)(plan.micro_batches + stages - 1),
              100.0 * plan.bubble_fraction);
  std::printf("  %-5s %-36s %9s %15s %12s %14s %5s\n", "stage", "decoder layers", "in flight", "TFLOP/micro-batch",
              "peak", "peak bytes", "fits");
  for (int64_t s = 0; s < stages; ++s) {
    const StagePlan& stage = plan.stages[size_t(s)];
    const size_t peak_bytes = stage.step.total_bytes();
    std::printf("  %-5lld %-36s %9lld %15.1f %12s %14zu %5s\n", (long long)s,
                stage_layers_text(stage.layers, s == 0, s == stages - 1).c_str(), (long long)stage.in_flight,
                stage.flops / 1e12, format_bytes(peak_bytes).c_str(), peak_bytes,
                peak_bytes <= options.gpu_mem_bytes ? "yes" : "NO");
  }
  for (int64_t s = 0; plan.tensor > 1 && s < stages; ++s) {
    const StagePlan& stage = plan.stages[size_t(s)];  // its replay ran in_flight micro-batches
    std::printf("  stage %lld: per micro-batch %s of activations and their gradients summed over its %lld tensor "
                "ranks (f32)\n",
                (long long)s, format_bytes(stage.step.tensor_sum_bytes / size_t(stage.in_flight)).c_str(),
                (long long)plan.tensor);
  }
  if (plan.data == 1) return;
  for (int64_t s = 0; s < stages; ++s) {
    const AllReducePlan all_reduce = plan_all_reduce(plan.stages[size_t(s)].step, plan.data);
    std::printf("  stage %lld: per optimizer step %s of gradients all-reduced over %lld data-parallel ranks, a ring "
                "sends %s per rank (%zu bytes)\n",
                (long long)s, format_bytes(all_reduce.gradient_bytes).c_str(), (long long)plan.data,
                format_bytes(all_reduce.ring_sent_per_rank_bytes).c_str(), all_reduce.ring_sent_per_rank_bytes);
  }
}

// parallel.tensor: what the tensor group sums (measured by the replay's
// PlannedTensorGroup) and, across data-parallel copies, the gradients.
void print_tensor_parallel(const TrainConfig& config, const StepPlan& plan, const ParallelLayout& layout) {
  const int64_t T = layout.tensor;
  const size_t step_bytes = size_t(checked_mul(int64_t(plan.tensor_sum_bytes), config.grad_accum_steps)) +
                            plan.tensor_gradient_bytes;
  const size_t ring_bytes = size_t(checked_mul(int64_t(step_bytes), 2 * (T - 1)) / T);
  std::printf("tensor parallel: every layer split over %lld ranks x %lld data parallel (%lld ranks): each rank's "
              "peak as above (rank 0's); per micro-batch %s of activations and their gradients summed over the "
              "%lld ranks (f32), per optimizer step %s with the partial LoRA gradients, a ring sends %s per rank "
              "(%zu bytes)\n",
              (long long)T, (long long)layout.data, (long long)(T * layout.data),
              format_bytes(plan.tensor_sum_bytes).c_str(), (long long)T, format_bytes(step_bytes).c_str(),
              format_bytes(ring_bytes).c_str(), ring_bytes);
  if (layout.data == 1) return;
  const AllReducePlan all_reduce = plan_all_reduce(plan, layout.data);
  std::printf("  per optimizer step %s of each rank's gradients all-reduced over %lld data-parallel ranks, a ring "
              "sends %s per rank (%zu bytes)\n",
              format_bytes(all_reduce.gradient_bytes).c_str(), (long long)layout.data,
              format_bytes(all_reduce.ring_sent_per_rank_bytes).c_str(), all_reduce.ring_sent_per_rank_bytes);
}

}  // namespace

AllReducePlan plan_all_reduce(const StepPlan& plan, int64_t ranks) {
  FT_CHECK(ranks >= 1, "--ranks must be at least 1, got ", ranks);
  AllReducePlan all_reduce;
  all_reduce.ranks = ranks;
  all_reduce.gradient_bytes = plan.at_peak.current(MemCategory::gradients);
  all_reduce.ring_sent_per_rank_bytes =
      size_t(checked_mul(int64_t(all_reduce.gradient_bytes), 2 * (ranks - 1)) / ranks);
  return all_reduce;
}

namespace {

// One stage's cost for the split, linear in its layer count: bytes from
// replays of a one- and a two-layer stage in its place (its in-flight
// micro-batches, embedding or LM head), FLOPs from the time model.
struct StageCost {
  double fixed_bytes = 0.0, layer_bytes = 0.0, fixed_flops = 0.0, layer_flops = 0.0;
  double bytes(int64_t layers) const { return fixed_bytes + layer_bytes * double(layers); }
  double flops(int64_t layers) const { return fixed_flops + layer_flops * double(layers); }
};

// Stage s of a P-stage pipeline over total layers, holding `layers` of them
// (which ones does not change its bytes: the layers are alike).
LayerRange stage_in_place(int64_t s, int64_t stages, int64_t layers, int64_t total) {
  if (s == 0) return {0, layers};
  if (s == stages - 1) return {total - layers, total};
  return {1, 1 + layers};
}

// Layers per stage minimising the largest max(flops / mean flops, bytes /
// mean bytes) over the stages (the means of an even split), by dynamic
// programming over (stages so far, layers so far).
std::vector<int64_t> balanced_split(const std::vector<StageCost>& costs, int64_t total) {
  const int64_t stages = int64_t(costs.size());
  double flops_sum = 0.0, bytes_sum = 0.0;
  for (const StageCost& c : costs) {
    flops_sum += c.fixed_flops + c.layer_flops * double(total) / double(stages);
    bytes_sum += c.fixed_bytes + c.layer_bytes * double(total) / double(stages);
  }
  auto cost = [&](int64_t s, int64_t layers) {
    const StageCost& c = costs[size_t(s)];
    return std::max(c.flops(layers) * double(stages) / flops_sum, c.bytes(layers) * double(stages) / bytes_sum);
  };
  const double none = std::numeric_limits<double>::infinity();
  // best[s][l]: the least largest cost of stages 0..s over layers 0..l-1; last[s][l]: stage s's layers then.
  std::vector<std::vector<double>> best(size_t(stages), std::vector<double>(size_t(total) + 1, none));
  std::vector<std::vector<int64_t>> last(size_t(stages), std::vector<int64_t>(size_t(total) + 1, 0));
  for (int64_t l = 1; l <= total; ++l) {
    best[0][size_t(l)] = cost(0, l);
    last[0][size_t(l)] = l;
  }
  for (int64_t s = 1; s < stages; ++s)
    for (int64_t l = s + 1; l <= total; ++l)
      for (int64_t n = 1; n <= l - s; ++n) {
        const double candidate = std::max(best[size_t(s - 1)][size_t(l - n)], cost(s, n));
        if (candidate < best[size_t(s)][size_t(l)]) {
          best[size_t(s)][size_t(l)] = candidate;
          last[size_t(s)][size_t(l)] = n;
        }
      }
  std::vector<int64_t> counts(static_cast<size_t>(stages), 0);
  int64_t layers_left = total;
  for (int64_t s = stages - 1; s >= 0; --s) {
    counts[size_t(s)] = last[size_t(s)][size_t(layers_left)];
    layers_left -= counts[size_t(s)];
  }
  return counts;
}

}  // namespace

PipelinePlan plan_pipeline(const TrainConfig& config, const PlanOptions& options) {
  const ModelConfig model_config =
      read_model_config((std::filesystem::path(config.model) / "config.json").string());
  const int64_t stages = config.parallel.pipeline, total = model_config.num_hidden_layers;
  check_pipeline_model(config, model_config.model_type);
  FT_CHECK(stages <= total, config.source, ": parallel.pipeline: ", stages,
           " stages need at least one decoder layer each; the model has ", total);
  PipelinePlan plan;
  const ParallelLayout layout = parallel_layout(config, options.ranks, "--ranks " + std::to_string(options.ranks));
  plan.data = layout.data;
  plan.tensor = layout.tensor;
  plan.micro_batches = config.grad_accum_steps;
  plan.bubble_fraction = double(stages - 1) / double(plan.micro_batches + stages - 1);
  auto replay = [&](const LayerRange& layers, int64_t s) {
    return replay_step(config, options, config.micro_batch_size, config.seq_len, layers, stages - s);
  };
  std::vector<int64_t> counts(size_t(stages), 1);
  if (total > stages) {
    std::vector<StageCost> costs;
    for (int64_t s = 0; s < stages; ++s) {
      const StepPlan one = replay(stage_in_place(s, stages, 1, total), s);
      const StepPlan two = replay(stage_in_place(s, stages, 2, total), s);
      StageCost c;
      c.layer_bytes = double(two.total_bytes()) - double(one.total_bytes());
      c.fixed_bytes = double(one.total_bytes()) - c.layer_bytes;
      c.layer_flops = one.layer_flops;
      c.fixed_flops = s == stages - 1 ? one.lm_head_flops : 0.0;
      costs.push_back(c);
    }
    counts = balanced_split(costs, total);
  }
  int64_t first = 0;
  for (int64_t s = 0; s < stages; ++s) {
    StagePlan stage;
    stage.layers = {first, first + counts[size_t(s)]};
    stage.in_flight = stages - s;
    stage.step = replay(stage.layers, s);
    stage.flops = double(counts[size_t(s)]) * stage.step.layer_flops;
    if (s == stages - 1) stage.flops += stage.step.lm_head_flops;
    plan.stages.push_back(stage);
    first = stage.layers.end_layer;
  }
  return plan;
}

StageLayout pipeline_stage_layout(const TrainConfig& config, int64_t world_ranks, int stage, bool on_gpu) {
  PlanOptions options;
  options.policy = on_gpu ? MemoryPolicy::cuda : MemoryPolicy::cpu;
  options.ranks = world_ranks;
  const PipelinePlan plan = plan_pipeline(config, options);
  StageLayout layout;
  layout.layers = plan.stages[size_t(stage)].layers;
  std::ostringstream text;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const LayerRange& layers = plan.stages[s].layers;
    text << (s ? ", " : "") << "stage " << s << ": layer";
    if (layers.end_layer - layers.first_layer == 1) text << " " << layers.first_layer;
    else text << "s " << layers.first_layer << "-" << layers.end_layer - 1;
  }
  text << "; 1F1B bubble " << std::lround(100.0 * plan.bubble_fraction) << "% of each step";
  layout.description = text.str();
  return layout;
}

std::string mode_name(const PlanMode& mode) {
  std::string base = mode.quantization == QuantizedBase::none ? "unquantised base" : enum_name(mode.quantization);
  if (mode.base == OffloadTarget::host) base += " streamed (" + std::to_string(mode.resident_layers) + " resident)";
  return base + (mode.optimizer == OffloadTarget::host ? ", optimizer state on the host" : "");
}

namespace {

// The largest power of two in [1, limit] for which fits(value) holds, given
// that it holds for every value below one that does; 0 when it fails at 1.
template <class Fits>
int64_t largest_power_of_two(int64_t limit, const Fits& fits) {
  int64_t low = 0, high = 0;  // exponents: 2^low fits (once checked), 2^high is the last candidate
  while ((int64_t(1) << (high + 1)) <= limit) ++high;
  if (!fits(1)) return 0;
  while (low < high) {
    const int64_t middle = (low + high + 1) / 2;
    if (fits(int64_t(1) << middle)) low = middle;
    else high = middle - 1;
  }
  return int64_t(1) << low;
}

// The largest multiple of step in [step, limit] for which fits holds (0 if
// none), fits holding for every value below one that does.
template <class Fits>
int64_t largest_multiple(int64_t step, int64_t limit, const Fits& fits) {
  int64_t low = 0, high = limit / step;  // multiples: low * step fits (or is 0)
  while (low < high) {
    const int64_t middle = (low + high + 1) / 2;
    if (fits(middle * step)) low = middle;
    else high = middle - 1;
  }
  return low * step;
}

// What a plan's peak is spent on, largest first: the weights and their
// training state, the per-layer checkpoints the step holds (layer inputs,
// B x T x C each: every layer's under per-layer checkpointing, at most two
// with them offloaded), and the rest of the activations, which the live
// layer and the logits take.
std::string peak_split(const StepPlan& plan, const TrainConfig& config, const ModelConfig& model) {
  const MemoryStats& s = plan.at_peak;
  const size_t state = s.current(MemCategory::weights) + s.current(MemCategory::adapters) +
                       s.current(MemCategory::gradients) + s.current(MemCategory::optimizer);
  const size_t checkpoint = size_t(plan.micro_batch * plan.seq_len * model.hidden_size) *
                            (config.precision == Precision::bf16 ? 2 : 4);
  const bool checkpointed = config.activation_checkpointing == ActivationCheckpointing::per_layer;
  const size_t held = !checkpointed ? 0
                      : config.offload_activations == OffloadTarget::host
                          ? 2 * checkpoint
                          : size_t(model.num_hidden_layers) * checkpoint;
  const size_t activations = s.current(MemCategory::activations), checkpoints = std::min(held, activations);
  std::vector<std::pair<size_t, std::string>> parts = {
      {state, "weights and training state"},
      {checkpoints, "checkpoints"},
      {activations - checkpoints, checkpointed ? "the live layer and logits" : "saved activations and logits"},
      {s.current(MemCategory::workspace), "workspace"}};
  std::stable_sort(parts.begin(), parts.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string text;
  for (const auto& [bytes, name] : parts)
    if (bytes) text += (text.empty() ? "" : ", ") + name + " " + format_bytes(bytes);
  return text;
}

size_t step_bytes(const TrainConfig& config, const PlanOptions& options, int64_t batch, int64_t seq) {
  PlanOptions peak_only = options;
  peak_only.plan_stream_traffic = false;
  return plan_step(config, peak_only, batch, seq).total_bytes();
}

bool step_fits(const TrainConfig& config, const PlanOptions& options, int64_t batch, int64_t seq) {
  return step_bytes(config, options, batch, seq) <= options.gpu_mem_bytes;
}

TrainConfig with_mode(const TrainConfig& config, const PlanMode& mode) {
  TrainConfig moded = config;
  moded.quantization.mode = mode.quantization;
  moded.offload_optimizer = mode.optimizer;
  moded.offload_base = mode.base;
  moded.resident_layers = mode.base == OffloadTarget::host ? mode.resident_layers : 0;
  if (mode.base == OffloadTarget::device) moded.stream_slots = 2;
  return moded;
}

// A streamed mode at the config's size keeps the most resident layers that
// fit; its largest sizes are searched with every layer streamed.
ModeFit fit_mode(const TrainConfig& config, const PlanOptions& options, PlanMode mode, int64_t max_seq_len) {
  if (mode.base == OffloadTarget::host)
    mode.resident_layers =
        std::max<int64_t>(0, fit_resident_layers(with_mode(config, mode), options, config.micro_batch_size,
                                                 config.seq_len));
  PlanMode searched = mode;
  searched.resident_layers = 0;
  const TrainConfig moded = with_mode(config, searched);
  auto fits = [&](int64_t batch, int64_t seq) { return step_fits(moded, options, batch, seq); };
  ModeFit fit;
  fit.mode = mode;
  const StepPlan plan = plan_step(with_mode(config, mode), options, config.micro_batch_size, config.seq_len);
  fit.bytes = plan.total_bytes();
  fit.stream = plan.stream;
  fit.fits = fit.bytes <= options.gpu_mem_bytes;
  if (options.exact_seq_len) {
    fit.largest_seq_len = largest_multiple(kSeqLenStep, max_seq_len, [&](int64_t seq) { return fits(1, seq); });
    const int64_t next = fit.largest_seq_len + kSeqLenStep;
    if (next <= max_seq_len) {
      PlanOptions peak_only = options;
      peak_only.plan_stream_traffic = false;
      const ModelConfig model = read_model_config((std::filesystem::path(config.model) / "config.json").string());
      fit.seq_len_limit = "at " + std::to_string(next) + ": " +
                          peak_split(plan_step(moded, peak_only, 1, next), moded, model);
    }
  } else {
    fit.largest_seq_len = largest_power_of_two(max_seq_len, [&](int64_t seq) { return fits(1, seq); });
  }
  if (fit.largest_seq_len > 0)
    fit.largest_micro_batch = largest_power_of_two(1024, [&](int64_t batch) { return fits(batch, config.seq_len); });
  return fit;
}

std::string power_or_dash(int64_t value) { return value ? std::to_string(value) : "-"; }

}  // namespace

int64_t fit_resident_layers(const TrainConfig& config, const PlanOptions& options, int64_t micro_batch,
                            int64_t seq_len) {
  const ModelConfig model_config =
      read_model_config((std::filesystem::path(config.model) / "config.json").string());
  TrainConfig streamed = config;
  streamed.offload_base = OffloadTarget::host;
  auto bytes = [&](int64_t resident) {
    streamed.resident_layers = resident;
    return step_bytes(streamed, options, micro_batch, seq_len);
  };
  const size_t budget = options.gpu_mem_bytes, all_streamed = bytes(0);
  const int64_t most = model_config.num_hidden_layers - 1;
  if (all_streamed > budget) return -1;
  if (most == 0) return 0;
  // Each resident layer adds its weights to a peak that holds them all
  // along; the estimate is then checked both ways.
  const size_t one_resident = bytes(1);
  const size_t per_layer = std::max<size_t>(1, one_resident - std::min(one_resident, all_streamed));
  int64_t resident = std::min<int64_t>(most, int64_t((budget - all_streamed) / per_layer));
  while (resident > 0 && bytes(resident) > budget) --resident;
  while (resident < most && bytes(resident + 1) <= budget) ++resident;
  return resident;
}

std::vector<ModeFit> fit_modes(const TrainConfig& config, const PlanOptions& options) {
  const ModelConfig model_config =
      read_model_config((std::filesystem::path(config.model) / "config.json").string());
  std::vector<PlanMode> modes;
  const bool lora = config.trainable == Trainable::lora;
  // Tensor-parallel ranks each hold their share of every layer, and a T5 keeps
  // its base on the device (setup_training): nothing to stream. DoRA's
  // magnitudes start from the base's row norms, which a streamed base does
  // not hold at start.
  const bool streams = config.parallel.tensor == 1 && !config.lora.use_dora &&
                       model_family(model_config.model_type).kind != ModelKind::seq2seq;
  // A checkpoint saved quantised (config.json's quantization_config) loads in its own format only.
  const QuantizedBase stored = model_config.stored_quantization.format;
  for (OffloadTarget base : {OffloadTarget::device, OffloadTarget::host})
    for (QuantizedBase quantization : kQuantizedBases) {
      if ((!lora && quantization != QuantizedBase::none) || (stored != QuantizedBase::none && quantization != stored) ||
          (base == OffloadTarget::host && (quantization == QuantizedBase::none || !streams)))
        continue;
      for (OffloadTarget optimizer : {OffloadTarget::device, OffloadTarget::host})
        modes.push_back(PlanMode{quantization, optimizer, base, 0});
    }
  std::vector<ModeFit> fits;
  for (const PlanMode& mode : modes)
    fits.push_back(
        fit_mode(config, options, mode, std::min(longest_seq_len(config, model_config), kLongestFitSeqLen)));
  return fits;
}

void print_plan(const TrainConfig& config, const PlanOptions& options) {
  const bool cuda = options.policy == MemoryPolicy::cuda;
  const ModelConfig model_config =
      read_model_config((std::filesystem::path(config.model) / "config.json").string());
  check_seq_len(config, model_config);  // as a run refuses it
  check_stored_quantization(model_config.stored_quantization, model_options(config));  // as its load refuses it
  FT_CHECK(config.objective != Objective::ppo || model_family(model_config.model_type).kind == ModelKind::causal,
           config.source, ": objective: ppo on a ", model_config.model_type, " (encoder-decoder) policy is not "
           "planned: the planner replays decoder-only rollouts (the run itself trains)");
  std::printf("memory plan: %s, %s %lld layers, on %s, micro_batch %lld x seq_len %lld%s\n", config.source.c_str(),
              model_config.model_type.c_str(), (long long)model_config.num_hidden_layers, cuda ? "cuda" : "cpu",
              (long long)config.micro_batch_size, (long long)config.seq_len,
              config.objective == Objective::dpo
                  ? " (DPO: micro_batch counts pairs; the reference forward, adapters off, runs first)"
              : config.objective == Objective::reward ? " (reward: micro_batch counts pairs, scored by the score head)"
              : config.objective == Objective::grpo
                  ? " (GRPO: micro_batch completions; the rollout, reference and reward model as phases)"
              : config.objective == Objective::ppo
                  ? " (PPO: micro_batch rollouts generated and scored at once, ppo.mini_batch_size trained; the "
                    "rollout, its values, the reference and the reward model as phases)"
                  : "");
  if (config.evaluate_only)
    std::printf("  train: false: nothing trainable, no gradients or AdamW state; the step planned below (the frozen "
                "model's forward and backward) holds more than its evaluation\n");
  // First: a layout the model or the ranks cannot take is the one error.
  const PipelinePlan pipeline = config.parallel.pipeline > 1 ? plan_pipeline(config, options) : PipelinePlan{};
  const ParallelLayout layout = config.parallel.tensor > 1 ? parallel_layout(config, options.ranks, "--ranks " +
                                                                             std::to_string(options.ranks))
                                                            : ParallelLayout{};
  check_tensor_parallel_model(config, read_model_config(config.model + "/config.json"));
  const StepPlan plan = plan_step(config, options, config.micro_batch_size, config.seq_len);
  print_breakdown(plan, options);
  const size_t budget = options.gpu_mem_bytes;
  const bool fits = plan.total_bytes() <= budget;
  std::printf("  fits in %s: %s (%s %s)\n", format_bytes(budget).c_str(), fits ? "yes" : "NO",
              format_bytes(fits ? budget - plan.total_bytes() : plan.total_bytes() - budget).c_str(),
              fits ? "to spare" : "over");
  if (config.offload_base == OffloadTarget::host) {
    const int64_t resident = fit_resident_layers(config, options, config.micro_batch_size, config.seq_len);
    std::printf("  offload.resident_layers that fit in %s: %s (this config: %lld, %lld device slots)\n",
                format_bytes(budget).c_str(), resident < 0 ? "none (not even all streamed)" :
                std::to_string(resident).c_str(), (long long)config.resident_layers, (long long)config.stream_slots);
  }

  if (config.parallel.pipeline > 1) {
    print_pipeline(pipeline, options);
  } else if (layout.tensor > 1) {
    print_tensor_parallel(config, plan, layout);
  } else if (options.ranks > 1) {
    const AllReducePlan all_reduce = plan_all_reduce(plan, options.ranks);
    std::printf("data parallel on %lld ranks: each rank's peak as above%s; per optimizer step %s of gradients "
                "all-reduced (%zu bytes), a ring sends %s per rank (%zu bytes)\n",
                (long long)options.ranks,
                config.parallel.shard_optimizer ? " (AdamW state sharded, ZeRO-1: rank 0's share)" : "",
                format_bytes(all_reduce.gradient_bytes).c_str(), all_reduce.gradient_bytes,
                format_bytes(all_reduce.ring_sent_per_rank_bytes).c_str(), all_reduce.ring_sent_per_rank_bytes);
  }

  const std::vector<ModeFit> modes = fit_modes(config, options);
  const std::string at = std::to_string(config.micro_batch_size) + " x " + std::to_string(config.seq_len);
  const std::string at_text = "micro_batch " + std::to_string(config.micro_batch_size) + " x seq_len " +
                              std::to_string(config.seq_len);
  std::printf("modes in %s (largest %s that fit):\n", format_bytes(budget).c_str(),
              options.exact_seq_len ? "seq_len multiples of 256 and micro_batch powers of two" : "powers of two");
  std::printf("  %-58s %12s %5s %24s %28s\n", "mode", ("at " + at).c_str(), "fits", "seq_len at micro_batch 1",
              ("micro_batch at seq_len " + std::to_string(config.seq_len)).c_str());
  const ModeFit* best = nullptr;
  for (const ModeFit& fit : modes) {
    std::printf("  %-58s %12s %5s %24s %28s\n", mode_name(fit.mode).c_str(), format_bytes(fit.bytes).c_str(),
                fit.fits ? "yes" : "no", power_or_dash(fit.largest_seq_len).c_str(),
                power_or_dash(fit.largest_micro_batch).c_str());
    if (!fit.seq_len_limit.empty()) std::printf("    %s\n", fit.seq_len_limit.c_str());
    if (fit.fits && !best) best = &fit;
  }
  if (best && best->mode.base == OffloadTarget::host)
    std::printf("best mode: %s (%s at %s; PCIe %s per micro-batch, the copies stall %.1f%% of it)\n",
                mode_name(best->mode).c_str(), format_bytes(best->bytes).c_str(), at_text.c_str(),
                format_bytes(best->stream.pcie_bytes).c_str(), 100.0 * best->stream.stall_fraction());
  else if (best)
    std::printf("best mode: %s (%s at %s)\n", mode_name(best->mode).c_str(), format_bytes(best->bytes).c_str(),
                at_text.c_str());
  else
    std::printf("best mode: none fits %s in %s\n", at_text.c_str(), format_bytes(budget).c_str());
}

TrainConfig plan_config_for_model(const std::string& path, const std::vector<std::string>& overrides) {
  namespace fs = std::filesystem;
  const fs::path json = fs::is_directory(path) ? fs::path(path) / "config.json" : fs::path(path);
  const ModelConfig model_config = read_model_config(json.string());
  const int64_t seq_len = std::min<int64_t>(2048, model_config.max_position_embeddings);
  // A T5 keeps every activation of a step (model/t5.h): no checkpointing.
  const bool seq2seq = model_family(model_config.model_type).kind == ModelKind::seq2seq;
  std::string yaml = "model: " + fs::absolute(json.parent_path()).string() +
                     "\ndata: {train: unused.jsonl}\nprecision: bf16\nactivation_checkpointing: " +
                     (seq2seq ? "none" : "per_layer") + "\nloss_chunk_tokens: 512\nmicro_batch_size: 1\nseq_len: " +
                     std::to_string(seq_len) + "\n";
  // A checkpoint saved quantised (bitsandbytes, or our quantization.save_base) trains in its own format.
  const StoredQuantization& stored = model_config.stored_quantization;
  if (stored.format != QuantizedBase::none)
    yaml += std::string("quantization: {mode: ") + quantized_format(stored.format).names.mode +
            (stored.double_quant ? ", double_quant: true" : "") + "}\n";
  return parse_train_config(yaml, json.string(), overrides);
}

size_t parse_byte_size(const std::string& text) {
  static const std::unordered_map<std::string, double> units = {
      {"", 1.0},         {"b", 1.0},        {"kib", 0x1p10},  {"mib", 0x1p20}, {"gib", 0x1p30},
      {"tib", 0x1p40},   {"kb", 1e3},       {"mb", 1e6},      {"gb", 1e9},     {"tb", 1e12}};
  size_t used = 0;
  double value = 0.0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    fail("\"", text, "\" is not a size (expected e.g. 24GiB, 512MiB, 2GB)");
  }
  std::string unit;
  for (size_t i = used; i < text.size(); ++i)
    if (!std::isspace(static_cast<unsigned char>(text[i]))) unit += char(std::tolower(static_cast<unsigned char>(text[i])));
  auto it = units.find(unit);
  FT_CHECK(it != units.end() && value >= 0.0, "\"", text, "\" is not a size (expected e.g. 24GiB, 512MiB, 2GB)");
  // Below 1 EiB: any real memory, and far from size_t's limit (inf or 1e30GiB
  // would overflow the conversion).
  const double bytes = value * it->second;
  FT_CHECK(std::isfinite(bytes) && bytes < 0x1p60, "\"", text, "\" is not a size below 1 EiB");
  return size_t(bytes);
}

}  // namespace ft
