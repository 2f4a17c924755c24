#include "trainer/trainer.h"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string_view>
#include <tuple>

#include <unistd.h>

#include "kernels/checked_mul.h"
#include "kernels/dropout_hash.h"
#include "kernels/error.h"
#include "model/atomic_file.h"
#include "model/checksum.h"
#include "model/causal_lm.h"
#include "model/families.h"
#include "model/layer_stream.h"
#include "model/lora_pattern.h"
#include "model/peft_adapter.h"
#include "model/quantized_base.h"
#include "model/safetensors.h"
#include "tokenizer/load_tokenizer.h"
#include "trainer/adapter_merge.h"
#include "trainer/adapter_record.h"
#include "trainer/data/preference_data.h"
#include "trainer/data/special_tokens.h"
#include "trainer/device_backend.h"
#include "trainer/dpo.h"
#include "trainer/rl/grpo_step.h"
#include "trainer/rl/ppo_step.h"
#include "trainer/rl/prompts.h"
#include "trainer/rl/reward.h"
#include "trainer/rl/rewards.h"
#include "trainer/evaluate.h"
#include "trainer/lr_schedule.h"
#include "trainer/optimizer.h"
#include "trainer/parallel/collectives.h"
#include "trainer/parallel/data_parallel.h"
#include "trainer/parallel/pipeline.h"
#include "trainer/parallel/tensor_parallel.h"
#include "trainer/parameter_count.h"
#include "trainer/plan.h"
#include "trainer/report/op_profile_report.h"
#include "trainer/report/progress.h"
#include "trainer/run_identity.h"
#include "trainer/train_state.h"

namespace ft {
namespace fs = std::filesystem;

namespace {

// Everything one run holds, in construction order.
struct Run {
  const TrainConfig& config;
  Collectives& collectives;
  bool leader;  // rank 0: the one that prints, evaluates and writes files
  // One pipeline's stages, and the data-parallel ranks holding this stage
  // (with parallel.pipeline 1: this rank alone, and every rank).
  RankGroups groups;
  int64_t pipeline_stages = 1;
  int64_t tensor_ranks = 1;  // parallel.tensor
  bool sharded = false;  // parallel.shard_optimizer over several data-parallel ranks (ZeRO-1)
  HostAllocator host;
  CollectivesTensorGroup tensor_group{*groups.tensor, host};  // the model's (tensor_parallel.h)
  TrackingAllocator host_state{host};  // AdamW's state with offload.optimizer: host
  std::unique_ptr<Allocator> device_memory;  // CUDA only: the caching allocator under the tracker
  std::unique_ptr<TrackingAllocator> tracker;
  std::unique_ptr<Backend> backend;
  ModelConfig model_config;
  std::unique_ptr<Tokenizer> tokenizer;
  SpecialTokens special_tokens;
  std::unique_ptr<LanguageModel> model;  // its family's (model/families.h)
  ModelKind kind = ModelKind::causal;    // seq2seq: rows are the encoder's tokens, then the labels
  std::optional<ChatTemplate> chat;  // the training rows' template, when they are chat
  std::unique_ptr<AdamW> optimizer;         // over this rank's share of trainable when sharded
  std::vector<Parameter*> trainable;        // every trainable parameter of this rank's model
  std::vector<int64_t> state_owners;        // per trainable parameter: the data-parallel rank updating it
  RunIdentity identity;  // what its checkpoints belong to
  std::unique_ptr<DataLoader> train, eval;
  std::unique_ptr<PreferenceLoader> train_pairs, eval_pairs;  // objective: dpo or reward, in place of train and eval
  Dataset eval_examples;  // with objective: dpo, the eval pairs' prompts and chosen completions
  // objective: grpo: prompt rows in place of train and eval, and the reward model when rewards.model is set.
  std::unique_ptr<PromptLoader> train_prompts;
  std::vector<PromptRow> eval_prompts;
  std::unique_ptr<RewardModel> reward_model;
  KlController kl_controller;  // objective: ppo's KL coefficient, saved with the training state
  // objective: grpo: the generation batch the coming steps train on (grpo.num_iterations of them), saved with
  // the training state when a checkpoint falls between its iterations.
  GrpoGeneration grpo_generation;
  LrSchedule schedule;
  int64_t total_steps = 0;
  Run(const TrainConfig& c, Collectives& ranks)
      : config(c), collectives(ranks), leader(ranks.rank() == 0),
        groups(split_ranks(ranks, c.parallel.pipeline, c.parallel.tensor)), pipeline_stages(c.parallel.pipeline),
        tensor_ranks(c.parallel.tensor),
        sharded(c.parallel.shard_optimizer && groups.replicas->world_size() > 1) {}
  Collectives& stages() { return *groups.stages; }
  Collectives& replicas() { return *groups.replicas; }
  Collectives& tensor() { return *groups.tensor; }
  // Rank 0 of each stage's data-parallel ranks: the pipeline that evaluates and saves.
  bool in_first_pipeline() { return groups.replicas->rank() == 0; }
};

std::string path_in(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

StopCondition stop_condition(const Run& run) {
  return StopCondition{run.special_tokens.stop_ids, run.special_tokens.stop_strings, run.tokenizer.get()};
}

void make_backend(Run& run) {
  DeviceBackend device = make_device_backend(run.config.device, run.config.source, run.host, std::cout);
  run.device_memory = std::move(device.device_memory);
  run.tracker = std::move(device.tracker);
  run.backend = std::move(device.backend);
}

// A checkpoint holding tensors the model does not read (more layers than
// config.json's, another model's head) is most likely not the model the
// config describes, or a deliberate cut of it: said, as transformers says it.
void warn_unused_tensors(const TrainConfig& config, const ModelConfig& model_config) {
  const Checkpoint base(config.model);
  const std::vector<std::string> unused =
      unused_tensors(base, model_config, model_options(config).output_head);
  if (unused.empty()) return;
  std::cout << "warning: " << config.model << ": " << unused.size() << " tensor" << (unused.size() > 1 ? "s" : "")
            << " of the checkpoint " << (unused.size() > 1 ? "are" : "is") << " not used by the model its config.json "
            << "describes (" << model_config.num_hidden_layers << " layers):";
  for (size_t i = 0; i < std::min<size_t>(unused.size(), 4); ++i) std::cout << (i ? ", " : " ") << unused[i];
  std::cout << (unused.size() > 4 ? ", ..." : "") << "\n";
}

// A new run writes over no earlier run's outputs and no model folder:
// output_dir's training state, adapter, full model or value head, and a
// quantization.save_base folder holding a model, need --overwrite (or
// --resume, which continues that run); the model's own folder is never a
// save_base.
void check_outputs_free(const TrainConfig& config, const RunOptions& options) {
  const std::string state_path = path_in(config.output_dir, "train_state.safetensors");
  const bool fresh = !options.resume && !options.overwrite;
  FT_CHECK(!fresh || !fs::exists(state_path), state_path,
           ": output_dir holds an earlier run's checkpoint (its adapter and metrics beside it): continue that run "
           "with --resume, start afresh over it with --overwrite, or set another output_dir");
  for (const char* output : {"adapter/adapter_model.safetensors", "model/model.safetensors",
                             "model/model.safetensors.index.json", "value_head.safetensors"})
    FT_CHECK(!fresh || !fs::exists(path_in(config.output_dir, output)), config.source, ": output_dir ",
             config.output_dir, " holds an earlier run's ", output, " (and no training state to resume from): start "
             "afresh over it with --overwrite, or set another output_dir");
  const std::string& save_base = config.quantization.save_base;
  if (save_base.empty() || !fs::exists(save_base)) return;
  std::error_code error;
  FT_CHECK(!fs::equivalent(save_base, config.model, error), config.source, ": quantization.save_base ", save_base,
           " is the model's own folder; give a new folder for the quantised base");
  const std::string model_file = model_file_in(save_base);
  FT_CHECK(!fresh || model_file.empty(), config.source, ": quantization.save_base ", save_base,
           " already holds a model (", model_file, "): give a new folder, or --overwrite to replace it");
}

// Whether path is inside folder (or is it).
bool is_within(const std::string& path, const fs::path& folder) {
  std::error_code error;
  const fs::path inner = fs::weakly_canonical(path, error), outer = fs::weakly_canonical(folder, error);
  const auto [end, ignored] = std::mismatch(outer.begin(), outer.end(), inner.begin(), inner.end());
  return !path.empty() && end == outer.end();
}

// A fresh run (--overwrite over an earlier one) first removes what runs write
// to output_dir: stopped before its first checkpoint, it must leave no earlier
// state for --resume to continue under its config, and no earlier adapter or
// model beside its metrics. An output name that holds one of the run's inputs
// (a base model kept in output_dir/model) is never removed.
void remove_earlier_outputs(const TrainConfig& config) {
  const std::string inputs[] = {config.model, config.tokenizer, config.data.train, config.data.eval,
                                config.quantization.save_base, config.rewards.model, config.rewards.model_adapter};
  for (const char* name : {"train_state.safetensors", "adapter", "model", "value_head.safetensors", "loss.svg",
                           "sample_prompts.jsonl", "op_profile.json"}) {
    const fs::path output = path_in(config.output_dir, name);
    if (std::none_of(std::begin(inputs), std::end(inputs), [&](const std::string& in) { return is_within(in, output); }))
      fs::remove_all(output);
  }
}

// The quantised base as a loadable model folder: later runs read the codes
// and constants directly instead of quantising the 16-bit checkpoint again,
// and transformers + bitsandbytes load it as the quantised model.
void save_base(const Run& run, LanguageModel& model) {
  const std::string& folder = run.config.quantization.save_base;
  create_folder(folder, run.config.source + ": quantization.save_base");
  save_quantized_base(model, path_in(folder, "model.safetensors"));
  const nlohmann::json config = quantized_base_config(path_in(run.config.model, "config.json"), model.options());
  write_file_atomically(path_in(folder, "config.json"), config.dump(2) + "\n");
  copy_file_atomically(run.config.tokenizer, path_in(folder, run.tokenizer->file_name()));
  std::cout << "quantized base: " << folder << "\n";
}

// The whole model's parameters: every stage's summed, a tied embedding (held
// by the first stage and the last) once.
ParameterCount count_job_parameters(Run& run) {
  ParameterCount count = count_parameters(*run.model);
  const LanguageModel& model = *run.model;
  if (model.config().tie_word_embeddings && model.last_stage() && !model.first_stage())
    count.all -= model.config().vocab_size * model.config().hidden_size;
  count.all = int64_t(run.stages().sum(double(count.all)));
  count.trainable = int64_t(run.stages().sum(double(count.trainable)));
  return count;
}

bool generates_rows(Objective objective) { return objective == Objective::grpo || objective == Objective::ppo; }

// A rank_pattern, alpha_pattern or exclude_modules entry that matches
// nothing is most likely a typo; a pipeline stage sees only its layers, so
// only a model holding them all is asked.
void warn_unmatched_lora_keys(LanguageModel& model) {
  if (!model.options().lora || !model.first_stage() || !model.last_stage()) return;
  std::vector<std::string> adapted;
  for (const Parameter& adapter : model.adapters()) adapted.push_back(adapter.name.substr(0, adapter.name.find(".lora_")));
  for (const std::string& unmatched : unmatched_lora_keys(*model.options().lora, model.linear_modules(), adapted))
    std::cout << "warning: " << unmatched << ": it changes nothing\n";
}

void make_model(Run& run) {
  const TrainConfig& config = run.config;
  run.model_config = read_model_config(path_in(config.model, "config.json"));
  run.kind = model_family(run.model_config.model_type).kind;
  const bool seq2seq = run.kind == ModelKind::seq2seq;
  // PPO follows trl's seq2seq policies (trainer/rl/rollouts.h); the other objectives are decoder-only.
  FT_CHECK(!seq2seq || config.objective == Objective::sft || config.objective == Objective::ppo, config.source,
           ": objective: ", enum_name(config.objective), " needs a decoder-only model; ",
           path_in(config.model, "config.json"), " is a ", run.model_config.model_type, " (encoder-decoder) model");
  FT_CHECK(!seq2seq || config.data.packing == Packing::none, config.source, ": data.packing: ",
           enum_name(config.data.packing), " packs examples into causal rows; a ", run.model_config.model_type,
           " model reads one example per row (set data.packing: false)");
  FT_CHECK(!seq2seq || config.data.loss_scope.completion_only, config.source, ": data.completion_only_loss: false "
           "trains on the prompt's tokens too, which a ", run.model_config.model_type, " model's encoder reads: its "
           "loss is on the decoder's labels only");
  check_seq_len(config, run.model_config);
  check_pipeline_run(config, run.model_config.model_type);
  check_tensor_parallel_run(config, run.model_config);
  LayerRange stage;
  if (run.pipeline_stages > 1) {
    const StageLayout layout = pipeline_stage_layout(config, run.collectives.world_size(), run.stages().rank(),
                                                     run.backend->device() != Device::cpu);
    stage = layout.layers;
    std::cout << "pipeline: " << layout.description << "\n";
  }
  run.tokenizer = load_tokenizer(config.tokenizer, run.model_config.vocab_size);
  run.special_tokens = resolve_special_tokens(config, *run.tokenizer, run.model_config.vocab_size);
  std::cout << "special tokens: " << describe(run.special_tokens, *run.tokenizer) << "\n";
  // Chat rows need a template: found (or refused) before the weights load.
  const bool pairs = config.objective == Objective::dpo || config.objective == Objective::reward;
  const std::string tokenizer_dir = fs::path(config.tokenizer).parent_path().string();
  if ((config.objective == Objective::sft || pairs) && config.data.row_template.empty() &&
      holds_chat_rows(config.data.train, pairs ? DataFormat::automatic : config.data.format)) {
    // Said before a missing template, which would not help an encoder-decoder.
    FT_CHECK(run.kind != ModelKind::seq2seq, config.source, ": data.train (", config.data.train, ") holds chat rows, "
             "which train decoder-only models; an encoder-decoder model needs prompt/completion rows");
    run.chat = resolve_chat_template(config.data.chat_template, tokenizer_dir);
  }
  if (generates_rows(config.objective))  // conversational prompts
    run.chat = prompt_chat_template({config.data.train, config.data.eval}, config.data.chat_template, tokenizer_dir,
                                    run.kind);
  if (run.chat) std::cout << "chat template: " << enum_name(run.chat->kind) << " (" << run.chat->source << ")\n";
  const auto fill = [&](LanguageModel& model) {
    if (config.init == InitMode::random) model.init_random(config.seed);
    else model.load(Checkpoint(config.model));
  };
  if (config.init == InitMode::pretrained && run.leader) warn_unused_tensors(config, run.model_config);
  TrainingSetup setup;
  try {
    setup = setup_training(config, run.model_config, *run.backend, fill, &run.host_state, stage,
                           run.sharded ? OptimizerShard{run.replicas().rank(), run.replicas().world_size()}
                                       : OptimizerShard{},
                           std::nullopt, run.tensor_ranks > 1 ? &run.tensor_group : nullptr);
  } catch (const Error& error) {
    // The model names the LoRA field it cannot take (lora.target_modules), not the config that set it.
    if (std::string_view(error.what()).starts_with("lora.")) fail(config.source, ": ", error.what());
    throw;
  }
  run.model = std::move(setup.model);
  run.optimizer = std::move(setup.optimizer);
  run.trainable = std::move(setup.trainable);
  run.state_owners = std::move(setup.state_owners);
  std::string base_weights = run.model->base_fingerprint();
  if (run.pipeline_stages > 1) base_weights = staged_base_fingerprint(run.stages(), base_weights);
  run.identity = run_identity(config, *run.model, base_weights);
}

// task_metric: rouge generates from each scored eval row's prompt: one that
// is empty under a tokenizer without bos gives the model no token to start
// from, refused here rather than at the first evaluation.
void check_rouge_prompts(const Run& run, const Dataset& data) {
  if (run.config.task_metric != TaskMetric::rouge || run.kind == ModelKind::seq2seq) return;
  for (size_t i = 0; i < std::min(size_t(run.config.metric_examples), data.examples.size()); ++i)
    FT_CHECK(!prompt_tokens(*run.tokenizer, data.examples[i].prompt, prompt_form(data)).empty(), data.path, ":",
             data.examples[i].line, ": the prompt has no token (it is empty, or no message comes before the reply, "
             "and no bos token is added), and task_metric: rouge generates from each eval row's prompt (give it "
             "some text, or set task_metric: none)");
}

std::unique_ptr<DataLoader> make_loader(Run& run, const std::string& path, const char* what, Dataset* keep) {
  const RowTemplate& row_template = run.config.data.row_template;
  Dataset data = row_template.empty() ? load_jsonl(path, run.config.data.format) : load_templated(path, row_template);
  FT_CHECK(!keep || run.config.task_metric != TaskMetric::rouge || run.kind == ModelKind::seq2seq ||
               data.format != DataFormat::text,
           path, ": task_metric: rouge scores the completion generated for each row's prompt, and these are text rows "
           "(no prompt): give data.eval prompt/completion, chat or Alpaca rows, or set task_metric: none");
  if (run.kind == ModelKind::seq2seq && data.format == DataFormat::text)  // the encoder reads the text's beginning
    for (Example& example : data.examples)
      std::tie(example.prompt, example.completion) = split_text_row(example.completion, run.config.data.text_split);
  ChatTemplate chat;
  if (data.format == DataFormat::chat) {
    chat = run.chat ? *run.chat
                    : resolve_chat_template(run.config.data.chat_template,
                                            std::filesystem::path(run.config.tokenizer).parent_path().string());
    set_chat_prompts(data, chat);
  }
  if (keep) check_rouge_prompts(run, data);
  TokenizedDataset tokens = tokenize_dataset(data, *run.tokenizer, run.config.seq_len,
                                             run.special_tokens.example_eos_id, &chat,
                                             run.kind == ModelKind::seq2seq ? RowLayout::seq2seq : RowLayout::causal,
                                             run.config.data.packing, run.config.data.loss_scope);
  std::cout << what << ": " << data.examples.size() << " examples, " << tokens.loss_token_count
            << " loss tokens, " << tokens.truncated_count << " truncated to seq_len " << run.config.seq_len << ", "
            << tokens.dropped_count << " dropped (no completion token within seq_len)\n";
  if (keep) *keep = std::move(data);
  return std::make_unique<DataLoader>(make_rows(tokens, run.config.seq_len, run.config.data.packing),
                                      run.config.micro_batch_size, run.config.seq_len, padding_id(*run.tokenizer),
                                      run.config.seed, run.host);
}

// objective: dpo: micro_batch_size pairs per micro-batch.
std::unique_ptr<PreferenceLoader> make_pair_loader(Run& run, const std::string& path, const char* what,
                                                   Dataset* keep) {
  const bool reward = run.config.objective == Objective::reward;
  const std::vector<PreferencePair> pairs = load_preference_jsonl(path, reward);
  const bool conversational = std::any_of(pairs.begin(), pairs.end(), [](const PreferencePair& pair) {
    return !pair.conversation.is_null();
  });
  FT_CHECK(!conversational || run.chat, path, ": conversational pairs, but the first row of data.train (",
           run.config.data.train, ") is not: give both files in one form");
  TokenizedPairs tokens = tokenize_pairs(pairs, path, *run.tokenizer, run.config.seq_len,
                                         run.special_tokens.example_eos_id, run.chat ? &*run.chat : nullptr, reward);
  std::cout << what << ": " << tokens.chosen.size() << " preference pairs, ";
  if (reward)
    std::cout << tokens.too_long_count << " pairs dropped as longer than seq_len + 1 = " << run.config.seq_len + 1
              << " tokens (trl's RewardTrainer filters them), ";
  std::cout << tokens.truncated_count << " completions truncated to seq_len " << run.config.seq_len << ", "
            << tokens.dropped_count << " pairs dropped (a completion with no token left)\n";
  if (keep) {
    keep->path = path;
    for (const PreferencePair& pair : pairs) keep->examples.push_back(chosen_example(pair));
    if (conversational) keep->format = DataFormat::chat, set_chat_prompts(*keep, *run.chat);
  }
  if (run.config.data.packing == Packing::padding_free) tokens = packed_pairs(tokens, run.config.seq_len);
  return std::make_unique<PreferenceLoader>(tokens, run.config.micro_batch_size, run.config.seq_len,
                                            padding_id(*run.tokenizer), run.config.seed, run.host);
}

// objective: grpo: prompts a step, each generated num_generations times;
// ppo: ppo.batch_size, one response each.
int64_t prompts_per_step(const TrainConfig& config) {
  if (config.objective == Objective::ppo) return config.ppo.batch_size;
  return config.micro_batch_size * config.grad_accum_steps / config.grpo.num_generations;
}

// The train rows a saved data position indexes: those the data preparation
// kept (seq_len, data.completion_only_loss and the like decide which fit).
int64_t train_rows(const Run& run) {
  if (run.train_prompts) return int64_t(run.train_prompts->rows().size());
  return run.train_pairs ? run.train_pairs->row_count() : run.train->row_count();
}

int64_t train_batches_per_epoch(const Run& run) {
  if (run.train_prompts) {  // a step's prompts as grad_accum_steps micro-batches, grpo.num_iterations times
    const int64_t per_step = prompts_per_step(run.config);
    const int64_t rows = int64_t(run.train_prompts->rows().size());
    const int64_t iterations = run.config.objective == Objective::grpo ? run.config.grpo.num_iterations : 1;
    return (rows + per_step - 1) / per_step * run.config.grad_accum_steps * iterations;
  }
  return run.train_pairs ? run.train_pairs->batches_per_epoch() : run.train->batches_per_epoch();
}

DataPosition train_position(const Run& run) {
  if (run.train_prompts) return run.train_prompts->position();
  return run.train_pairs ? run.train_pairs->position() : run.train->position();
}

void set_train_position(Run& run, DataPosition position) {
  if (run.train_prompts) run.train_prompts->set_position(position);
  else if (run.train_pairs) run.train_pairs->set_position(position);
  else run.train->set_position(position);
}

// The longest completion a rollout samples (objective: grpo or ppo).
int64_t max_completion_tokens(const TrainConfig& config) {
  return config.objective == Objective::ppo ? config.ppo_max_new_tokens : config.grpo.max_completion_length;
}

// A held-out prompt row as the end-of-run samples show it: its prompt text
// (rendered, for a conversational one) and its "completion" string, when it
// has one, as the reference; a conversational row's messages then the
// reference as the assistant's, so the samples file holds its messages.
Example sample_example(const PromptRow& row) {
  Example example;
  example.prompt = row.prompt;
  if (row.row.contains("completion") && row.row["completion"].is_string())
    example.completion = row.row["completion"].get<std::string>();
  if (row.messages.is_null()) return example;
  for (const nlohmann::ordered_json& m : row.messages)
    example.messages.push_back({m["role"].get<std::string>(), message_text(m)});
  example.messages.push_back({"assistant", example.completion});
  return example;
}

// objective: grpo or ppo: the prompt rows, cut to leave room for the completion, and the reward model.
void make_prompts(Run& run) {
  const TrainConfig& config = run.config;
  FT_CHECK(run.collectives.world_size() == 1, config.source, ": objective: ", enum_name(config.objective),
           " runs in one process (its rollouts are not split across ranks yet); run it without mpirun");
  const int64_t max_prompt_tokens = config.seq_len - max_completion_tokens(config);
  const ChatTemplate* chat = run.chat ? &*run.chat : nullptr;
  run.train_prompts = std::make_unique<PromptLoader>(
      load_prompt_rows(config.data.train, *run.tokenizer, max_prompt_tokens, run.kind, &config.rewards, chat),
      config.seed);
  const bool conversational = !run.train_prompts->rows()[0].messages.is_null();
  const int64_t completions = config.objective == Objective::ppo ? 1 : config.grpo.num_generations;
  std::cout << "train: " << run.train_prompts->rows().size() << " prompts, " << prompts_per_step(config)
            << " a step, " << completions << " completion" << (completions > 1 ? "s" : "") << " each\n";
  run.kl_controller = make_kl_controller(config.ppo);
  if (!config.data.eval.empty()) {
    run.eval_prompts =
        load_prompt_rows(config.data.eval, *run.tokenizer, max_prompt_tokens, run.kind, &config.rewards, chat);
    FT_CHECK(run.eval_prompts[0].messages.is_null() != conversational, config.data.eval, ": its prompts are ",
             conversational ? "strings" : "lists of messages", " and data.train's (", config.data.train,
             ") are not: give both files in one form");
    run.eval_examples.path = config.data.eval;
    if (conversational) run.eval_examples.format = DataFormat::chat;  // the samples render as training did
    for (const PromptRow& row : run.eval_prompts) run.eval_examples.examples.push_back(sample_example(row));
    std::cout << "eval: " << run.eval_prompts.size() << " prompts\n";
  }
  if (!config.rewards.model.empty())
    run.reward_model = std::make_unique<RewardModel>(
        config.rewards, *run.backend, reward_model_options(model_options(config), config.rewards.model_adapter),
        config.tokenizer, run.kind == ModelKind::seq2seq, config.micro_batch_size, conversational);
}

void make_data(Run& run) {
  const TrainConfig& config = run.config;
  const bool pairs = config.objective == Objective::dpo || config.objective == Objective::reward;
  const bool has_eval = !config.data.eval.empty();
  if (generates_rows(config.objective)) {
    make_prompts(run);
  } else if (pairs) {
    run.train_pairs = make_pair_loader(run, config.data.train, "train", nullptr);
    if (has_eval) run.eval_pairs = make_pair_loader(run, config.data.eval, "eval", &run.eval_examples);
  } else {
    run.train = make_loader(run, config.data.train, "train", nullptr);
    if (has_eval) run.eval = make_loader(run, config.data.eval, "eval", &run.eval_examples);
  }
  // A step takes grad_accum_steps micro-batches on each data-parallel rank.
  const int64_t per_step = checked_mul(config.grad_accum_steps, int64_t(run.replicas().world_size()));
  const int64_t batches_per_epoch = train_batches_per_epoch(run);
  const int64_t steps_per_epoch = (batches_per_epoch + per_step - 1) / per_step;
  run.total_steps = config.max_steps > 0 ? config.max_steps : checked_mul(config.epochs, steps_per_epoch);
  // Steps are whole: the data streams on into the next epoch's shuffle (transformers' Trainer instead ends an
  // epoch with a shorter step).
  if (config.max_steps == 0 && batches_per_epoch % per_step != 0)
    std::cout << "warning: an epoch is " << batches_per_epoch << " micro-batches and a step takes " << per_step
              << ": each epoch's last step also takes " << per_step - batches_per_epoch % per_step
              << " from the next epoch's shuffle, so epochs: " << config.epochs << " trains " << run.total_steps
              << " x " << per_step << " micro-batches\n";
  // A ratio's steps as transformers' get_warmup_steps rounds them: up.
  const int64_t warmup_steps = config.warmup_fraction > 0
                                   ? int64_t(std::ceil(double(run.total_steps) * config.warmup_fraction))
                                   : config.warmup_steps;
  run.schedule = LrSchedule{config.schedule, config.lr, warmup_steps, run.total_steps, config.min_lr_ratio};
}

}  // namespace

namespace {

// ZeRO-1: each data-parallel rank updated its share of the parameters; every
// rank gets every share's new values from its owner.
void share_updated_parameters(Run& run) {
  if (!run.sharded) return;
  for (int owner = 0; owner < run.replicas().world_size(); ++owner) {
    std::vector<Tensor*> values;
    for (size_t i = 0; i < run.trainable.size(); ++i)
      if (run.state_owners[i] == owner) values.push_back(&run.trainable[i]->value);
    run.replicas().broadcast(*run.backend, run.host, values, owner);
  }
}

// The end of a training step once report.loss is known: the optimizer step
// (none without a trained token) at this step's learning rate. AdamW leaves
// every weight and moment as it was when the gradient norm is not finite, and
// a non-finite loss skips it.
void finish_step(Run& run, int64_t step, bool trained_anything, StepReport& report) {
  report.lr = run.schedule.lr_at(step);
  const bool loss_finite = std::isfinite(report.loss);
  double grad_norm = std::nan("");
  if (trained_anything && loss_finite) {
    const double squared =
        run.pipeline_stages > 1 ? pipeline_squared_grad_norm(*run.backend, run.trainable, run.stages(), run.host,
                                                             run.tensor())
        : run.tensor_ranks > 1  ? tensor_squared_grad_norm(run.tensor(), *run.backend, run.trainable)
                                : add_squared_gradients(*run.backend, run.trainable, 0.0);
    grad_norm = run.optimizer->step(report.lr, squared);
    if (std::isfinite(grad_norm)) share_updated_parameters(run);
  }
  report.grad_norm = trained_anything ? grad_norm : 0.0;
  report.update_skipped = !loss_finite || !std::isfinite(report.grad_norm);
  report.peak_memory_bytes = run.tracker->stats().total_peak_bytes;
}

// One optimizer step over grad_accum_steps micro-batches on each of the
// data-parallel ranks (data_parallel.h). The loss is the mean over every
// counted token of all of them (each micro-batch's gradient is weighted by its
// share of the tokens, which is where the 1 / (micro-batches x ranks) of a
// plain mean would go), as if they were one batch; the gradients and the loss
// are summed over the ranks before the optimizer sees them. With
// parallel.pipeline the micro-batches run through the stages (pipeline.h).
StepReport train_step(Run& run, int64_t step) {
  const StepBatches batches = draw_step_batches(*run.train, run.host, run.config.grad_accum_steps, run.replicas());
  const int64_t counted = batches.counted_tokens;
  run.model->zero_grads();
  StepReport report;
  report.step = step + 1;
  report.tokens = batches.tokens;
  report.loss_tokens = counted;
  std::vector<PipelineMicroBatch> micro_batches;
  for (const RankBatch& mine : batches.mine) {
    if (mine.batch.counted_tokens == 0) continue;
    const int64_t micro_batch = checked_mul(step, batches.per_step) + mine.index;
    micro_batches.push_back({&mine.batch, splitmix64(run.config.seed, uint64_t(micro_batch)),  // one seed per micro-batch
                             float(mine.batch.counted_tokens) / float(counted)});
  }
  double loss_sum = 0.0;
  if (run.pipeline_stages > 1) {
    loss_sum = pipeline_forward_backward(causal_lm(*run.model, "parallel.pipeline"), run.stages(), run.host,
                                         micro_batches);
  } else {
    for (const PipelineMicroBatch& micro : micro_batches) {
      run.model->set_dropout_seed(micro.dropout_seed);
      loss_sum += double(micro_batch_loss(*run.model, *micro.batch, &micro.grad_scale)) *
                  double(micro.batch->counted_tokens);
    }
  }
  sum_partial_gradients(run.tensor(), *run.backend, run.host, run.trainable);
  loss_sum = sum_over_ranks(run.replicas(), *run.backend, run.host, run.trainable, loss_sum);
  loss_sum = run.stages().sum(loss_sum);  // the last stage's, on every stage
  report.loss = counted ? loss_sum / double(counted) : 0.0;
  finish_step(run, step, counted > 0, report);
  return report;
}

// objective: dpo or reward: one optimizer step over grad_accum_steps
// micro-batches of pairs, the loss the mean over all their pairs (each pair
// weighs 1 / pairs), as trl's over one batch. micro_batch(batch, pair_weight)
// runs one micro-batch's pairs and returns their figures (DpoFigures or
// RewardFigures), whose means go to report.figures.
template <class MicroBatch>
StepReport pairs_train_step(Run& run, int64_t step, const MicroBatch& micro_batch) {
  std::vector<Batch> batches;
  int64_t pairs = 0;
  for (int64_t i = 0; i < run.config.grad_accum_steps; ++i) {
    batches.push_back(trim_padding(run.train_pairs->next(), run.host));
    pairs += count_pairs(batches.back());
  }
  run.model->zero_grads();
  StepReport report;
  report.step = step + 1;
  decltype(micro_batch(batches[0], 0.0)) figures;
  for (size_t i = 0; i < batches.size(); ++i) {
    report.tokens += batches[i].input_ids.numel();
    report.loss_tokens += batches[i].counted_tokens;
    if (count_pairs(batches[i]) == 0) continue;
    const int64_t index = checked_mul(step, run.config.grad_accum_steps) + int64_t(i);
    run.model->set_dropout_seed(splitmix64(run.config.seed, uint64_t(index)));
    figures.add(micro_batch(batches[i], 1.0 / double(pairs)));
  }
  report.figures = figures.means();
  report.loss = report.figures["loss"].get<double>();
  report.figures.erase("loss");
  finish_step(run, step, pairs > 0, report);
  return report;
}

StepReport dpo_train_step(Run& run, int64_t step) {
  CausalLM& model = causal_lm(*run.model, "objective: dpo");
  return pairs_train_step(run, step, [&](const Batch& batch, double pair_weight) {
    return dpo_micro_batch(model, batch, run.config.dpo, true, pair_weight);
  });
}

// objective: grpo or ppo: how completions are sampled: temperature 1 (trl's
// default, and the distribution the losses' log-probabilities are of).
RolloutSampler rollout_sampler(Run& run) {
  const TrainConfig& config = run.config;
  const bool ppo = config.objective == Objective::ppo;
  SamplingOptions sampling;
  sampling.max_new_tokens = max_completion_tokens(config);
  sampling.temperature = 1.0;
  sampling.top_p = ppo ? config.ppo_top_p : config.grpo_top_p;
  sampling.top_k = ppo ? config.ppo_top_k : config.grpo_top_k;
  return RolloutSampler{*run.model, *run.tokenizer, sampling, stop_condition(run),
                        config.micro_batch_size, config.seed};
}

StepReport grpo_train_step(Run& run, int64_t step) {
  const TrainConfig& config = run.config;
  const GrpoStep setup{rollout_sampler(run), config.grpo, config.rewards, run.reward_model.get(),
                       padding_id(*run.tokenizer), config.micro_batch_size, config.grad_accum_steps};
  run.model->zero_grads();
  StepReport report;
  report.step = step + 1;
  // trl's mu: a generation batch serves grpo.num_iterations steps.
  if (step % config.grpo.num_iterations == 0)
    run.grpo_generation = grpo_generate(setup, run.train_prompts->next(prompts_per_step(config)), step);
  FT_CHECK(run.grpo_generation.step == step - step % config.grpo.num_iterations, "grpo: step ", step,
           " has no generation batch (generated at step ", run.grpo_generation.step, ")");
  report.figures = grpo_step(setup, run.grpo_generation, step);
  report.loss = report.figures["loss"].get<double>();
  report.figures.erase("loss");
  const double completions = double(run.config.micro_batch_size * run.config.grad_accum_steps);
  report.loss_tokens = int64_t(report.figures["completions/mean_length"].get<double>() * completions + 0.5);
  report.tokens = report.loss_tokens;
  finish_step(run, step, true, report);
  return report;
}

// objective: ppo: one PPO step (trainer/rl/ppo_step.h), several optimizer
// updates at this step's learning rate.
StepReport ppo_train_step(Run& run, int64_t step) {
  const TrainConfig& config = run.config;
  StepReport report;
  report.step = step + 1;
  report.lr = run.schedule.lr_at(step);
  bool finite = true;
  const std::function<double()> update = [&] {
    const double grad_norm = run.optimizer->step(report.lr, add_squared_gradients(*run.backend, run.trainable, 0.0));
    finite = finite && std::isfinite(grad_norm);
    run.model->zero_grads();
    return grad_norm;
  };
  const PpoStep setup{rollout_sampler(run), config.ppo, config.rewards, run.reward_model.get(),
                      padding_id(*run.tokenizer), config.micro_batch_size, update};
  run.model->zero_grads();
  report.figures = ppo_step(setup, run.kl_controller, run.train_prompts->next(prompts_per_step(config)), step);
  report.loss = report.figures["ppo/loss/total"].get<double>();
  report.grad_norm = report.figures["ppo/grad_norm"].get<double>();
  report.loss_tokens = int64_t(report.figures["tokens/responses_len_mean"].get<double>() * double(config.ppo.batch_size));
  report.tokens = report.loss_tokens;
  report.update_skipped = !finite || !std::isfinite(report.loss);
  report.peak_memory_bytes = run.tracker->stats().total_peak_bytes;
  return report;
}

StepReport reward_train_step(Run& run, int64_t step) {
  CausalLM& model = causal_lm(*run.model, "objective: reward");
  const int32_t pad_id = padding_id(*run.tokenizer);
  return pairs_train_step(run, step, [&](const Batch& batch, double pair_weight) {
    return reward_micro_batch(model, batch, pad_id, true, pair_weight);
  });
}

// Host f32 tensors (offloaded optimizer state) are read where they are.
bool all_finite(Run& run, const Tensor& tensor) {
  Tensor host = tensor;
  if (tensor.device != Device::cpu || tensor.dtype != DType::f32) {
    host = Tensor::empty(tensor.shape, DType::f32, run.host, MemCategory::workspace);
    run.backend->copy(host, tensor);
  }
  const float* values = host.ptr<float>();
  for (int64_t i = 0; i < host.numel(); ++i)
    if (!std::isfinite(values[i])) return false;
  return true;
}

// Says what went wrong in a step whose update was skipped, and stops the run
// after max_bad_steps such steps in a row. Returns the new count in a row.
int64_t on_bad_step(Run& run, const StepReport& report, int64_t bad_in_a_row, Progress& progress) {
  std::string offender = "none of the gradients holds one";
  for (Parameter* p : run.trainable)
    if (!all_finite(run, p->grad)) {
      offender = "the first is the gradient of " + p->name;
      break;
    }
  bad_in_a_row += 1;
  std::ostringstream text;
  text << "step " << report.step << ": loss " << report.loss << ", gradient norm " << report.grad_norm
       << ": not finite, optimizer step skipped (" << offender << "); " << bad_in_a_row << " of max_bad_steps "
       << run.config.max_bad_steps << " in a row";
  progress.message(text.str());
  FT_CHECK(bad_in_a_row < run.config.max_bad_steps, "training diverged: ", bad_in_a_row,
           " steps in a row with a non-finite loss or gradient norm (max_bad_steps: ", run.config.max_bad_steps,
           ", ", run.config.source, "); the last step ended at ", report.step, " (", offender,
           "); nothing more was saved. Lower lr, or check the data and the base model");
  return bad_in_a_row;
}

// Nothing holding a NaN or Inf is ever written: an adapter or a training state
// is checked, every trainable value and moment, before its file is opened.
void check_finite_before_save(Run& run, const std::string& path) {
  for (size_t i = 0; i < run.optimizer->parameters().size(); ++i) {
    const Parameter& p = *run.optimizer->parameters()[i];
    const bool finite = all_finite(run, p.value) && all_finite(run, run.optimizer->master(i)) &&
                        all_finite(run, run.optimizer->first_moment(i)) &&
                        all_finite(run, run.optimizer->second_moment(i));
    FT_CHECK(finite, path, ": not written: ", p.name, " or its optimizer state holds a non-finite value (NaN or Inf)");
  }
}

// The slices of train_state_tensors' tensors over every trainable parameter
// (a sharded state gathered): each parameter's master and two moments.
std::vector<TensorSlice> state_slices(const Run& run) {
  std::vector<TensorSlice> slices;
  for (const Parameter* p : run.trainable) slices.insert(slices.end(), 3, p->slice);
  return slices;
}

// What the objective carries between steps, as JSON text for the training
// state (TrainProgress::objective_state): PPO's KL controller; GRPO's
// generation batch when the step after `steps_done` still trains on it.
std::string objective_state(const Run& run, int64_t steps_done) {
  if (run.config.objective == Objective::ppo) return run.kl_controller.to_json().dump();
  if (run.config.objective == Objective::grpo && steps_done % run.config.grpo.num_iterations != 0)
    return to_json(run.grpo_generation, run.train_prompts->rows()).dump();
  return "";
}

// Every pipeline holds the same state (a sharded one across its
// data-parallel ranks: they gather it first); the first pipeline's tensor
// ranks join their shards into whole tensors, and its stages gather theirs
// on rank 0, which writes one file, as one process would.
void save_state(Run& run, const std::string& path, int64_t step) {
  if (!run.sharded && !run.in_first_pipeline()) return;
  check_finite_before_save(run, path);
  NamedTensors tensors = train_state_tensors(*run.optimizer, run.host);
  if (run.sharded) tensors = gather_on_rank_zero(run.replicas(), *run.backend, run.host, std::move(tensors));
  if (!run.in_first_pipeline()) return;
  tensors = gather_tensor_shards(run.tensor(), *run.backend, run.host, std::move(tensors), state_slices(run));
  tensors = gather_on_rank_zero(run.stages(), *run.backend, run.host, std::move(tensors));
  if (run.leader)
    save_train_state(path, tensors, run.optimizer->steps_taken(), {step, train_position(run), {}, objective_state(run, step)},
                     run.identity);
}

struct EvalFigures {
  EvalLoss loss;
  bool has_rouge = false;
  RougeScores rouge;
  double preference_accuracy = 0.0;  // objective: dpo: rewards/accuracies; reward: accuracy
  double reward = 0.0, kl = 0.0;     // objective: grpo: the held-out prompts' mean reward and KL to the reference
  HeldOutSummary held_out;           // objective: grpo, ppo: the same and the completions
};

// objective: dpo or reward: trl's figures over the eval pairs, as eval_loss
// and eval_<figure> (trl's eval names).
EvalFigures evaluate_pairs(Run& run, int64_t step, Progress& progress, const char* label) {
  EvalFigures figures;
  CausalLM& model = causal_lm(*run.model, "a preference objective");
  nlohmann::json means, eval_means;
  int64_t pairs = 0;
  if (run.config.objective == Objective::reward) {
    const RewardFigures reward = evaluate_reward(model, *run.eval_pairs, padding_id(*run.tokenizer),
                                                 run.config.eval_batches);
    means = reward.means(), eval_means = reward.means("eval_"), pairs = reward.pairs;
    figures.preference_accuracy = means["accuracy"].get<double>();
  } else {
    const DpoFigures dpo = evaluate_dpo(model, *run.eval_pairs, run.config.dpo, run.config.eval_batches);
    means = dpo.means(), eval_means = dpo.means("eval_"), pairs = dpo.pairs;
    figures.preference_accuracy = means["rewards/accuracies"].get<double>();
  }
  figures.loss.loss = means["loss"].get<double>();
  progress.on_eval(step, eval_means);
  std::ostringstream line;
  line.precision(4);
  line << std::fixed << "eval (" << label << ", step " << step << ", " << pairs << " pairs):";
  for (const auto& item : means.items()) line << " " << item.key() << " " << item.value().get<double>();
  progress.message(line.str());
  return figures;
}

// objective: grpo: the held-out prompts' reward and KL to the reference
// (grpo_step.h's evaluate_rollouts), as eval_reward, eval_kl, ...
EvalFigures evaluate_prompts(Run& run, int64_t step, Progress& progress, const char* label) {
  EvalFigures figures;
  std::vector<const PromptRow*> prompts;
  const int64_t count = std::min<int64_t>(run.config.metric_examples, int64_t(run.eval_prompts.size()));
  for (int64_t i = 0; i < count; ++i) prompts.push_back(&run.eval_prompts[size_t(i)]);
  const HeldOutRollouts held_out =
      evaluate_rollouts(rollout_sampler(run), run.config.rewards, run.reward_model.get(), padding_id(*run.tokenizer),
                        prompts);
  const nlohmann::json& means = held_out.figures;
  figures.reward = means["reward"].get<double>();
  figures.kl = means["kl"].get<double>();
  figures.held_out = {figures.reward, means["reward_std"].get<double>(), figures.kl, {}, {}, {}};
  const std::vector<std::string>& names = held_out.rewards.names;
  const auto model = std::find(names.begin(), names.end(), "model");
  if (model != names.end()) figures.held_out.model_scores = held_out.rewards.values[size_t(model - names.begin())];
  for (const Rollout& c : held_out.completions) {
    figures.held_out.prompts.push_back(c.prompt);
    figures.held_out.completions.push_back(c.text);
  }
  nlohmann::json row;
  std::ostringstream line;
  line.precision(4);
  line << std::fixed << "eval (" << label << ", step " << step << ", " << count << " prompts):";
  for (const auto& item : means.items()) {
    row["eval_" + item.key()] = item.value();
    line << " " << item.key() << " " << item.value().get<double>();
  }
  progress.on_eval(step, row);
  progress.message(line.str());
  return figures;
}

EvalFigures evaluate(Run& run, int64_t step, Progress& progress, const char* label) {
  if (run.eval_pairs) return evaluate_pairs(run, step, progress, label);
  if (run.train_prompts) return run.eval_prompts.empty() ? EvalFigures{} : evaluate_prompts(run, step, progress, label);
  EvalFigures figures;
  if (!run.eval || !run.in_first_pipeline()) return figures;  // the other pipelines go on to the next step
  figures.loss = run.pipeline_stages == 1
                     ? evaluate_loss(*run.model, *run.eval, run.config.eval_batches)
                     : pipeline_eval_loss(causal_lm(*run.model, "parallel.pipeline"), run.stages(), run.host,
                                          *run.eval, run.config.eval_batches);
  if (!run.leader) return figures;
  nlohmann::json row = {{"eval_loss", figures.loss.loss}, {"eval_perplexity", figures.loss.perplexity}};
  std::ostringstream line;
  line.precision(4);
  line << std::fixed << "eval (" << label << ", step " << step << "): loss " << figures.loss.loss << " perplexity "
       << figures.loss.perplexity;
  if (run.config.task_metric == TaskMetric::rouge) {
    TaskMetricResult metric = evaluate_rouge(*run.model, *run.tokenizer, run.eval_examples,
                                             run.config.metric_examples, run.config.generate.max_new_tokens,
                                             stop_condition(run), generation_batch(run.config, 16));
    figures.has_rouge = true;
    figures.rouge = metric.rouge;
    row["rouge1"] = metric.rouge.rouge1;
    row["rouge2"] = metric.rouge.rouge2;
    row["rougeL"] = metric.rouge.rougeL;
    line << " | rouge1 " << metric.rouge.rouge1 << " rouge2 " << metric.rouge.rouge2 << " rougeL "
         << metric.rouge.rougeL << " (" << std::min<int64_t>(run.config.metric_examples, int64_t(run.eval_examples.examples.size()))
         << " examples";
    if (metric.cut_prompts > 0)
      line << "; " << metric.cut_prompts << " prompts longer than the model's "
           << run.model->as_causal_lm()->config().position_limit() << " positions lost their first tokens";
    line << ")";
  }
  progress.on_eval(step, row);
  progress.message(line.str());
  return figures;
}

void fill_summary(Run& run, const EvalFigures& figures, RunSummary* summary) {
  if (!summary) return;
  summary->eval_loss = figures.loss.loss;
  summary->has_rouge = figures.has_rouge;
  summary->rouge = figures.rouge;
  summary->has_preference = run.eval_pairs != nullptr;
  summary->preference_accuracy = figures.preference_accuracy;
  summary->held_out_after = figures.held_out;
  summary->parameters = count_parameters(*run.model);
  summary->peak_memory_bytes = run.tracker->stats().total_peak_bytes;
}

// The opening words of a text, as a prompt for text-only datasets.
std::string opening_words(const std::string& text, int words) {
  std::istringstream stream(text);
  std::string word, out;
  for (int i = 0; i < words && stream >> word; ++i) out += (i ? " " : "") + word;
  return out;
}

// A shell word: text in single quotes.
std::string shell_quoted(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// The samples' prompts in output_dir/sample_prompts.jsonl, and the
// `finetune generate` command that gives the same completions from the saved
// adapter (or model): the same prompts in one batch (batching changes
// LLM.int8()'s outlier columns), base, precision, stops and sampling.
// A chat row's conversation up to its reply, as `generate --chat --file` reads it.
nlohmann::ordered_json reply_row(const Example& example) {
  if (!example.conversation.is_null()) {
    nlohmann::ordered_json row = example.conversation;
    row["messages"] = messages_before_reply(example.conversation);
    row.erase("prompt_messages");
    if (row.value("tools", nlohmann::ordered_json()).is_null()) row.erase("tools");
    return row;
  }
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  for (size_t m = 0; m + 1 < example.messages.size(); ++m)
    messages.push_back({{"role", example.messages[m].role}, {"content", example.messages[m].content}});
  return {{"messages", messages}};
}

// The samples' rows (chat rows as their conversations, which generate
// renders as training did) and the command that generates them again.
std::string write_sample_prompts(const Run& run, const std::vector<std::string>& prompts,
                                 const std::vector<std::string>& references, const SamplingOptions& sampled) {
  const TrainConfig& config = run.config;
  const bool chat = prompt_form(run.eval_examples) == PromptForm::chat;
  std::string rows;
  for (size_t i = 0; i < prompts.size(); ++i) {
    nlohmann::ordered_json row = chat ? reply_row(run.eval_examples.examples[i])
                                      : nlohmann::ordered_json{{"prompt", prompts[i]}};
    row["reference"] = references[i];
    rows += row.dump() + "\n";
  }
  const std::string path = path_in(config.output_dir, "sample_prompts.jsonl");
  write_file_atomically(path, rows);
  const bool full = config.trainable == Trainable::all;
  std::string command = "finetune generate " + shell_quoted(full ? path_in(config.output_dir, "model") : config.model);
  if (!full) command += " --adapter " + shell_quoted(path_in(config.output_dir, "adapter"));
  command += " --tokenizer " + shell_quoted(config.tokenizer) + " --quantization " +
             enum_name(full ? QuantizedBase::none : config.quantization.mode) + " --precision " +
             enum_name(config.precision) + " --max-new-tokens " + std::to_string(config.generate.max_new_tokens);
  for (const TokenRef& stop : config.generate.stop)
    command += " --stop " + shell_quoted(stop.text.empty() ? run.tokenizer->token_text(int32_t(stop.id)) : stop.text);
  if (chat) command += " --chat";
  if (chat && config.data.chat_template != ChatTemplateKind::automatic)
    command += " --chat-template " + std::string(enum_name(config.data.chat_template));
  command += " --file " + shell_quoted(path) + " --batch-size " +
             std::to_string(generation_batch(config, int64_t(prompts.size())));
  if (sampled.temperature > 0) {
    std::ostringstream sampling;
    sampling << " (sampled: --temperature " << sampled.temperature << " --top-p " << sampled.top_p << " --seed "
             << sampled.seed << ")";
    command += sampling.str();
  }
  return command;
}

void print_samples(Run& run, Progress& progress) {
  const int64_t count = std::min<int64_t>(run.config.generate.num_samples, int64_t(run.eval_examples.examples.size()));
  // A reward model scores text; its language-model head generates nothing it was trained for.
  if (count <= 0 || !run.leader || run.config.objective == Objective::reward) return;
  if (run.pipeline_stages > 1 || run.tensor_ranks > 1) {
    progress.message("samples: none (generate.num_samples: " + std::to_string(count) + "): under parallel." +
                     (run.pipeline_stages > 1 ? "pipeline" : "tensor") +
                     " no rank holds the whole model to generate with; generate from the saved adapter with "
                     "`finetune generate`");
    return;
  }
  std::vector<std::string> prompts, references;
  for (int64_t i = 0; i < count; ++i) {
    const Example& example = run.eval_examples.examples[size_t(i)];
    prompts.push_back(example.prompt.empty() ? opening_words(example.completion, 8) : example.prompt);
    references.push_back(example.completion);
  }
  SamplingOptions greedy, sampled;
  greedy.max_new_tokens = sampled.max_new_tokens = run.config.generate.max_new_tokens;
  sampled.temperature = run.config.generate.temperature;
  sampled.top_p = run.config.generate.top_p;
  sampled.seed = run.config.seed;
  const int64_t batch = generation_batch(run.config, count);
  const PromptForm form = prompt_form(run.eval_examples);
  std::vector<std::string> greedy_out =
      complete_prompts(*run.model, *run.tokenizer, prompts, greedy, stop_condition(run), batch, form);
  // At temperature 0 the sampled text is the greedy one.
  const bool sampling = sampled.temperature > 0;
  std::vector<std::string> sampled_out =
      sampling ? complete_prompts(*run.model, *run.tokenizer, prompts, sampled, stop_condition(run), batch, form)
               : std::vector<std::string>();
  for (int64_t i = 0; i < count; ++i) {
    std::ostringstream text;
    text << "--- sample " << i + 1 << " ---\n" << prompts[size_t(i)]
         << "\n  reference: " << references[size_t(i)] << "\n  greedy:    " << greedy_out[size_t(i)];
    if (sampling)
      text << "\n  sampled (temperature " << sampled.temperature << ", top_p " << sampled.top_p
           << "): " << sampled_out[size_t(i)];
    progress.message(text.str());
  }
  const std::string command = write_sample_prompts(run, prompts, references, sampled);
  // init: random's base is not saved with an adapter: nothing can run that model again.
  if (run.config.init == InitMode::random && run.config.trainable != Trainable::all)
    progress.message("the samples' prompts: " + path_in(run.config.output_dir, "sample_prompts.jsonl") +
                     " (init: random: the base's random weights are not saved, so no command gives these samples "
                     "again)");
  else
    progress.message("the samples again, from what this run saves: " + command);
}

// The full model in HF layout (config.json, model.safetensors, the tokenizer file),
// after training every parameter: loadable as `model:` by a later run.
void save_full_model(Run& run, const std::string& folder) {
  create_folder(folder, run.config.source + ": output_dir");
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (Parameter& p : run.model->parameters()) {
    Tensor host_copy = Tensor::empty(p.value.shape, p.value.dtype, run.host, MemCategory::workspace);
    run.backend->copy(host_copy, p.value);
    tensors.emplace_back(p.name, host_copy);
  }
  save_safetensors(path_in(folder, "model.safetensors"), tensors);
  // Every parameter is held in weight_dtype: a bf16 base trained in fp32 saves f32 weights, which
  // transformers would load as bf16 under the base's config.
  const nlohmann::json config =
      config_saved_as(path_in(run.config.model, "config.json"), run.model->options().weight_dtype);
  write_file_atomically(path_in(folder, "config.json"), config.dump(2) + "\n");
  copy_file_atomically(run.config.tokenizer, path_in(folder, run.tokenizer->file_name()));
}

// PPO's value head under trl's names (v_head.summary.weight and .bias), as
// trl keeps it beside the PEFT adapter.
void save_value_head(Run& run, const std::string& path) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  const HeadParameters& head = run.model->output_head();
  for (const Parameter* p : {head.weight, head.bias}) {
    Tensor value = Tensor::empty(p->value.shape, DType::f32, run.host, MemCategory::workspace);
    run.backend->copy(value, p->value);
    tensors.emplace_back(p->name, value);
  }
  save_safetensors(path, tensors);
  std::cout << "value head: " << path << "\n";
}

void save_outputs(Run& run) {
  if (!run.in_first_pipeline()) return;
  const TrainConfig& config = run.config;
  check_finite_before_save(run, path_in(config.output_dir, config.trainable == Trainable::all ? "model" : "adapter"));
  NamedTensors adapters = peft_adapter_tensors(*run.model, run.host);
  // The adapters' slices; the tensors after them (a score head) are whole.
  std::vector<TensorSlice> slices(adapters.size());
  for (size_t i = 0; i < run.model->adapters().size(); ++i) slices[i] = run.model->adapters()[i].slice;
  adapters = gather_tensor_shards(run.tensor(), *run.backend, run.host, std::move(adapters), slices);
  adapters = gather_on_rank_zero(run.stages(), *run.backend, run.host, std::move(adapters));
  if (!run.leader) return;
  if (config.trainable == Trainable::all) {
    save_full_model(run, path_in(config.output_dir, "model"));
    std::cout << "model: " << path_in(config.output_dir, "model") << "\n";
    return;
  }
  PeftAdapterConfig adapter;
  adapter.lora = *run.model->options().lora;  // with the architecture's default targets filled in
  adapter.base_model_name_or_path = config.model;
  adapter.task_type = peft_task_type(run.kind);
  if (config.objective == Objective::reward) {  // as PEFT saves a sequence classifier's adapter
    adapter.task_type = "SEQ_CLS";
    adapter.modules_to_save = {"score"};
  }
  save_peft_adapter(path_in(config.output_dir, "adapter"), adapters, run.model->options().lora, adapter);
  const bool config_file = fs::exists(config.source);
  write_adapter_record(path_in(config.output_dir, "adapter"),
                       {config.quantization.mode, config.quantization.double_quant, config.precision,
                        run.chat ? std::optional(run.chat->kind) : std::nullopt, config.source,
                        config_file ? file_fingerprint(config.source) : ""});
  std::cout << "adapter (PEFT format): " << path_in(config.output_dir, "adapter") << "\n";
  if (config.objective == Objective::ppo) save_value_head(run, path_in(config.output_dir, "value_head.safetensors"));
  if (config.objective == Objective::reward)
    std::cout << "reward model: `finetune score " << shell_quoted(config.model) << " --adapter "
              << shell_quoted(path_in(config.output_dir, "adapter"))
              << " --file ROWS.jsonl` scores rows; `finetune merge` with the same adapter writes a folder "
                 "AutoModelForSequenceClassification loads\n";
}

bool is_eval_row(const nlohmann::json& row) {
  for (const auto& item : row.items())
    if (item.key().starts_with("eval_")) return true;
  return false;
}

// Drops metric rows past the resumed step: a crash after the last checkpoint
// leaves rows for steps that will now be trained again. A run resumed at its
// last step evaluates again, so that step's eval rows go too (else --resume
// of a finished run, or of one killed during its final eval, repeats them).
// Atomic, so a crash here loses no row either.
void truncate_metrics(const std::string& path, int64_t resumed_step, bool final_eval_again) {
  std::ifstream in(path);
  std::string line, kept;
  while (std::getline(in, line)) {
    nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
    if (!row.is_object()) continue;
    const int64_t step = row.value("step", int64_t(0));
    if (step < resumed_step || (step == resumed_step && !(final_eval_again && is_eval_row(row)))) kept += line + "\n";
  }
  in.close();
  write_file_atomically(path, kept);
}

std::string describe_change(double before, double after) {
  std::ostringstream text;
  text.precision(4);
  text << std::fixed << before << " -> " << after;
  if (before != 0.0) text << " (" << std::showpos << std::setprecision(1) << 100.0 * (after - before) / before << "%)";
  return text.str();
}

// SIGINT or SIGTERM during training: the run saves a checkpoint at the next
// step boundary and ends. A second one ends it at once (the signal's own
// action), saying first what that loses. Only write(2) here: async-signal-safe.
volatile std::sig_atomic_t stop_signal = 0;

void say_from_handler(std::string_view text) { (void)!::write(STDERR_FILENO, text.data(), text.size()); }

void on_stop_signal(int signal) {
  say_from_handler(signal == SIGINT ? "\nSIGINT: " : "\nSIGTERM: ");
  if (stop_signal == 0) {
    stop_signal = signal;
    say_from_handler("stopping after this step, with a checkpoint (a second signal stops at once)\n");
    return;
  }
  say_from_handler("a second stop signal: stopped at once; the steps since the last checkpoint are lost\n");
  ::signal(signal, SIG_DFL);
  ::raise(signal);
}

struct StopOnSignals {
  struct sigaction previous_int {}, previous_term {};
  StopOnSignals() {
    stop_signal = 0;
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    action.sa_flags = SA_RESTART;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &previous_int);
    sigaction(SIGTERM, &action, &previous_term);
  }
  ~StopOnSignals() {
    sigaction(SIGINT, &previous_int, nullptr);
    sigaction(SIGTERM, &previous_term, nullptr);
  }
};

// Only rank 0 prints: the other ranks' standard output is dropped while
// they train (their errors and warnings still reach stderr).
struct QuietUnlessLeader {
  std::streambuf* previous = nullptr;
  explicit QuietUnlessLeader(bool leader) {
    if (!leader) previous = std::cout.rdbuf(nullptr);
  }
  ~QuietUnlessLeader() {
    if (previous) std::cout.rdbuf(previous);
  }
};

// The files the config names, each checked before anything loads: a typo
// is named with its field (the loaders name only the path).
void check_input_files(const TrainConfig& config) {
  std::error_code error;
  const std::string model_config = path_in(config.model, "config.json");
  FT_CHECK(fs::exists(model_config, error), config.source, ": model: ", model_config,
           ": no such file (expected a Hugging Face checkpoint folder)");
  for (const auto& [field, path] : {std::pair{"data.train", &config.data.train}, std::pair{"data.eval", &config.data.eval},
                                    std::pair{"tokenizer", &config.tokenizer}}) {
    const bool own = path == &config.tokenizer && *path == default_tokenizer_path(config.model);
    FT_CHECK(path->empty() || fs::exists(*path, error), config.source, ": ", field, ": ", *path, ": no such file",
             own ? " (the model folder has no tokenizer.model, tokenizer.json or spiece.model: set tokenizer)" : "");
    FT_CHECK(path->empty() || !fs::is_directory(*path, error), config.source, ": ", field, ": ", *path,
             ": is a folder; expected ", path == &config.tokenizer ? "a tokenizer.model or tokenizer.json file"
                                                                   : "a JSONL file");
  }
}

}  // namespace

int run_training(const TrainConfig& config, const RunOptions& options) {
  check_input_files(config);
  std::unique_ptr<Collectives> single = options.collectives ? nullptr : single_process_collectives();
  Collectives& collectives = options.collectives ? *options.collectives : *single;
  const int64_t data_ranks = data_parallel_ranks(config, collectives);
  collectives.set_timeout_s(config.parallel.timeout_s);
  QuietUnlessLeader quiet(collectives.rank() == 0);
  StopOnSignals stop_on_signals;
  Run run(config, collectives);
  create_folder(config.output_dir, config.source + ": output_dir");
  make_backend(run);
  check_same_device(collectives, *run.backend);
  StepOpProfile op_profile(*run.backend, std::cout);  // FT_PROFILE_OPS, read before the model loads
  make_model(run);
  std::cout << trainable_parameters_line(count_job_parameters(run)) << "\n";
  warn_unmatched_lora_keys(*run.model);
  run.identity.push_back(data_parallel_identity(data_ranks));
  if (run.pipeline_stages > 1) run.identity.push_back(pipeline_identity(run.pipeline_stages));
  if (run.tensor_ranks > 1) run.identity.push_back(tensor_identity(run.tensor_ranks));
  make_data(run);
  run.identity.push_back({"data.rows", "the train rows kept (the data, seq_len and data settings decide which fit: "
                          "the saved position counts them)", std::to_string(train_rows(run)), true});
  const std::string state_path = path_in(config.output_dir, "train_state.safetensors");
  const std::string metrics_path = path_in(config.output_dir, "metrics.jsonl");
  // Before anything of this run is written (after the config's own errors).
  check_outputs_free(config, options);
  if (!config.quantization.save_base.empty() && run.leader) save_base(run, *run.model);
  TrainProgress resumed;
  if (options.resume) {
    FT_CHECK(fs::exists(state_path), state_path, ": no training state to resume from");
    const auto job_trainable = size_t(run.stages().sum(double(run.trainable.size())));
    resumed = load_train_state(state_path, *run.optimizer, run.identity, options.allow_data_change, job_trainable);
    // Past the end: refused before anything is written, so the state (and its
    // steps) survives. At the end exactly, the run trains nothing and finishes
    // its outputs, which a crash after the last save may not have written.
    FT_CHECK(resumed.step <= run.total_steps, state_path, ": the training state is at step ", resumed.step,
             ", past the ", run.total_steps, " steps this config trains (max_steps, epochs): raise max_steps to "
             "continue");
    share_updated_parameters(run);  // a sharded state restored each rank's share only
    run.model->adapters_changed();
    for (const std::string& change : resumed.data_changes)
      std::cout << "warning: resuming with changed data (--allow-data-change): " << change << "\n";
    // Shorter changed data may end before the saved position (a prompt position counts prompts drawn).
    DataPosition position = resumed.data_position;
    const int64_t epoch_end = run.train_prompts ? train_rows(run) + 1 : train_batches_per_epoch(run);
    if (!resumed.data_changes.empty() && position.index >= epoch_end) {
      std::cout << "warning: the changed train data ends before the saved position (epoch " << position.epoch
                << ", " << position.index << " in): resuming at the start of epoch " << position.epoch + 1 << "\n";
      position = {position.epoch + 1, 0};
    }
    set_train_position(run, position);
    if (config.objective == Objective::ppo) {
      FT_CHECK(!resumed.objective_state.empty(), state_path, ": has no PPO state (the KL controller): it was not "
               "saved by an objective: ppo run");
      run.kl_controller = KlController::from_json(nlohmann::json::parse(resumed.objective_state));
    }
    if (config.objective == Objective::grpo && resumed.step % config.grpo.num_iterations != 0) {
      FT_CHECK(!resumed.objective_state.empty(), state_path, ": step ", resumed.step, " falls between the ",
               "grpo.num_iterations (", config.grpo.num_iterations, ") steps of one generation batch, and the state ",
               "has no saved generation batch: it was saved with another grpo.num_iterations");
      run.grpo_generation = grpo_generation_from_json(nlohmann::json::parse(resumed.objective_state),
                                                      run.train_prompts->rows(), state_path);
      FT_CHECK(run.grpo_generation.step == resumed.step - resumed.step % config.grpo.num_iterations, state_path,
               ": its generation batch is from step ", run.grpo_generation.step, ", not the one step ", resumed.step,
               " trains on with grpo.num_iterations ", config.grpo.num_iterations);
    }
    if (run.leader) truncate_metrics(metrics_path, resumed.step, resumed.step == run.total_steps);
    std::cout << "resumed at step " << resumed.step << " from " << state_path << "\n";
  } else if (run.leader) {
    remove_earlier_outputs(config);
    std::ofstream(metrics_path, std::ios::trunc);
  }
  MemoryStats memory = run.tracker->stats();
  std::cout << "memory: weights " << format_bytes(memory.current(MemCategory::weights)) << ", adapters "
            << format_bytes(memory.current(MemCategory::adapters)) << ", gradients "
            << format_bytes(memory.current(MemCategory::gradients)) << ", optimizer "
            << format_bytes(memory.current(MemCategory::optimizer));
  if (config.offload_optimizer == OffloadTarget::host)
    std::cout << ", optimizer state on the host " << format_bytes(run.host_state.stats().current(MemCategory::optimizer));
  if (run.sharded)
    std::cout << " (this rank's share: the state is sharded over " << run.replicas().world_size()
              << " data-parallel ranks, ZeRO-1)";
  if (const LayerStream* stream = run.model->layer_stream())
    std::cout << ", base layers 0-" << stream->layer_count() - 1 << " streamed from pinned host memory ("
              << format_bytes(stream->host_bytes()) << ") through " << stream->slot_count()
              << " device slots";
  std::cout << "\n";
  if (config.evaluate_only) {
    std::cout << "evaluating the model as loaded: no training steps";
  } else if (config.objective == Objective::ppo) {  // a step is ppo.batch_size rollouts, not micro_batch_size
    std::cout << "training " << run.total_steps << " PPO steps of " << config.ppo.batch_size
              << " rollouts (ppo.batch_size), each trained " << config.ppo.ppo_epochs << " times in mini-batches of "
              << config.ppo.mini_batch_size << ", of up to " << config.seq_len << " tokens";
  } else {
    std::cout << "training " << run.total_steps << " steps of " << config.micro_batch_size << " x "
              << config.grad_accum_steps;
    if (data_ranks > 1) std::cout << " x " << data_ranks << " ranks (data parallel)";
    std::cout << (run.train_pairs     ? " preference pairs (a chosen and a rejected sequence each)"
                  : run.train_prompts ? " completions"
                                      : " sequences")
              << " of up to " << config.seq_len << " tokens";
  }
  if (run.pipeline_stages > 1) std::cout << ", through " << run.pipeline_stages << " pipeline stages";
  if (run.tensor_ranks > 1) std::cout << ", each layer split over " << run.tensor_ranks << " tensor-parallel ranks";
  std::cout << "\n";

  // Rank 0 alone writes metrics.jsonl and loss.svg.
  Progress progress(run.leader ? metrics_path : "", run.total_steps, resumed.step, config.log_every);
  if (config.evaluate_only) {  // evaluated as built, and stops: nothing written but metrics.jsonl
    fill_summary(run, evaluate(run, 0, progress, "model as loaded, no training"), options.summary);
    return 0;
  }
  EvalFigures before;
  const bool compare_to_before = !options.resume && options.evaluate_before;
  if (compare_to_before) before = evaluate(run, 0, progress, "before training");
  progress.start();
  int64_t bad_in_a_row = 0;
  for (int64_t step = resumed.step; step < run.total_steps; ++step) {
    op_profile.begin_step();
    const StepReport report = config.objective == Objective::dpo      ? dpo_train_step(run, step)
                              : config.objective == Objective::reward ? reward_train_step(run, step)
                              : config.objective == Objective::grpo   ? grpo_train_step(run, step)
                              : config.objective == Objective::ppo    ? ppo_train_step(run, step)
                                                                      : train_step(run, step);
    op_profile.end_step();
    progress.on_step(report);
    bad_in_a_row = report.update_skipped ? on_bad_step(run, report, bad_in_a_row, progress) : 0;
    const bool last = step + 1 == run.total_steps;
    // The step's evaluation before its checkpoint (as transformers' Trainer):
    // a run stopped between the two resumes after the step, and would never
    // evaluate it.
    if (config.eval_every > 0 && (step + 1) % config.eval_every == 0 && !last) evaluate(run, step + 1, progress, "during training");
    if (config.save_every > 0 && (step + 1) % config.save_every == 0 && !last) save_state(run, state_path, step + 1);
    const int signal = job_stop_signal(collectives, int(stop_signal));  // this rank's or another's
    if (signal != 0 && !last) {
      save_state(run, state_path, step + 1);
      progress.finish();
      std::cout << (signal == SIGINT ? "SIGINT" : "SIGTERM") << ": stopped after step " << step + 1
                << "; checkpoint saved to " << state_path << "; continue with --resume\n";
      any_rank(collectives, false);  // the others wait until the checkpoint is written
      return 128 + signal;
    }
  }
  progress.finish();
  if (run.leader) op_profile.report(config.output_dir, std::cout);
  save_state(run, state_path, run.total_steps);
  EvalFigures after = evaluate(run, run.total_steps, progress, "after training");
  if (run.eval_pairs && compare_to_before)
    std::cout << (config.objective == Objective::reward ? "eval accuracy" : "eval rewards/accuracies")
              << " (held-out pairs) "
              << describe_change(before.preference_accuracy, after.preference_accuracy) << "\n";
  if (!run.eval_prompts.empty() && compare_to_before)
    std::cout << std::fixed << std::setprecision(4) << "eval reward (held-out prompts) " << before.reward << " -> "
              << after.reward << " (" << std::showpos << after.reward - before.reward << std::noshowpos
              << "); KL to the reference " << before.kl << " -> " << after.kl << std::defaultfloat << "\n";
  if ((run.eval || run.eval_pairs) && compare_to_before) {
    std::cout << "eval loss " << describe_change(before.loss.loss, after.loss.loss) << "\n";
    if (after.has_rouge)
      std::cout << "rouge1 " << describe_change(before.rouge.rouge1, after.rouge.rouge1) << ", rouge2 "
                << describe_change(before.rouge.rouge2, after.rouge.rouge2) << ", rougeL "
                << describe_change(before.rouge.rougeL, after.rouge.rougeL) << "\n";
  }
  print_samples(run, progress);
  save_outputs(run);
  fill_summary(run, after, options.summary);
  if (options.summary && !run.eval_prompts.empty() && compare_to_before) {
    options.summary->has_held_out = true;
    options.summary->held_out_before = before.held_out;
  }
  std::cout << "metrics: " << metrics_path << "\n";
  any_rank(collectives, false);  // the others end once rank 0 has written everything
  return 0;
}

}  // namespace ft
