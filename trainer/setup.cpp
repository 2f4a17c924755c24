#include "trainer/setup.h"

#include <algorithm>
#include <deque>
#include <filesystem>
#include <string>

#include "kernels/error.h"
#include "model/families.h"
#include "model/peft_adapter.h"

namespace ft {

int64_t longest_seq_len(const TrainConfig& config, const ModelConfig& model_config) {
  return model_config.position_limit() - (config.objective == Objective::reward ? 1 : 0);
}

void check_seq_len(const TrainConfig& config, const ModelConfig& model_config) {
  FT_CHECK(config.seq_len <= longest_seq_len(config, model_config), config.source, ": seq_len ", config.seq_len,
           " is larger than the model's max_position_embeddings ", model_config.max_position_embeddings,
           config.objective == Objective::reward ? " less the scored last token" : "", " (",
           (std::filesystem::path(config.model) / "config.json").string(), ")");
}

ModelOptions model_options(const TrainConfig& config) {
  ModelOptions options;
  options.weight_dtype = config.precision == Precision::bf16 ? DType::bf16 : DType::f32;
  options.activation_dtype = options.weight_dtype;  // bf16 mixed precision: bf16 activations too
  options.quantized_base = config.quantization.mode;
  options.int8_threshold = float(config.quantization.threshold);
  options.nf4_double_quant = config.quantization.double_quant;
  options.activation_checkpointing = config.activation_checkpointing;
  options.loss_chunk_tokens = config.loss_chunk_tokens;
  options.mlp_chunk_tokens = config.mlp_chunk_tokens;
  options.neftune_noise_alpha = config.neftune_noise_alpha;
  if (config.trainable == Trainable::lora) options.lora = config.lora;
  // With the f32 masters on the host the device keeps only the copy the adapters compute with.
  if (config.offload_optimizer == OffloadTarget::host) options.adapter_dtype = options.weight_dtype;
  options.stream_base = config.offload_base == OffloadTarget::host;
  options.offload_activations = config.offload_activations == OffloadTarget::host;
  options.resident_layers = config.resident_layers;
  options.stream_slots = config.stream_slots;
  // A reward model scores with transformers' score head (trainer/reward.h).
  if (config.objective == Objective::reward) options.output_head = OutputHead::score;
  // PPO's policy carries trl's value head (trainer/rl/ppo_step.h).
  if (config.objective == Objective::ppo) options.output_head = OutputHead::value;
  return options;
}

ModelOptions reward_model_options(ModelOptions policy, const std::string& adapter) {
  policy.output_head = OutputHead::score;
  policy.lora.reset();
  if (!adapter.empty()) policy.lora = read_peft_adapter_config(adapter).lora;
  return policy;
}

namespace {

std::unique_ptr<AdamW> make_optimizer(Backend& backend, const std::vector<Parameter*>& parameters,
                                      const TrainConfig& config, Allocator* host_state) {
  AdamWOptions options;
  options.weight_decay = config.weight_decay;
  options.max_grad_norm = config.max_grad_norm;
  options.loraplus_lr_ratio = config.loraplus_lr_ratio;
  if (config.offload_optimizer == OffloadTarget::host) {
    FT_CHECK(host_state, "setup_training: offload.optimizer: host needs a host allocator for the optimizer state");
    options.host_state = host_state;
  }
  return std::make_unique<AdamW>(backend, parameters, options);
}

}  // namespace

// PEFT skips a target name that matches no module; a run's config that
// names one most likely mistyped it, so a run (and its plan) refuses it. An
// adapter's file loads as PEFT loads it.
void check_target_names(LanguageModel& model) {
  if (!model.options().lora) return;
  std::string names;
  for (const std::string& leaf : model.linear_module_leaves()) names += (names.empty() ? "" : ", ") + leaf;
  for (const std::string& target : model.options().lora->target_modules) {
    const auto matches = [&](const std::string& module) { return module_matches_target(module, target); };
    FT_CHECK(std::any_of(model.linear_modules().begin(), model.linear_modules().end(), matches),
             "lora.target_modules: \"", target, "\" matches no module of this ", model.config().model_type,
             " model (its linear modules are ", names, ")");
  }
}

TrainingSetup setup_training(const TrainConfig& config, const ModelConfig& model_config, Backend& backend,
                             const std::function<void(LanguageModel&)>& fill_base, Allocator* host_state,
                             const LayerRange& stage, const OptimizerShard& shard,
                             std::optional<OutputHead> output_head, TensorParallelGroup* tensor) {
  FT_CHECK(config.offload_base == OffloadTarget::device ||
               model_family(model_config.model_type).kind == ModelKind::causal,
           config.source, ": offload.base: host streams a decoder-only model's layers; a ", model_config.model_type,
           " (encoder-decoder) model keeps its base on the device");
  FT_CHECK(config.offload_base == OffloadTarget::device || config.resident_layers < model_config.num_hidden_layers,
           config.source, ": offload.resident_layers must be below the model's num_hidden_layers (",
           model_config.num_hidden_layers, ") with offload.base: host, got ", config.resident_layers);
  TrainingSetup setup;
  ModelOptions options = model_options(config);
  options.layers = stage;
  options.tensor_parallel = tensor;
  if (output_head) options.output_head = *output_head;
  setup.model = make_language_model(model_config, backend, options);
  check_target_names(*setup.model);
  fill_base(*setup.model);
  setup.model->init_adapters(config.seed);
  setup.model->init_output_head(config.seed);
  const bool train_all = config.trainable == Trainable::all;
  const HeadParameters& head = setup.model->output_head();
  // The output head trains beside the adapters, as PEFT's modules_to_save.
  auto is_head = [&](const std::string& name) {
    return (head.weight && name == head.weight->name) || (head.bias && name == head.bias->name);
  };
  setup.model->set_trainable([&](const std::string& name) {
    if (config.evaluate_only) return false;
    return train_all || name.find(".lora_") != std::string::npos || is_head(name);
  });
  for (std::deque<Parameter>* list : {&setup.model->parameters(), &setup.model->adapters()})
    for (Parameter& p : *list)
      if (p.trainable()) setup.trainable.push_back(&p);
  setup.state_owners = state_owners(setup.trainable, shard.ranks);
  std::vector<Parameter*> mine;
  for (size_t i = 0; i < setup.trainable.size(); ++i)
    if (setup.state_owners[i] == shard.rank) mine.push_back(setup.trainable[i]);
  setup.optimizer = make_optimizer(backend, mine, config, host_state);
  return setup;
}

CausalLM& causal_lm(LanguageModel& model, const char* what) {
  const ModelKind causal = ModelKind::causal;
  FT_CHECK(model.as_causal_lm(), what, " needs a decoder-only model (", supported_model_types(&causal),
           "), got model_type ", model.config().model_type);
  return *model.as_causal_lm();
}

}  // namespace ft
