// What a run trains, built from its config: the model's options, the model
// with its trainable set, and AdamW over it. The run (trainer.h) and the
// memory planner (plan.h) both build here, so the planner measures what a
// run holds, and neither depends on the other.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/causal_lm.h"
#include "trainer/optimizer.h"
#include "trainer/train_config.h"

namespace ft {

// How the config builds the model: weight and activation dtypes, the INT8 or
// NF4 base, LoRA (when trainable is lora), checkpointing, loss chunking.
ModelOptions model_options(const TrainConfig& config);

// A reward model's options (rewards.model), as RewardModel
// (trainer/rl/rewards.h) builds it: the policy's (quantization, precision)
// with a score head, and the LoRA of its own PEFT adapter folder (adapter:
// rewards.model_adapter) or none.
ModelOptions reward_model_options(ModelOptions policy, const std::string& adapter);

// The largest seq_len the model's positions hold: its position_limit()
// (max_position_embeddings but for dynamic NTK rope), one less for objective: reward, whose scored sequence is a row's seq_len
// inputs and its last target (trainer/rl/reward.h's scored_rows).
int64_t longest_seq_len(const TrainConfig& config, const ModelConfig& model_config);
// Refuses a seq_len above that, naming the config and the model's config.json.
void check_seq_len(const TrainConfig& config, const ModelConfig& model_config);

// What a run trains: the model and the optimizer over its trainable set.
struct TrainingSetup {
  std::unique_ptr<LanguageModel> model;  // a CausalLM, or T5Model for model_type t5
  std::unique_ptr<AdamW> optimizer;      // over this rank's share of trainable
  std::vector<Parameter*> trainable;     // every trainable parameter, in order
  std::vector<int64_t> state_owners;     // the data-parallel rank holding each one's AdamW state
};

// ZeRO-1 (parallel.shard_optimizer): this rank's place among the
// data-parallel ranks whose AdamW states are split (state_owners).
struct OptimizerShard {
  int64_t rank = 0, ranks = 1;
};

// The one way a run builds what it trains, on any backend; the memory planner
// (plan.h) and its tests build theirs here too, so the planner measures what
// a run holds. The model gets the config's options (dtypes, LLM.int8(), LoRA
// when trainable is lora, checkpointing, loss chunking); fill_base then fills
// its base weights (load, init_random, or nothing when planning); adapters
// are initialised from the config's seed, the config's trainable set (the
// adapters, or everything; nothing when evaluate_only) gets gradient buffers, and AdamW takes the config's
// weight decay and clipping. With offload.optimizer: host its state is
// allocated from host_state (required then; a run's host memory, the
// planner's host-side tracker). A pipeline stage builds its layers only;
// with a shard, AdamW holds state for the shard's parameters only. With
// output_head, the model gets that head instead of the config's (the
// planner's PPO replay: the policy's value head, trained with the adapters).
// With tensor (parallel.tensor > 1) the model holds that rank's share of
// every layer (model/tensor_parallel.h).
TrainingSetup setup_training(const TrainConfig& config, const ModelConfig& model_config, Backend& backend,
                             const std::function<void(LanguageModel&)>& fill_base, Allocator* host_state = nullptr,
                             const LayerRange& stage = {}, const OptimizerShard& shard = {},
                             std::optional<OutputHead> output_head = std::nullopt,
                             TensorParallelGroup* tensor = nullptr);

// model as the decoder-only CausalLM that `what` (e.g. "objective: dpo")
// needs; a T5Model is an Error saying so.
CausalLM& causal_lm(LanguageModel& model, const char* what);

}  // namespace ft
