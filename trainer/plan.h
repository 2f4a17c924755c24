// The memory planner behind `finetune plan`: builds the config's model from
// config.json alone on the meta device (kernels/meta/), with the same options,
// trainable set and AdamW as a real run (trainer.h), runs one training step
// (forward_backward on a dummy batch; objective: dpo the reference forward and
// the policy's step over micro_batch pairs; objective: reward the score
// head's step over micro_batch pairs; objective: grpo the policy's
// token_logps_backward over micro_batch completions, with the rollout, the
// reference and the reward model as phases; objective: ppo plan_ppo_step's
// step and phases; then the optimizer step) through
// the same code, and reports what the allocator held at the step's peak. No
// weights, tokenizer or data are read.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/meta/meta_backend.h"
#include "trainer/train_config.h"

namespace ft {

struct PlanOptions {
  MemoryPolicy policy = MemoryPolicy::cuda;
  size_t gpu_mem_bytes = size_t(24) << 30;
  size_t context_reserve_bytes = size_t(768) << 20;  // CUDA context + cuBLASLt handles; cuda policy only
  // cuda policy: cuBLASLt's workspace; 0 plans the emulator's tiled GEMM.
  size_t gemm_workspace_bytes = cuda::kCublasLtWorkspaceBytes;
  // cuda policy: bf16 attention on cuDNN SDPA with its workspace budget;
  // false plans our attention kernels alone (the emulator, builds without cuDNN).
  bool library_attention = true;
  // cuda policy: the INT8 forward fused on CUTLASS's int8 GEMM, which only an
  // sm_90 GPU (H100, H200) runs; false plans the unfused forward of every
  // other card (the 24 GB ones among them), whose scratch is the larger.
  bool library_int8_gemm = false;
  // The job's ranks, parallel.data x parallel.pipeline: print_plan adds the
  // data-parallel all-reduce traffic, and the pipeline stages' plans.
  int64_t ranks = 1;
  // offload.base: host's time model: host-to-device bandwidth (PCIe 4.0 x16
  // moves about 25 GB/s of pinned memory) and the GEMM rate a layer's compute
  // runs at (bf16 tensor cores at a realistic fraction of peak).
  double h2d_bytes_per_s = 25e9;
  double flops_per_s = 100e12;
  // offload.base: host: run a second micro-batch for StreamPlan's traffic
  // and time model (the warm ring's copies); the fit searches need only the peak.
  bool plan_stream_traffic = true;
  // The mode table's seq_len at micro_batch 1: the largest multiple of
  // kSeqLenStep that fits (finetune plan --max-seq-len), with what stops the
  // next one, instead of the largest power of two.
  bool exact_seq_len = false;
};

inline constexpr int64_t kSeqLenStep = 256;
// The mode table searches seq_len up to this where the model's positions
// do not bound it (dynamic NTK rope): 1M tokens, beyond any single card.
inline constexpr int64_t kLongestFitSeqLen = int64_t(1) << 20;

// offload.base: host: what the streamed layers cost, and a time model of
// one micro-batch (forward and backward) in which each streamed layer's copy
// overlaps the compute of the layer before it: a copy slower than that
// compute stalls the step by the difference.
struct StreamPlan {
  int64_t layers = 0, resident_layers = 0, streamed_layers = 0, slots = 0;
  size_t layer_bytes = 0;        // one streamed layer's tensors (one copy)
  size_t host_bytes = 0;         // every streamed layer, pinned host memory
  size_t ring_bytes = 0;         // the device slots
  size_t pcie_bytes = 0;         // host to device per micro-batch, once the ring is warm
  double copy_s = 0.0;           // one layer's copy at h2d_bytes_per_s
  double forward_s = 0.0;        // one layer's forward at flops_per_s
  double backward_s = 0.0;       // one layer's backward, its recomputation included
  double compute_s = 0.0;        // the micro-batch's modelled compute (layers and LM head)
  double stall_s = 0.0;          // what the copies add to it
  double stall_fraction() const { return stall_s / (compute_s + stall_s); }
};

struct StepPlan {
  int64_t micro_batch = 0, seq_len = 0;
  // The weights category split by kind (it does not change during a step):
  // the quantized base's codes and their constants (int8: row scales; NF4:
  // absmax, with double quantisation u8 codes, nested absmax and the
  // 256-entry maps), and the dense weights.
  QuantizedBase quantized_base = QuantizedBase::none;
  size_t quantized_weight_bytes = 0, quantized_constant_bytes = 0, dense_weight_bytes = 0;
  // Online RL with a reward model (rewards.model): its weights, a second
  // model the device holds through the run.
  size_t reward_model_bytes = 0;
  DType dense_weight_dtype = DType::f32;
  DType adapter_dtype = DType::f32;
  // offload.optimizer: host: AdamW's m, v and f32 masters in host memory
  // (not part of peak_bytes).
  size_t host_optimizer_bytes = 0;
  StreamPlan stream;  // offload.base: host only (stream.layers 0 otherwise)
  // offload.activations: host: the checkpoints' pinned host memory (not
  // part of peak_bytes), their PCIe bytes per micro-batch (out and back),
  // and the time model's stall: each checkpoint's copy against the layer
  // compute it overlaps (out: the next layer's forward; back: the later
  // layer's backward).
  size_t host_activation_bytes = 0, activation_pcie_bytes = 0;
  double activation_copy_s = 0.0, activation_stall_s = 0.0;
  MemoryStats at_peak;        // the tracker (requested bytes per category) at the peak
  size_t peak_bytes = 0;      // held at the peak: requested bytes (cpu), size-class-rounded bytes (cuda)
  size_t reserved_bytes = 0;  // cuda: what the caching allocator has cudaMalloc'd after the step
  size_t context_bytes = 0;   // cuda: the context reserve
  std::string where;          // e.g. "backward, last op int8_linear_backward on gpt_neox.layers.43..."
  // The time model's FLOPs of one micro-batch's forward and backward (its
  // recomputation included) through one decoder layer, and through the LM
  // head (logits and d(hidden): the head is frozen).
  double layer_flops = 0.0, lm_head_flops = 0.0;
  // parallel.tensor: the plan is rank 0's; the f32 bytes its tensor group
  // sums in one micro-batch's forward and backward (activations and their
  // gradients), and once per optimizer step (the partial LoRA gradients).
  size_t tensor_sum_bytes = 0, tensor_gradient_bytes = 0;

  // The run's phases besides the step, each with its own peak (what the
  // device holds then included): "checkpoint" (the training state and the
  // adapter copied to host memory), and with an eval set "evaluation" (one
  // eval micro-batch) and "generation" (ROUGE's and the end-of-run samples'
  // rows, at most micro_batch_size: prompts of seq_len tokens, then a
  // decoding step). Online RL's step (objective: grpo, plan_ppo_step)
  // adds, before those: "rollout" (generation with the KV cache, micro_batch
  // rows of prompt + completion tokens), with PPO "rollout values" (the
  // policy's log-probabilities and values, an eval forward), with a KL to the
  // reference "reference" (token_logps, adapters disabled), and with a
  // reward model "reward" (its score head's forward); the step itself is the
  // policy's token_logps_backward (PPO: with the value head).
  struct PhasePeak {
    std::string phase;
    size_t peak_bytes = 0;
  };
  std::vector<PhasePeak> phases;
  // The whole run's: the step's peak, or a later phase's when larger.
  size_t run_peak_bytes() const;
  std::string run_peak_phase() const;

  size_t total_bytes() const { return run_peak_bytes() + context_bytes; }
};

// The rows a run's generation (ROUGE, the samples) runs at once: `wanted`,
// at most micro_batch_size, so a prompt batch costs no more than a training
// micro-batch's forward (and the plan's generation phase fits where the step does).
inline int64_t generation_batch(const TrainConfig& config, int64_t wanted) {
  return std::max<int64_t>(1, std::min(wanted, config.micro_batch_size));
}

// One training step of micro_batch x seq_len tokens, planned.
StepPlan plan_step(const TrainConfig& config, const PlanOptions& options, int64_t micro_batch, int64_t seq_len);

// A PPO step as trl's classic PPOTrainer takes it (trainer/rl/ppo_step.h),
// at given shapes: rows rollouts generated at once with the KV cache
// (prompt_tokens, then response_tokens sampled), their log-probabilities and
// values (an eval forward of the policy with its value head,
// v_head.summary) and the reference's (the same model, adapters disabled),
// rows at a time; the reward model's scores over reward_rows sequences in
// one forward (0: rows); then a mini-batch of mini_batch_rows (0: rows):
// token_logps_backward with the value head trained beside the adapters, and
// the optimizer step. The reward model, a folder holding config.json ("":
// rule rewards, no second model), is built with the policy's options
// (quantization, precision), a score head and reward_adapter's LoRA, as
// RewardModel (trainer/rl/rewards.h) builds it.
struct PpoPlan {
  int64_t rows = 0;
  int64_t prompt_tokens = 0, response_tokens = 0;
  int64_t mini_batch_rows = 0;
  int64_t reward_rows = 0;
  std::string reward_model, reward_adapter;
};
StepPlan plan_ppo_step(const TrainConfig& config, const PlanOptions& options, const PpoPlan& ppo);
// objective: ppo's shapes at micro_batch x seq_len (plan_step plans them):
// micro_batch_size rows generated and scored at once, prompts of seq_len -
// ppo.max_new_tokens tokens, ppo.mini_batch_size rows trained at once, the
// ppo.batch_size rollouts rewarded at once, rewards.model.
PpoPlan ppo_plan(const TrainConfig& config, int64_t micro_batch, int64_t seq_len);

// Data parallel over ranks (`mpirun -np ranks`): every rank holds the whole
// step plan (its peak is one process's), and once per optimizer step the
// trainable gradients (f32, never the frozen base) are all-reduced. A ring
// all-reduce sends 2 (ranks - 1) / ranks of them from each rank (and
// receives as much).
struct AllReducePlan {
  int64_t ranks = 1;
  size_t gradient_bytes = 0;
  size_t ring_sent_per_rank_bytes = 0;
};
AllReducePlan plan_all_reduce(const StepPlan& plan, int64_t ranks);

// Pipeline parallel (parallel.pipeline P > 1 over options.ranks = D x P):
// the decoder layers split into P contiguous stages, the embedding on the
// first, the final norm, lm_head and loss on the last. Under 1F1B stage s
// holds the activations of at most P - s micro-batches at once (with
// per-layer checkpointing: their layer inputs), so its peak is replayed on
// the meta device as that many forwards of its layers, then their backwards,
// then AdamW over its adapters. The split minimises the largest stage cost,
// a stage's cost being the larger of its FLOPs and its bytes (the peak model
// from replays of one- and two-layer stages in its place), each relative to
// the mean over the stages: the slowest stage sets the pace, the fullest one
// the device. Each optimizer step runs m = grad_accum_steps micro-batches
// through each pipeline; the fill and drain leave every stage idle for
// (P - 1) / (m + P - 1) of the step (the bubble).
struct StagePlan {
  LayerRange layers;
  int64_t in_flight = 0;  // micro-batches whose activations it holds at once: P - s
  double flops = 0.0;     // one micro-batch's forward and backward through the stage
  StepPlan step;          // its replayed peak (step.total_bytes())
};
struct PipelinePlan {
  int64_t data = 1;           // data-parallel copies of the pipeline
  int64_t tensor = 1;         // parallel.tensor: the ranks each stage's layers are split over
  int64_t micro_batches = 0;  // per optimizer step through each pipeline: m
  std::vector<StagePlan> stages;
  double bubble_fraction = 0.0;  // (P - 1) / (m + P - 1)
};
PipelinePlan plan_pipeline(const TrainConfig& config, const PlanOptions& options);

// A pipeline run's stage: its decoder layers, by plan_pipeline for the job's
// world_ranks (the same split on every rank), and a line describing every
// stage's.
struct StageLayout {
  LayerRange layers;
  std::string description;  // "stage 0: layers 0-1, stage 1: layer 2, ...; 1F1B bubble 20% of each step"
};
StageLayout pipeline_stage_layout(const TrainConfig& config, int64_t world_ranks, int stage, bool on_gpu);

// One way to hold the frozen base and the optimizer state. base host: the
// quantized layers streamed (offload.base: host) with resident_layers of
// them kept on the device.
struct PlanMode {
  QuantizedBase quantization = QuantizedBase::int8;
  OffloadTarget optimizer = OffloadTarget::device;
  OffloadTarget base = OffloadTarget::device;
  int64_t resident_layers = 0;
};
// e.g. "nf4, optimizer state on the host", "nf4 streamed (28 resident), optimizer state on the host"
std::string mode_name(const PlanMode& mode);

// offload.base: host: the most decoder layers that can stay resident with
// the step still fitting options.gpu_mem_bytes at micro_batch x seq_len
// (config's offload.stream_slots device buffers), or -1 when none fits even
// with every layer streamed.
int64_t fit_resident_layers(const TrainConfig& config, const PlanOptions& options, int64_t micro_batch,
                            int64_t seq_len);

// How one mode fits options.gpu_mem_bytes: its plan at the config's
// micro_batch_size x seq_len, and the largest powers of two that fit (0:
// none) for seq_len at micro_batch 1 (up to the model's position limit) and
// for micro_batch at the config's seq_len (up to 1024). A streamed mode is
// planned with the most resident layers that fit at the config's size
// (fit_resident_layers; every layer streamed when none fits), and searched
// with every layer streamed.
struct ModeFit {
  PlanMode mode;
  size_t bytes = 0;
  bool fits = false;
  int64_t largest_seq_len = 0, largest_micro_batch = 0;
  StreamPlan stream;  // a streamed mode's, at the config's size
  // PlanOptions::exact_seq_len: what the next seq_len's plan spends its peak
  // on, largest first ("live layer and logits 14.2 GiB, weights ...").
  std::string seq_len_limit;
};

// Every mode the config's trainable set allows (LoRA: bf16/f32 base, int8,
// nf4, then int8 and nf4 streamed; full fine-tuning: unquantised only), each
// with its optimizer state on the device and on the host, in order of
// preference: a resident base before a streamed one (streaming copies the
// streamed layers every micro-batch), a more faithful base first (16-bit,
// then int8, then 4-bit), and for each the state on the device (no PCIe
// traffic in the optimizer step) before the host. The best mode is the
// first that fits.
std::vector<ModeFit> fit_modes(const TrainConfig& config, const PlanOptions& options);

// `finetune plan`: the breakdown at the config's micro_batch_size x seq_len,
// whether it fits in options.gpu_mem_bytes, then fit_modes as a table and
// the best mode.
void print_plan(const TrainConfig& config, const PlanOptions& options);

// `finetune plan path/config.json` (or a model folder holding one): a LoRA
// run on that model with the architecture's default targets, as a 24 GB
// card would run it: bf16, per-layer checkpointing (none for a T5, which
// keeps every activation of a step), 512-token loss chunks,
// micro_batch 1 at min(2048, max_position_embeddings) tokens. overrides as
// --set gives them.
TrainConfig plan_config_for_model(const std::string& path, const std::vector<std::string>& overrides);

// "24GiB", "0.75 GiB", "512MiB", "2GB", "1048576": bytes (binary and decimal units).
size_t parse_byte_size(const std::string& text);

}  // namespace ft
