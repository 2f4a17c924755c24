// TrainConfig: defaults, every field, path resolution, --set, and each error.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "kernels/checked_mul.h"
#include "kernels/error.h"
#include "kernels/tensor.h"
#include "trainer/train_config.h"

using namespace ft;

namespace {

const char* kMinimal = "model: models/tiny\ndata: {train: data/train.jsonl}\n";

TrainConfig parse(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return parse_train_config(yaml, "configs/x.yaml", overrides);
}

// The message of the Error that parsing throws ("" if none).
std::string error_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    parse(yaml, overrides);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("defaults, with relative paths resolved against the config's directory") {
  TrainConfig c = parse(kMinimal);
  CHECK(c.source == "configs/x.yaml");
  CHECK(c.model == "configs/models/tiny");
  CHECK(c.tokenizer == "configs/models/tiny/tokenizer.model");
  CHECK(c.init == InitMode::pretrained);
  CHECK(c.trainable == Trainable::lora);
  // PEFT's LoraConfig defaults; no target_modules: the architecture's default.
  CHECK(c.lora.r == 8);
  CHECK(c.lora.lora_alpha == 8.0);
  CHECK(c.lora.lora_dropout == 0.0);
  CHECK(c.lora.target_modules.empty());
  CHECK(c.lora.use_rslora == false);
  CHECK(c.quantization.mode == QuantizedBase::int8);
  CHECK(c.quantization.threshold == 6.0);
  CHECK(c.precision == Precision::fp32);
  CHECK(c.device == DeviceChoice::automatic);
  CHECK(c.data.train == "configs/data/train.jsonl");
  CHECK(c.data.eval == "");
  CHECK(c.data.format == DataFormat::automatic);
  CHECK(c.data.packing == Packing::none);
  CHECK((c.data.add_eos.enabled && c.data.add_eos.from_checkpoint));
  CHECK(c.seq_len == 256);
  CHECK(c.micro_batch_size == 4);
  CHECK(c.grad_accum_steps == 1);
  CHECK(c.lr == 2.0e-4);
  CHECK(c.warmup_steps == 0);
  CHECK(c.schedule == Schedule::cosine);
  CHECK(c.min_lr_ratio == 0.0);
  CHECK(c.weight_decay == 0.0);
  CHECK(c.max_grad_norm == 1.0);
  CHECK(c.max_steps == 0);
  CHECK(c.epochs == 1);
  CHECK(c.eval_every == 0);
  CHECK(c.eval_batches == 0);
  CHECK(c.save_every == 0);
  CHECK(c.log_every == 1);
  CHECK(c.seed == 1234);
  CHECK(c.output_dir == "configs/runs/out");
  CHECK(c.generate.max_new_tokens == 48);
  CHECK(c.generate.temperature == 0.7);
  CHECK(c.generate.top_p == 0.9);
  CHECK(c.generate.num_samples == 3);
  CHECK(c.generate.stop.empty());
  CHECK(c.task_metric == TaskMetric::none);
  CHECK(c.metric_examples == 50);
}

TEST_CASE("every field can be set from YAML") {
  TrainConfig c = parse(R"(
model: /abs/model
tokenizer: ../shared/tok.model
init: random
trainable: all
lora: {r: 16, lora_alpha: 32, lora_dropout: 0, target_modules: [q_proj, k_proj, o_proj], use_rslora: true}
quantization:
  mode: none
  threshold: 4.5
precision: bf16
device: cuda
data:
  train: train.jsonl
  eval: eval.jsonl
  format: prompt_completion
  packing: yes
  completion_only_loss: false
  assistant_only_loss: false
seq_len: 512
micro_batch_size: 2
grad_accum_steps: 8
lr: 3e-4
warmup_steps: 10
schedule: linear
min_lr_ratio: 0.1
weight_decay: 0.01
max_grad_norm: 0
max_steps: 100
epochs: 0
eval_every: 20
eval_batches: 5
save_every: 50
log_every: 10
seed: 7
output_dir: /tmp/run
generate: {max_new_tokens: 16, temperature: 0, top_p: 1, num_samples: 1}
task_metric: rouge
metric_examples: 20
)");
  CHECK(c.model == "/abs/model");
  CHECK(c.tokenizer == "shared/tok.model");  // configs/../shared, normalised
  CHECK(c.init == InitMode::random);
  CHECK(c.trainable == Trainable::all);
  CHECK(c.lora.r == 16);
  CHECK(c.lora.lora_alpha == 32.0);
  CHECK(c.lora.lora_dropout == 0.0);
  CHECK(c.lora.target_modules == std::vector<std::string>{"q_proj", "k_proj", "o_proj"});
  CHECK(c.lora.use_rslora == true);
  CHECK(c.quantization.mode == QuantizedBase::none);
  CHECK(c.quantization.threshold == 4.5);
  CHECK(c.precision == Precision::bf16);
  CHECK(c.device == DeviceChoice::cuda);
  CHECK(c.data.train == "configs/train.jsonl");
  CHECK(c.data.eval == "configs/eval.jsonl");
  CHECK(c.data.format == DataFormat::prompt_completion);
  CHECK(!c.data.loss_scope.completion_only);
  CHECK(!c.data.loss_scope.assistant_only);
  CHECK(c.data.packing == Packing::padding_free);
  CHECK(c.seq_len == 512);
  CHECK(c.micro_batch_size == 2);
  CHECK(c.grad_accum_steps == 8);
  CHECK(c.lr == 3e-4);
  CHECK(c.warmup_steps == 10);
  CHECK(c.schedule == Schedule::linear);
  CHECK(c.min_lr_ratio == 0.1);
  CHECK(c.weight_decay == 0.01);
  CHECK(c.max_grad_norm == 0.0);
  CHECK(c.max_steps == 100);
  CHECK(c.epochs == 0);
  CHECK(c.eval_every == 20);
  CHECK(c.eval_batches == 5);
  CHECK(c.save_every == 50);
  CHECK(c.log_every == 10);
  CHECK(c.seed == 7);
  CHECK(c.output_dir == "/tmp/run");
  CHECK(c.generate.max_new_tokens == 16);
  CHECK(c.generate.temperature == 0.0);
  CHECK(c.generate.top_p == 1.0);
  CHECK(c.generate.num_samples == 1);
  CHECK(c.task_metric == TaskMetric::rouge);
  CHECK(c.metric_examples == 20);
  CHECK(std::string(enum_name(c.schedule)) == "linear");
  CHECK(std::string(enum_name(c.device)) == "cuda");
  CHECK(std::string(enum_name(DeviceChoice::automatic)) == "auto");
  CHECK(std::string(enum_name(c.data.format)) == "prompt_completion");
}

TEST_CASE("--set overrides: dotted keys, YAML flow values, whole sections, cwd-relative paths") {
  TrainConfig c = parse(kMinimal, {"lr=3e-4", "lora.r=16", "lora.target_modules=[q_proj,k_proj]", "data.packing=true",
                                   "output_dir=runs/b", "schedule=constant",
                                   "generate={temperature: 0, num_samples: 1}", "data.eval=", "seed=99"});
  CHECK(c.lr == 3e-4);
  CHECK(c.lora.r == 16);
  CHECK(c.lora.target_modules == std::vector<std::string>{"q_proj", "k_proj"});
  CHECK(c.data.packing == Packing::padding_free);
  CHECK(c.output_dir == "runs/b");  // not under configs/: command-line paths are cwd-relative
  CHECK(c.schedule == Schedule::constant);
  CHECK(c.generate.temperature == 0.0);
  CHECK(c.generate.num_samples == 1);
  CHECK(c.generate.max_new_tokens == 48);  // untouched by the section override
  CHECK(c.data.eval == "");
  CHECK(c.seed == 99);
  // The last --set wins, and --set model moves the default tokenizer along.
  TrainConfig later = parse(kMinimal, {"lr=1", "lr=0.5", "model=/m"});
  CHECK(later.lr == 0.5);
  CHECK(later.tokenizer == "/m/tokenizer.model");
  // A config without its own directory keeps relative paths as written.
  TrainConfig bare = parse_train_config(kMinimal, "x.yaml", {});
  CHECK(bare.model == "models/tiny");
  CHECK(bare.output_dir == "runs/out");
}

TEST_CASE("${output_dir} at a path's start is under output_dir as finally set, --set included") {
  const std::string yaml = "model: models/tiny\ndata: {train: data/train.jsonl, eval: '${output_dir}/eval.jsonl'}\n"
                           "output_dir: ../runs/lab\nobjective: ppo\n"
                           "rewards: {model: rm, model_adapter: '${output_dir}/rm/adapter'}\n";
  TrainConfig c = parse(yaml);
  CHECK(c.output_dir == "runs/lab");  // configs/../runs/lab
  CHECK(c.rewards.model_adapter == "runs/lab/rm/adapter");
  CHECK(c.data.eval == "runs/lab/eval.jsonl");
  CHECK(c.data.train == "configs/data/train.jsonl");
  CHECK(c.rewards.model == "configs/rm");
  // A later --set output_dir moves them; in --set itself the variable works the same.
  TrainConfig moved = parse(yaml, {"output_dir=/tmp/elsewhere", "rewards.model=${output_dir}"});
  CHECK(moved.rewards.model_adapter == "/tmp/elsewhere/rm/adapter");
  CHECK(moved.rewards.model == "/tmp/elsewhere");
  CHECK(moved.data.eval == "/tmp/elsewhere/eval.jsonl");
  // Anything else written as a variable is refused, naming the field.
  CHECK(error_of(std::string(kMinimal) + "rewards: {model: '${HOME}/rm'}\n") ==
        "configs/x.yaml:3: rewards.model: expected a path; the only variable is ${output_dir}, at its start, got "
        "\"${HOME}/rm\"");
  CHECK(error_of(std::string(kMinimal) + "rewards: {model: '${output_dir}rm'}\n").find(
            "rewards.model: expected a path; the only variable is ${output_dir}") != std::string::npos);
  CHECK(error_of(kMinimal, {"output_dir=${output_dir}/x"}) ==
        "configs/x.yaml (--set output_dir=${output_dir}/x): output_dir: expected a directory path without "
        "${output_dir} (it is output_dir itself), got \"${output_dir}/x\"");
}

TEST_CASE("load_train_config reads a file and resolves paths next to it") {
  std::filesystem::path dir = std::filesystem::path(FT_BINARY_DIR) / "test_train_config_tmp";
  std::filesystem::create_directories(dir);
  std::string path = (dir / "run.yaml").string();
  std::ofstream(path) << kMinimal << "lr: 0.001\n";
  TrainConfig c = load_train_config(path, {"micro_batch_size=1"});
  CHECK(c.model == (dir / "models/tiny").string());
  CHECK(c.data.train == (dir / "data/train.jsonl").string());
  CHECK(c.lr == 0.001);
  CHECK(c.micro_batch_size == 1);
  std::string missing = (dir / "missing.yaml").string();
  CHECK_THROWS_WITH_AS(load_train_config(missing, {}), (missing + ": cannot open config file").c_str(), Error);
  std::filesystem::remove_all(dir);
}

TEST_CASE("unknown keys suggest the nearest valid key, at every level and in --set") {
  CHECK(error_of(std::string(kMinimal) + "lora:\n  rank: 4\n") ==
        "configs/x.yaml:4: unknown key \"lora.rank\"; did you mean \"lora.r\"?");
  CHECK(error_of(std::string(kMinimal) + "seq_length: 128\n") ==
        "configs/x.yaml:3: unknown key \"seq_length\"; did you mean \"seq_len\"?");
  CHECK(error_of(std::string(kMinimal) + "quantisation: {mode: none}\n") ==
        "configs/x.yaml:3: unknown key \"quantisation\"; did you mean \"quantization\"?");
  CHECK(error_of(kMinimal, {"lora.rank=4"}) ==
        "configs/x.yaml (--set lora.rank=4): unknown key \"lora.rank\"; did you mean \"lora.r\"?");
  // transformers' and PEFT's names where the nearest spelling would mislead: the key that does it, or that none does.
  CHECK(error_of(kMinimal, {"learning_rate=1"}).ends_with("unknown key \"learning_rate\"; this config's key is \"lr\""));
  CHECK(error_of(kMinimal, {"gradient_accumulation_steps=2"})
            .ends_with("unknown key \"gradient_accumulation_steps\"; this config's key is \"grad_accum_steps\""));
  CHECK(error_of(kMinimal, {"adam_beta1=0.8"})
            .ends_with("unknown key \"adam_beta1\"; AdamW's betas are fixed at transformers' defaults, 0.9 and 0.999"));
  CHECK(error_of(kMinimal, {"lora.bias=all"})
            .ends_with("unknown key \"lora.bias\"; LoRA trains no biases here (PEFT's bias=\"none\")"));
  CHECK(error_of(kMinimal, {"generate={top_k: 5}"}) ==
        "configs/x.yaml (--set generate={top_k: 5}): unknown key \"generate.top_k\"; did you mean \"generate.top_p\"?");
  // A name inside another of its section (PEFT's and trl's longer names), or the start of one.
  CHECK(error_of(kMinimal, {"lora.alpha=8"}).ends_with("unknown key \"lora.alpha\"; did you mean \"lora.lora_alpha\"?"));
  CHECK(error_of(kMinimal, {"dpo.loss=ipo"}).ends_with("unknown key \"dpo.loss\"; did you mean \"dpo.loss_type\"?"));
  CHECK(error_of(kMinimal, {"data.templat={}"}).ends_with("did you mean \"data.template\"?"));
  CHECK(error_of(kMinimal, {"lr_rate=1"}).ends_with("unknown key \"lr_rate\"; did you mean \"lr\"?"));
  // A comparison's list of runs is not a run's field: said so, not "did you mean lora.r".
  for (const char* set : {"compare.1.lr=1e-3", "compare=[]"})
    CHECK(error_of(kMinimal, {set}).find("a comparison's runs (compare:) are written in its file") !=
          std::string::npos);
  // Nothing near it in a known section: the section's keys.
  CHECK(error_of(kMinimal, {"dpo.label_smoothing=0.1"}).ends_with(
      "unknown key \"dpo.label_smoothing\"; dpo takes beta, loss_type"));
}

TEST_CASE("wrong types name the file, line, field and what was expected") {
  std::string base = std::string(kMinimal);
  CHECK(error_of(base + "lr: fast\n") == "configs/x.yaml:3: lr: expected a finite number, got \"fast\"");
  CHECK(error_of(base + "seq_len: 1.5\n") == "configs/x.yaml:3: seq_len: expected an integer in [1, 1048576], got \"1.5\"");
  CHECK(error_of(base + "seq_len: 0x10\n") == "configs/x.yaml:3: seq_len: expected an integer in [1, 1048576], got \"0x10\"");
  CHECK(error_of(base + "epochs:\n") == "configs/x.yaml:3: epochs: expected an integer in [0, 1000000], got nothing");
  CHECK(error_of(base + "mlp_chunk_tokens: -1\n") ==
        "configs/x.yaml:3: mlp_chunk_tokens: expected an integer in [0, 1073741824], got \"-1\"");
  CHECK(error_of(base + "mlp_chunk_tokens: 2.5\n") ==
        "configs/x.yaml:3: mlp_chunk_tokens: expected an integer in [0, 1073741824], got \"2.5\"");
  CHECK(error_of(base + "lora: {use_rslora: maybe}\n") ==
        "configs/x.yaml:3: lora.use_rslora: expected true or false, got \"maybe\"");
  CHECK(error_of(base + "lora: {target_modules: [q_proj, [k_proj]]}\n") ==
        "configs/x.yaml:3: lora.target_modules: expected a list of non-empty strings, got a list");
  CHECK(error_of(base + "lora: 8\n") == "configs/x.yaml:3: lora: expected a map of keys, got \"8\"");
  CHECK(error_of(base + "tokenizer: [a, b]\n") == "configs/x.yaml:3: tokenizer: expected a string, got a list");
  CHECK(error_of(base + "lr: {a: 1}\n") == "configs/x.yaml:3: lr: expected a finite number, got a map");
  CHECK(error_of(kMinimal, {"lr=fast"}) == "configs/x.yaml (--set lr=fast): lr: expected a finite number, got \"fast\"");
}

TEST_CASE("invalid enum values list the valid ones") {
  std::string base = std::string(kMinimal);
  CHECK(error_of(base + "schedule: cos\n") ==
        "configs/x.yaml:3: schedule: expected one of constant, linear, cosine, got \"cos\"");
  CHECK(error_of(base + "device: gpu\n") == "configs/x.yaml:3: device: expected one of auto, cpu, cuda, got \"gpu\"");
  CHECK(error_of(base + "precision: fp16\n") ==
        "configs/x.yaml:3: precision: expected one of fp32, bf16, got \"fp16\"");
  CHECK(error_of(base + "init: zeros\n") ==
        "configs/x.yaml:3: init: expected one of pretrained, random, got \"zeros\"");
  CHECK(error_of(kMinimal, {"data.packing=multipack"}) ==
        "configs/x.yaml (--set data.packing=multipack): data.packing: expected true, false, none, padding_free, "
        "concatenate, got \"multipack\"");
  CHECK(parse(base, {"data.packing=concatenate"}).data.packing == Packing::concatenate);
  CHECK(parse(base, {"data.packing=padding_free"}).data.packing == Packing::padding_free);
  CHECK(parse(base, {"data.packing=false"}).data.packing == Packing::none);
  CHECK(error_of(base + "trainable: some\n") == "configs/x.yaml:3: trainable: expected one of lora, all, got \"some\"");
  CHECK(error_of(base + "quantization: {mode: int4}\n") ==
        "configs/x.yaml:3: quantization.mode: expected one of int8, nf4, none, got \"int4\"");
  CHECK(error_of(kMinimal, {"data.format=csv"}) ==
        "configs/x.yaml (--set data.format=csv): data.format: expected one of auto, prompt_completion, text, chat, "
        "alpaca, got \"csv\"");
  CHECK(error_of(kMinimal, {"data.chat_template=vicuna"}) ==
        "configs/x.yaml (--set data.chat_template=vicuna): data.chat_template: expected one of auto, chatml, llama2, "
        "llama3, zephyr, got \"vicuna\"");
  CHECK(error_of(base + "task_metric: bleu\n") ==
        "configs/x.yaml:3: task_metric: expected one of none, rouge, got \"bleu\"");
}

TEST_CASE("out-of-range values") {
  std::string base = std::string(kMinimal);
  CHECK(error_of(base + "lora: {r: 0}\n") == "configs/x.yaml:3: lora.r: expected an integer in [1, 65536], got \"0\"");
  CHECK(error_of(base + "lora: {r: -4}\n") == "configs/x.yaml:3: lora.r: expected an integer in [1, 65536], got \"-4\"");
  CHECK(error_of(base + "lora: {lora_dropout: 1}\n") ==
        "configs/x.yaml:3: lora.lora_dropout: expected a number in [0, 1), got \"1\"");
  CHECK(error_of(base + "lora: {lora_dropout: -0.1}\n") ==
        "configs/x.yaml:3: lora.lora_dropout: expected a number in [0, 1), got \"-0.1\"");
  CHECK(error_of(base + "lora: {target_modules: []}\n") ==
        "configs/x.yaml:3: lora.target_modules: expected a non-empty list of module names such as [q_proj, "
        "v_proj], all-linear, or a regular expression over whole module names, got an empty list");
  CHECK(error_of(base + "lr: 0\n") == "configs/x.yaml:3: lr: expected a number in (0, 10], got \"0\"");
  CHECK(error_of(base + "objective: ppo\nrewards: {length: 4}\nppo: {batch_size: 1, mini_batch_size: 1, "
                        "max_new_tokens: 1}\n")
            .ends_with(": ppo.batch_size 1 with ppo.max_new_tokens 1 gives each step one response token, over which the "
                       "advantages cannot be whitened (an unbiased variance of one value): raise either"));
  // warmup_steps: whole steps, or (transformers 5) a ratio of the run's steps below 1.
  const TrainConfig ratio = parse(base + "warmup_steps: 0.03\n");
  CHECK(ratio.warmup_fraction == 0.03);
  CHECK(ratio.warmup_steps == 0);
  CHECK(parse(base + "warmup_steps: 12\n").warmup_fraction == 0.0);
  for (const char* bad : {"1.5", "-0.1", "1000000001"})
    CHECK(error_of(base + "warmup_steps: " + bad + "\n") ==
          std::string("configs/x.yaml:3: warmup_steps: expected an integer in [0, 1000000000] or a ratio of the "
                      "run's steps in (0, 1), got \"") + bad + "\"");
  CHECK(error_of(base + "seq_len: 0\n") == "configs/x.yaml:3: seq_len: expected an integer in [1, 1048576], got \"0\"");
  CHECK(error_of(base + "micro_batch_size: 0\n") ==
        "configs/x.yaml:3: micro_batch_size: expected an integer in [1, 65536], got \"0\"");
  CHECK(error_of(base + "grad_accum_steps: -1\n") ==
        "configs/x.yaml:3: grad_accum_steps: expected an integer in [1, 65536], got \"-1\"");
  CHECK(error_of(base + "min_lr_ratio: 1.5\n") ==
        "configs/x.yaml:3: min_lr_ratio: expected a number in [0, 1], got \"1.5\"");
  CHECK(error_of(base + "generate: {top_p: 0}\n") ==
        "configs/x.yaml:3: generate.top_p: expected a number in (0, 1], got \"0\"");
  CHECK(error_of(base + "log_every: 0\n") == "configs/x.yaml:3: log_every: expected an integer in [1, 1000000000], got \"0\"");
  CHECK(error_of(kMinimal, {"lora.r=0"}) ==
        "configs/x.yaml (--set lora.r=0): lora.r: expected an integer in [1, 65536], got \"0\"");
}

TEST_CASE("every integer has an upper bound, every number is finite, from YAML and --set alike") {
  std::string base = std::string(kMinimal);
  // Each of these once overflowed a size product downstream (2^62 x 8 bytes = 0).
  CHECK(error_of(kMinimal, {"lora.r=4611686018427387904"}) ==
        "configs/x.yaml (--set lora.r=4611686018427387904): lora.r: expected an integer in [1, 65536], got "
        "\"4611686018427387904\"");
  CHECK(error_of(kMinimal, {"micro_batch_size=4611686018427387904"}) ==
        "configs/x.yaml (--set micro_batch_size=4611686018427387904): micro_batch_size: expected an integer in "
        "[1, 65536], got \"4611686018427387904\"");
  CHECK(error_of(kMinimal, {"seq_len=1048577"}) ==
        "configs/x.yaml (--set seq_len=1048577): seq_len: expected an integer in [1, 1048576], got \"1048577\"");
  CHECK(error_of(kMinimal, {"epochs=4611686018427387904"}) ==
        "configs/x.yaml (--set epochs=4611686018427387904): epochs: expected an integer in [0, 1000000], got "
        "\"4611686018427387904\"");
  CHECK(error_of(kMinimal, {"grad_accum_steps=65537"}) ==
        "configs/x.yaml (--set grad_accum_steps=65537): grad_accum_steps: expected an integer in [1, 65536], got "
        "\"65537\"");
  CHECK(error_of(base + "max_steps: 99999999999999999999\n") ==
        "configs/x.yaml:3: max_steps: expected an integer in [0, 1000000000], got \"99999999999999999999\"");
  CHECK(error_of(base + "max_bad_steps: 0\n") ==
        "configs/x.yaml:3: max_bad_steps: expected an integer in [1, 1000000], got \"0\"");
  // The largest values are accepted, and their products fit.
  TrainConfig largest = parse(kMinimal, {"lora.r=65536", "micro_batch_size=65536", "seq_len=1048576",
                                         "grad_accum_steps=65536", "epochs=1000000", "max_bad_steps=1000000"});
  CHECK(largest.lora.r == 65536);
  CHECK(largest.max_bad_steps == 1000000);
  CHECK(parse(kMinimal).max_bad_steps == 3);

  CHECK(error_of(base + "lr: .inf\n") == "configs/x.yaml:3: lr: expected a finite number, got \".inf\"");
  CHECK(error_of(kMinimal, {"lr=.inf"}) == "configs/x.yaml (--set lr=.inf): lr: expected a finite number, got \".inf\"");
  CHECK(error_of(base + "lr: inf\n") == "configs/x.yaml:3: lr: expected a finite number, got \"inf\"");
  CHECK(error_of(base + "lr: nan\n") == "configs/x.yaml:3: lr: expected a finite number, got \"nan\"");
  CHECK(error_of(base + "lr: 1e999\n") == "configs/x.yaml:3: lr: expected a finite number, got \"1e999\"");
  CHECK(error_of(base + "lr: 1e30\n") == "configs/x.yaml:3: lr: expected a number in (0, 10], got \"1e30\"");
  CHECK(error_of(base + "weight_decay: 1e30\n") ==
        "configs/x.yaml:3: weight_decay: expected a number in [0, 10], got \"1e30\"");
  CHECK(error_of(base + "max_grad_norm: inf\n") ==
        "configs/x.yaml:3: max_grad_norm: expected a finite number, got \"inf\"");
  CHECK(error_of(base + "lora: {lora_alpha: 1e7}\n") ==
        "configs/x.yaml:3: lora.lora_alpha: expected a number in (0, 1e6], got \"1e7\"");
  CHECK(error_of(base + "lora: {lora_dropout: nan}\n") ==
        "configs/x.yaml:3: lora.lora_dropout: expected a finite number, got \"nan\"");
  CHECK(error_of(base + "generate: {temperature: 1000}\n") ==
        "configs/x.yaml:3: generate.temperature: expected a number in [0, 100] (0 = greedy), got \"1000\"");
}

TEST_CASE("checked_mul refuses products that leave int64_t and negative factors") {
  CHECK(checked_mul(65536, 1048576) == int64_t(1) << 36);
  CHECK(checked_mul(0, INT64_MAX) == 0);
  CHECK_THROWS_WITH_AS(checked_mul(int64_t(1) << 62, 8), "size 4611686018427387904 x 8 overflows a 64-bit count",
                       Error);
  CHECK_THROWS_WITH_AS(checked_mul(-1, 8), "size -1 x 8 is negative", Error);
  CHECK_THROWS_AS(shape_numel({int64_t(1) << 40, int64_t(1) << 40}), Error);
  HostAllocator host;  // 2^61 floats are 2^63 bytes: refused before allocating, not wrapped to a small size
  CHECK_THROWS_WITH_AS(Tensor::empty({int64_t(1) << 61}, DType::f32, host, MemCategory::workspace),
                       "size 2305843009213693952 x 4 overflows a 64-bit count", Error);
}

TEST_CASE("rules across fields, required fields, and malformed input") {
  std::string base = std::string(kMinimal);
  // trl's DPO trains on completions only: the loss scope is SFT's.
  CHECK(error_of(base + "objective: dpo\n", {"data.completion_only_loss=false"}) ==
        "configs/x.yaml: data.completion_only_loss: false applies to objective: sft, and this run's objective is dpo");
  CHECK(error_of(base + "objective: reward\n", {"data.assistant_only_loss=false"}) ==
        "configs/x.yaml: data.assistant_only_loss: false applies to objective: sft, and this run's objective is "
        "reward");
  // A reward model's adapter or tokenizer without the model, and rewards in a run that generates nothing.
  CHECK(error_of(base + "objective: grpo\nrewards: {length: 12, model_adapter: rm/adapter}\n") ==
        "configs/x.yaml: rewards.model_adapter belongs to a reward model: set rewards.model (its checkpoint folder) "
        "too");
  CHECK(error_of(base + "objective: ppo\nrewards: {length: 12, model_tokenizer: tok.model}\n") ==
        "configs/x.yaml: rewards.model_tokenizer belongs to a reward model: set rewards.model (its checkpoint "
        "folder) too");
  CHECK(error_of(base + "rewards: {rouge: completion}\n") ==
        "configs/x.yaml: rewards.rouge scores generated completions: rewards apply to objective: grpo and ppo, and "
        "this run's objective is sft");
  // An objective's own section under another objective: named where it was set (it was ignored).
  CHECK(error_of(base + "dpo: {beta: 0.5}\n") ==
        "configs/x.yaml:3: dpo.beta applies to objective: dpo, and this run's objective is sft");
  CHECK(error_of(base + "objective: grpo\nrewards: {length: 12}\n", {"ppo.batch_size=4"}) ==
        "configs/x.yaml (--set ppo.batch_size=4): ppo.batch_size applies to objective: ppo, and this run's "
        "objective is grpo");
  CHECK(error_of(base + "objective: dpo\ndpo: {beta: 0.5}\n").empty());
  CHECK(error_of(base + "max_steps: 0\nepochs: 0\n") ==
        "configs/x.yaml: max_steps and epochs are both 0; set one of them > 0");
  CHECK(error_of("data: {train: t.jsonl}\n") == "configs/x.yaml: model: required (a Hugging Face checkpoint folder)");
  CHECK(error_of("model: m\n") == "configs/x.yaml: data.train: required (a JSONL file)");
  CHECK(error_of("") == "configs/x.yaml: model: required (a Hugging Face checkpoint folder)");
  CHECK(error_of(base + "trainable: all\n") ==
        "configs/x.yaml: trainable: all needs quantization.mode: none (INT8 and NF4 base weights are frozen)");
  CHECK(error_of(base + "task_metric: rouge\n") ==
        "configs/x.yaml: task_metric: rouge needs data.eval (prompt/completion pairs to score)");
  CHECK(error_of(base + "lr: 1\nlr: 2\n") == "configs/x.yaml:4: duplicate key \"lr\" (set earlier in the same file)");
  // A dotted key and its section name one field twice, in either order.
  CHECK(error_of(base + "lora.r: 8\nlora: {r: 4}\n") ==
        "configs/x.yaml:4: duplicate key \"lora.r\" (set earlier in the same file)");
  CHECK(error_of(base + "lora:\n  r: 4\nlora.r: 8\n") ==
        "configs/x.yaml:5: duplicate key \"lora.r\" (set earlier in the same file)");
  CHECK(error_of(kMinimal, {"lora={r: 4, r: 8}"}) ==
        "configs/x.yaml (--set lora={r: 4, r: 8}): duplicate key \"lora.r\" (set earlier in the same --set)");
  CHECK(parse_train_config(base + "lora.r: 8\nlora: {lora_alpha: 4}\n", "configs/x.yaml").lora.r == 8);
  CHECK(error_of(base + "lr: [1\n").find("configs/x.yaml:") == 0);
  CHECK(error_of(base + "lr: [1\n").find("invalid YAML") != std::string::npos);
  CHECK(error_of("- a\n- b\n") == "configs/x.yaml: the config: expected a map of keys, got a list");
  // A second document would be dropped unread; a leading "---" and a closing "..." are one document.
  CHECK(error_of(base + "---\nlr: 2\nbogus: 1\n") == "configs/x.yaml:3: a second YAML document (after \"---\"): a "
                                                   "config is one document; put every key in the first");
  CHECK(error_of("---\n" + base + "...\n").empty());
  // Malformed text on which yaml-cpp's LoadAll runs without end (found by fuzz_train_config): one error.
  CHECK(error_of(std::string("#ner\n,\xd0\x57\x20", 9)).find("configs/x.yaml") == 0);
  CHECK(error_of(kMinimal, {"lr"}) == "configs/x.yaml (--set lr): --set expects key=value");
  CHECK(error_of(kMinimal, {"lr=[1"}).find("configs/x.yaml (--set lr=[1)") == 0);
}

TEST_CASE("the key list matches the fields configs/README.md documents") {
  std::ifstream readme(std::string(FT_SOURCE_DIR) + "/configs/README.md");
  REQUIRE(readme.good());
  std::string text((std::istreambuf_iterator<char>(readme)), std::istreambuf_iterator<char>());
  std::vector<std::string> keys = train_config_keys();
  CHECK(keys.size() == 120);
  for (const std::string& key : keys) {
    CAPTURE(key);
    CHECK(text.find("`" + key + "`") != std::string::npos);
  }
}

TEST_CASE("neftune_noise_alpha: off by default, a number >= 0, for objective: sft without padding_free") {
  const std::string base = kMinimal;
  CHECK(parse(base).neftune_noise_alpha == 0.0);
  CHECK(parse(base + "neftune_noise_alpha: 5\n").neftune_noise_alpha == 5.0);
  CHECK(parse(base + "neftune_noise_alpha: 5\n", {"data.packing=concatenate"}).neftune_noise_alpha == 5.0);
  CHECK(error_of(base + "neftune_noise_alpha: -1\n") ==
        "configs/x.yaml:3: neftune_noise_alpha: expected a number in [0, 1e6] (0 = off), got \"-1\"");
  CHECK(error_of(base + "objective: dpo\nneftune_noise_alpha: 5\n") ==
        "configs/x.yaml: neftune_noise_alpha applies to objective: sft, and this run's objective is dpo");
  CHECK(error_of(base + "objective: dpo\nneftune_noise_alpha: 0\n").empty());
  CHECK(error_of(kMinimal, {"neftune_noise_alpha=5", "data.packing=true"}) ==
        "configs/x.yaml: neftune_noise_alpha with data.packing: padding_free is not supported (trl flattens such a "
        "micro-batch into one row, whose length is NEFTune's L); use data.packing: false or concatenate");
}

TEST_CASE("lora.init_lora_weights: PEFT's true, false and gaussian; its weight- and data-driven ones refused") {
  const std::string base = kMinimal;
  CHECK(parse(base).lora.init_lora_weights == LoraInit::kaiming_uniform);
  CHECK(parse(base + "lora: {init_lora_weights: true}\n").lora.init_lora_weights == LoraInit::kaiming_uniform);
  CHECK(parse(base + "lora: {init_lora_weights: false}\n").lora.init_lora_weights == LoraInit::random);
  CHECK(parse(base + "lora: {init_lora_weights: gaussian}\n").lora.init_lora_weights == LoraInit::gaussian);
  CHECK(parse(base + "lora: {init_lora_weights: Gaussian}\n").lora.init_lora_weights == LoraInit::gaussian);
  const std::string refused = "expected true, false or gaussian (PEFT's initialisations from the weights or the "
                              "data, such as pissa, olora, loftq, corda or eva, are not supported), got ";
  CHECK(error_of(base + "lora: {init_lora_weights: pissa_niter_4}\n") ==
        "configs/x.yaml:3: lora.init_lora_weights: " + refused + "\"pissa_niter_4\"");
  CHECK(error_of(base + "lora: {init_lora_weights: [true]}\n").find("lora.init_lora_weights: " + refused) !=
        std::string::npos);
}

TEST_CASE("lora.use_dora: off by default; not with tensor parallel or a streamed base") {
  const std::string base = kMinimal;
  CHECK(!parse(base).lora.use_dora);
  CHECK(parse(base + "lora: {use_dora: true}\n").lora.use_dora);
  CHECK(parse(base + "lora: {use_dora: true, lora_dropout: 0.05}\n").lora.lora_dropout == 0.05);
  CHECK(error_of(base + "lora: {use_dora: true}\nparallel: {tensor: 2}\n") ==
        "configs/x.yaml: lora.use_dora: true with parallel.tensor above 1 is not supported (a row-parallel "
        "weight's row norms span the ranks)");
  CHECK(error_of(base + "lora: {use_dora: true}\nquantization: {mode: nf4}\noffload: {base: host}\n") ==
        "configs/x.yaml: lora.use_dora: true with offload.base: host is not supported (the magnitude starts as the "
        "base weights' row norms)");
  CHECK(error_of(base + "lora: {use_dora: true}\ntrainable: all\nquantization: {mode: none}\n") ==
        "configs/x.yaml: lora.use_dora applies to trainable: lora");
}

TEST_CASE("data.format chat and alpaca; data.chat_template names a template or auto") {
  TrainConfig c = parse(kMinimal, {"data.format=chat", "data.chat_template=llama3"});
  CHECK(c.data.format == DataFormat::chat);
  CHECK(c.data.chat_template == ChatTemplateKind::llama3);
  CHECK(parse(kMinimal).data.chat_template == ChatTemplateKind::automatic);
  CHECK(parse(kMinimal, {"data.format=alpaca"}).data.format == DataFormat::alpaca);
}

TEST_CASE("offload.base: host is read and checked against the other fields") {
  const std::string minimal = kMinimal;
  const TrainConfig c =
      parse(minimal + "quantization: {mode: nf4}\noffload: {base: host, resident_layers: 28, stream_slots: 3}\n");
  CHECK(c.offload_base == OffloadTarget::host);
  CHECK(c.resident_layers == 28);
  CHECK(c.stream_slots == 3);
  CHECK(error_of(minimal + "quantization: {mode: none}\noffload: {base: host}\n") ==
        "configs/x.yaml: offload.base: host streams the frozen quantized base from host memory: it needs "
        "quantization.mode: int8 or nf4");
  CHECK(error_of(minimal + "offload: {resident_layers: 4}\n") ==
        "configs/x.yaml: offload.resident_layers and offload.stream_slots apply to offload.base: host only");
  CHECK(error_of(minimal + "offload: {base: host, stream_slots: 0}\n").find("offload.stream_slots") !=
        std::string::npos);
  CHECK(error_of(minimal + "offload: {base: host, resident_layers: -1}\n").find("offload.resident_layers") !=
        std::string::npos);
}

TEST_CASE("offload.activations: host is read and needs per-layer checkpointing, one stage and a GPU") {
  const std::string minimal = kMinimal;
  const TrainConfig c = parse(minimal + "activation_checkpointing: per_layer\noffload: {activations: host}\n");
  CHECK(c.offload_activations == OffloadTarget::host);
  CHECK(error_of(minimal + "offload: {activations: host}\n") ==
        "configs/x.yaml: offload.activations: host keeps the per-layer checkpoints in host memory: it needs "
        "activation_checkpointing: per_layer");
  CHECK(error_of(minimal + "activation_checkpointing: per_layer\noffload: {activations: host}\nparallel: "
                           "{pipeline: 2}\n")
            .find("offload.activations: host runs in one pipeline stage") != std::string::npos);
  CHECK(error_of(minimal + "activation_checkpointing: per_layer\noffload: {activations: host}\ndevice: cpu\n") ==
        "configs/x.yaml: offload.activations: host moves the checkpoints from a GPU to host memory; with device: "
        "cpu they are in host memory already");
  CHECK(error_of(minimal + "offload: {activations: disk}\n").find("offload.activations: expected one of device, host") !=
        std::string::npos);
}

TEST_CASE("objective: grpo: trl's GRPOConfig defaults, every grpo and rewards key, and the rules across fields") {
  const std::string grpo = std::string(kMinimal) + "objective: grpo\nrewards: {length: 16}\n";
  const TrainConfig defaults = parse(grpo + "micro_batch_size: 8\nseq_len: 1024\n");
  CHECK(defaults.objective == Objective::grpo);
  // trl 1.16.0's GRPOConfig defaults.
  CHECK(defaults.grpo.num_generations == 8);
  CHECK(defaults.grpo.max_completion_length == 512);
  CHECK(defaults.grpo.beta == 0.0);
  CHECK(defaults.grpo.epsilon == 0.2);
  CHECK(!defaults.grpo.epsilon_high);
  CHECK(defaults.grpo.loss_type == GrpoLossType::dapo);
  CHECK(defaults.grpo.scale_rewards == GrpoScaleRewards::group);
  CHECK(defaults.grpo_top_p == 1.0);
  CHECK(defaults.grpo_top_k == 0);
  CHECK(defaults.rewards.names() == std::vector<std::string>{"length"});

  // micro_batch_size 4 x grad_accum_steps 1 = 4 completions: groups of 2 or 4.
  const std::string bare = std::string(kMinimal) + "objective: grpo\nseq_len: 96\n";
  const std::string small = bare + "rewards: {length: 16}\n";
  const TrainConfig c = parse(bare + "grpo: {num_generations: 4, max_completion_length: 32, beta: 0.04, "
                                      "epsilon: 0.1, epsilon_high: 0.28, loss_type: dr_grpo, scale_rewards: none, "
                                      "top_p: 0.9, top_k: 20}\n"
                                      "rewards: {regex: '^a', regex_weight: 0.5, rouge: completion, rouge_weight: 2, "
                                      "answer: answer, answer_weight: 3, length: 8, length_weight: 0.25, "
                                      "model: rm, model_adapter: rm_adapter, model_tokenizer: rm/tokenizer.json, "
                                      "model_weight: 4}\n");
  CHECK(c.grpo.num_generations == 4);
  CHECK(c.grpo.max_completion_length == 32);
  CHECK(c.grpo.beta == 0.04);
  CHECK(c.grpo.epsilon == 0.1);
  CHECK(c.grpo.epsilon_high == 0.28);
  CHECK(c.grpo.loss_type == GrpoLossType::dr_grpo);
  CHECK(c.grpo.scale_rewards == GrpoScaleRewards::none);
  CHECK(c.grpo_top_p == 0.9);
  CHECK(c.grpo_top_k == 20);
  CHECK(c.rewards.names() == std::vector<std::string>{"regex", "rouge", "answer", "length", "model"});
  CHECK(c.rewards.regex == "^a");
  CHECK(c.rewards.rouge == "completion");
  CHECK(c.rewards.answer == "answer");
  CHECK(c.rewards.length == 8);
  CHECK(c.rewards.model == "configs/rm");  // paths resolve against the config's folder
  CHECK(c.rewards.model_adapter == "configs/rm_adapter");
  CHECK(c.rewards.model_tokenizer == "configs/rm/tokenizer.json");
  CHECK(c.rewards.regex_weight == 0.5);
  CHECK(c.rewards.rouge_weight == 2.0);
  CHECK(c.rewards.answer_weight == 3.0);
  CHECK(c.rewards.length_weight == 0.25);
  CHECK(c.rewards.model_weight == 4.0);

  const std::vector<std::string> fits = {"grpo.num_generations=4", "grpo.max_completion_length=32"};
  auto with = [&](const std::string& extra) {
    std::vector<std::string> overrides = fits;
    overrides.push_back(extra);
    return overrides;
  };
  CHECK(error_of(small, with("grpo.num_generations=1")) ==
        "configs/x.yaml (--set grpo.num_generations=1): grpo.num_generations: expected an integer in [2, 65536], "
        "got \"1\"");
  CHECK(error_of(small, with("grpo.num_generations=3")) ==
        "configs/x.yaml: objective: grpo generates micro_batch_size x grad_accum_steps = 4 completions a step, "
        "which must be a multiple of grpo.num_generations (3): whole groups of one prompt");
  CHECK(error_of(small, with("grpo.max_completion_length=96")) ==
        "configs/x.yaml: grpo.max_completion_length (96) must leave room for the prompt within seq_len (96)");
  CHECK(error_of(bare, fits) ==
        "configs/x.yaml: objective: grpo needs a reward: set rewards.regex, rewards.rouge, rewards.answer, "
        "rewards.length or rewards.model");
  CHECK(error_of(small, with("data.packing=true")) ==
        "configs/x.yaml: objective: grpo generates its rows; data.packing applies to objective: sft and dpo");
  CHECK(error_of(small, with("task_metric=rouge")).find("task_metric: rouge applies to objective: sft; "
                                                        "objective: grpo reports the held-out reward") !=
        std::string::npos);
  CHECK(error_of(small + "trainable: all\nquantization: {mode: none}\n", with("grpo.beta=0.1")) ==
        "configs/x.yaml: objective: grpo with grpo.beta > 0 needs trainable: lora: its reference model is the "
        "base with the adapters disabled");
  CHECK(error_of(small, with("grpo.loss_type=sapo")).find("grpo.loss_type: expected one of grpo, bnpo, dr_grpo, "
                                                          "dapo, cispo, got \"sapo\"") != std::string::npos);
  CHECK(error_of(small, with("grpo.epsilon=1")).find("grpo.epsilon: expected a number in [0, 1)") !=
        std::string::npos);
  CHECK(error_of(small, with("grpo.top_p=0")).find("grpo.top_p: expected a number in (0, 1]") != std::string::npos);
  CHECK(error_of(small, with("rewards.length=-1")).find("rewards.length: expected an integer in [0, ") !=
        std::string::npos);
  CHECK(error_of(small, with("rewards.regex_weight=.nan")).find("rewards.regex_weight: expected a finite number") !=
        std::string::npos);
  CHECK(error_of(small, with("rewards.lenght=3")).find("did you mean \"rewards.length\"?") != std::string::npos);
}
