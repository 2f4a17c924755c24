// The training run's configuration: one YAML file plus `--set key=value`
// overrides. Every field has a default (see configs/README.md); loading checks
// keys, types and ranges and throws an ft::Error naming the file and field.
//
// Relative paths (model, tokenizer, data.train, data.eval, output_dir) written
// in the file are resolved against the directory of the config file, so a
// config works from any working directory. Paths given with --set are shell
// arguments and stay relative to the current working directory. A path field
// that starts with ${output_dir} is under output_dir as finally set.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/model_options.h"
#include "trainer/data/data.h"
#include "trainer/data/template_data.h"
#include "trainer/enum_names.h"
#include "trainer/lr_schedule.h"
#include "trainer/rl/grpo.h"
#include "trainer/rl/ppo.h"
#include "trainer/rl/rewards.h"

namespace YAML {
class Node;
}

namespace ft {

enum class InitMode { pretrained, random };
enum class Trainable { lora, all };
enum class Precision { fp32, bf16 };
enum class DeviceChoice { automatic, cpu, cuda };
enum class TaskMetric { none, rouge };
enum class OffloadTarget { device, host };
enum class Objective { sft, dpo, reward, grpo, ppo };
enum class DpoLoss { sigmoid, ipo };

// objective: dpo (trainer/dpo.h): trl's beta and loss_type.
struct DpoConfig {
  double beta = 0.1;
  DpoLoss loss = DpoLoss::sigmoid;
};

struct QuantizationConfig {
  QuantizedBase mode = QuantizedBase::int8;
  double threshold = 6.0;  // LLM.int8() outlier threshold
  bool double_quant = true;  // NF4: absmax constants double-quantised to 8 bits
  std::string save_base;   // resolved folder; "" = don't save the quantised base
};

// A token named in the config: by id (id >= 0) or by its text.
struct TokenRef {
  int64_t id = -1;
  std::string text;
};

// data.add_eos: whether each training example ends with an EOS token, and which one.
struct AddEos {
  bool enabled = true;
  bool from_checkpoint = true;  // the checkpoint's (trainer/data/special_tokens.h); else `token`
  TokenRef token;
};

struct DataConfig {
  std::string train;  // resolved path, required
  std::string eval;   // resolved path, "" = no eval set
  DataFormat format = DataFormat::automatic;
  ChatTemplateKind chat_template = ChatTemplateKind::automatic;  // auto: recognised in tokenizer_config.json
  Packing packing = Packing::none;  // true: padding_free, false: none (trainer/data/data.h)
  AddEos add_eos;
  // data.template: rows with named fields (JSONL or .csv) made into prompt/completion (template_data.h).
  RowTemplate row_template;
  // An encoder-decoder model's text rows: encoder input up to the last occurrence (split_text_row).
  std::string text_split;
  // data.completion_only_loss and data.assistant_only_loss (trl's SFTConfig names).
  LossScope loss_scope;
};

struct GenerateConfig {
  int64_t max_new_tokens = 48;
  double temperature = 0.7;
  double top_p = 0.9;
  int64_t num_samples = 3;
  std::vector<TokenRef> stop;  // besides the checkpoint's EOS ids
};

// How the ranks of `mpirun -np N ./finetune` share the work (trainer/parallel/data_parallel.h).
struct ParallelConfig {
  int64_t data = 0;      // data-parallel ranks; 0 = the world size
  int64_t pipeline = 1;  // pipeline stages, each a share of the decoder layers (trainer/parallel/pipeline.h)
  int64_t tensor = 1;    // tensor-parallel ranks, each 1/tensor of every layer (trainer/parallel/tensor_parallel.h)
  int64_t timeout_s = 1800;  // a rank waiting longer than this for the others ends the job; 0 = never
  // ZeRO-1: each data-parallel rank keeps AdamW's state (moments, f32
  // masters) for its share of the trainable parameters only (trainer.h).
  bool shard_optimizer = false;
};

struct TrainConfig {
  std::string source;     // the config file, for messages
  std::string model;      // resolved path, required
  std::string tokenizer;  // resolved path; defaults to <model>/tokenizer.model, else <model>/tokenizer.json
  InitMode init = InitMode::pretrained;
  Objective objective = Objective::sft;
  DpoConfig dpo;
  // objective: grpo (trainer/rl/grpo_step.h): trl's GRPOConfig names, and
  // the rollouts' sampling (temperature 1, as the loss's log-probabilities).
  GrpoConfig grpo;
  double grpo_top_p = 1.0;
  int64_t grpo_top_k = 0;
  // objective: ppo (trainer/rl/ppo_step.h): trl 0.11's PPOConfig names, and
  // the responses' sampling (temperature 1).
  PpoConfig ppo;
  int64_t ppo_max_new_tokens = 32;
  double ppo_top_p = 1.0;
  int64_t ppo_top_k = 0;
  RewardRules rewards;  // objective: grpo and ppo's rewards (trainer/rl/rewards.h)
  // Every dpo., grpo. and ppo. key the config set, with where (file:line or
  // --set): each section applies to its own objective only.
  std::vector<std::pair<std::string, std::string>> objective_keys;
  Trainable trainable = Trainable::lora;
  LoraOptions lora;  // used when trainable is lora
  // A comparison's `train: false` run (no key of its own): the model as built
  // is evaluated, nothing is trainable, so no gradient or AdamW buffers.
  bool evaluate_only = false;
  QuantizationConfig quantization;
  Precision precision = Precision::fp32;
  DeviceChoice device = DeviceChoice::automatic;
  DataConfig data;
  int64_t seq_len = 256;
  int64_t micro_batch_size = 4;
  // Memory techniques for large models (model/model_options.h).
  ActivationCheckpointing activation_checkpointing = ActivationCheckpointing::none;
  int64_t loss_chunk_tokens = 0;  // 0: the whole [tokens, vocab] logits at once
  int64_t mlp_chunk_tokens = 0;   // 0: the decoder MLP over all tokens at once
  // offload.optimizer: host keeps AdamW's m, v and f32 masters in host memory
  // (trainer/optimizer.h) and the adapters in the weight dtype on the device.
  OffloadTarget offload_optimizer = OffloadTarget::device;
  // offload.base: host streams the frozen int8/nf4 decoder layers from pinned
  // host memory (model/layer_stream.h); the last offload.resident_layers stay
  // on the device, the rest pass through offload.stream_slots device buffers.
  OffloadTarget offload_base = OffloadTarget::device;
  // offload.activations: host keeps each per-layer checkpoint in pinned host
  // memory (model/activation_offload.h): a GPU run with per_layer checkpointing.
  OffloadTarget offload_activations = OffloadTarget::device;
  int64_t resident_layers = 0;
  int64_t stream_slots = 2;
  int64_t grad_accum_steps = 1;
  // NEFTune (transformers' TrainingArguments.neftune_noise_alpha): uniform
  // noise on the token embeddings in training steps (ModelOptions); 0 = off.
  double neftune_noise_alpha = 0.0;
  ParallelConfig parallel;
  double lr = 2.0e-4;
  int64_t warmup_steps = 0;
  double warmup_fraction = 0.0;  // warmup_steps written as a number in (0, 1): that share of the run's steps
  Schedule schedule = Schedule::cosine;
  double min_lr_ratio = 0.0;
  double weight_decay = 0.0;
  double max_grad_norm = 1.0;  // 0 disables clipping
  double loraplus_lr_ratio = 1.0;  // LoRA+: lora_B (and 1-D adapters) at this x lr; 1 = off
  int64_t max_steps = 0;       // optimizer steps; 0 = use epochs
  int64_t epochs = 1;
  int64_t max_bad_steps = 3;  // consecutive steps with a non-finite loss or gradient before the run stops
  int64_t eval_every = 0;    // optimizer steps; 0 = only at start and end
  int64_t eval_batches = 0;  // 0 = whole eval set
  int64_t save_every = 0;    // optimizer steps; 0 = only at end
  int64_t log_every = 1;
  uint64_t seed = 1234;
  std::string output_dir;  // resolved path; default "runs/out" next to the config
  GenerateConfig generate;
  TaskMetric task_metric = TaskMetric::none;
  int64_t metric_examples = 50;
};

// Reads yaml_path, applies overrides ("key=value", dotted keys for nested
// fields, value parsed as YAML) and validates.
TrainConfig load_train_config(const std::string& yaml_path, const std::vector<std::string>& overrides = {});
// The same for YAML text already in memory; source is the file name used for
// messages and for resolving relative paths.
TrainConfig parse_train_config(const std::string& yaml_text, const std::string& source,
                               const std::vector<std::string>& overrides = {});

// The same from maps of one YAML file (source), each applied over the one
// before (a section such as lora: sets only the keys it names), their
// top-level keys in `skipped` left out: a comparison's runs (compare.h).
TrainConfig train_config_from_layers(const std::vector<YAML::Node>& layers, const std::vector<std::string>& skipped,
                                     const std::string& source, const std::vector<std::string>& overrides = {});
// path's YAML, parsed; an unreadable file or invalid YAML is an Error naming it.
YAML::Node load_yaml_file(const std::string& path);

// Every valid dotted key, in the order of configs/README.md.
std::vector<std::string> train_config_keys();

// The YAML spelling of each enum value ("auto" for automatic), for
// enum_name() and the config's parsing (trainer/enum_names.h); DataFormat's
// is in data.h, ChatTemplateKind's in chat_template.h.
EnumNames<InitMode> enum_names(InitMode);
EnumNames<Trainable> enum_names(Trainable);
EnumNames<QuantizedBase> enum_names(QuantizedBase);
EnumNames<Precision> enum_names(Precision);
EnumNames<DeviceChoice> enum_names(DeviceChoice);
EnumNames<Schedule> enum_names(Schedule);
EnumNames<ActivationCheckpointing> enum_names(ActivationCheckpointing);
EnumNames<TaskMetric> enum_names(TaskMetric);
EnumNames<OffloadTarget> enum_names(OffloadTarget);
EnumNames<Objective> enum_names(Objective);
EnumNames<DpoLoss> enum_names(DpoLoss);

}  // namespace ft
