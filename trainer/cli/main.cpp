// finetune CONFIG.yaml [--set key=value]... [--resume [--allow-data-change] | --overwrite]
// finetune plan CONFIG.yaml|MODEL/config.json [--gpu-mem SIZE] [--device cuda|cpu] [--context-reserve SIZE] [--ranks N] [--max-seq-len] [--h2d-bandwidth SIZE] [--tflops N] [--set key=value]...
// finetune generate MODEL ... (trainer/cli/generate_command.h)
// finetune merge MODEL --adapter DIR --out DIR ... (trainer/cli/merge.h)
// finetune score MODEL [--adapter DIR] --file ROWS.jsonl ... (trainer/cli/score_command.h)
// finetune export MODEL [--adapter DIR] --gguf OUT.gguf ... (trainer/cli/export.h)
// finetune course [CONFIGS_DIR] (trainer/cli/course.h)
// finetune [SUBCOMMAND] --help prints the usage; finetune --version the
// version and the backends this build has. CLI11 parses every command line.
// Every user-caused problem is an ft::Error: printed, exit status 1. SIGINT or
// SIGTERM during training saves a checkpoint at the next step boundary and
// exits with 128 + the signal (130, 143); --resume continues from it.
// `mpirun -np N finetune CONFIG.yaml` trains data parallel on N ranks
// (trainer/parallel/data_parallel.h); an error on any rank is printed with the rank
// named and ends the whole job (MPI_Abort).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "kernels/error.h"
#include "model/checksum.h"
#include "trainer/cli/compare.h"
#include "trainer/cli/course.h"
#include "trainer/cli/export.h"
#include "trainer/cli/generate_command.h"
#include "trainer/cli/merge.h"
#include "trainer/cli/score_command.h"
#include "trainer/cli/options.h"
#include "trainer/device_backend.h"
#include "trainer/parallel/collectives.h"
#include "trainer/parallel/data_parallel.h"
#include "trainer/plan.h"
#include "trainer/train_config.h"
#include "trainer/trainer.h"

namespace {

// finetune --version: the project's version and the backends compiled in
// (FT_VERSION and FT_BUILT_*: trainer/CMakeLists.txt).
std::string version_text() {
  const std::pair<const char*, bool> backends[] = {{"CUDA", FT_BUILT_CUDA},
                                                   {"cuDNN SDPA", FT_BUILT_CUDNN_SDPA},
                                                   {"CUTLASS int8 GEMM (sm_90)", FT_BUILT_CUTLASS},
                                                   {"oneDNN", FT_BUILT_ONEDNN},
                                                   {"MPI", FT_BUILT_MPI},
                                                   {"NCCL", FT_BUILT_NCCL}};
  std::string text = "finetune " FT_VERSION;
  for (const auto& [name, built] : backends) text += "\n" + std::string(name) + ": " + (built ? "ON" : "OFF");
  return text;
}

void add_overrides(CLI::App& app, std::vector<std::string>& overrides) {
  ft::add_repeated_option(app, "--set", overrides, "override a config field (dotted keys: lora.r=16); repeatable")
      ->type_name("KEY=VALUE");
}

// The top level: a training run, or a comparison of runs.
struct TrainCommand {
  std::string config_path;
  std::vector<std::string> overrides;
  ft::RunOptions options;
};

void add_train_options(CLI::App& app, TrainCommand& c) {
  app.add_option("CONFIG", c.config_path, "the run's YAML config (fields: configs/README.md)");
  add_overrides(app, c.overrides);
  app.add_flag("--resume", c.options.resume,
               "continue from output_dir/train_state.safetensors; refused when the base model,\n"
               "adapter config, tokenizer or data files differ from the checkpoint's");
  app.add_flag("--allow-data-change", c.options.allow_data_change, "with --resume: accept changed data files");
  app.add_flag("--overwrite", c.options.overwrite,
               "start afresh in an output_dir that holds an earlier run's checkpoint, replacing its files");
}

struct PlanCommand {
  std::string config_path;
  std::vector<std::string> overrides;
  ft::PlanOptions options;
  CLI::Option* device = nullptr;  // --device, when given, overrides the config's device
};

// --device's spellings: the memory policy planned.
const ft::EnumName<ft::MemoryPolicy> kPlanDevices[] = {{"cuda", ft::MemoryPolicy::cuda},
                                                        {"cpu", ft::MemoryPolicy::cpu}};

// finetune plan ...: the memory planner (trainer/plan.h).
CLI::App* add_plan_command(CLI::App& app, PlanCommand& c) {
  CLI::App* plan =
      app.add_subcommand("plan", "Plans a training step's memory (no weights read): what fits in --gpu-mem");
  plan->footer(
      "Prints where one training step's memory goes on the meta device, its peak, and for each mode (bf16 / int8 /\n"
      "nf4 base, resident or streamed from host memory, optimizer state on the device or the host) the largest\n"
      "seq_len and micro_batch that fit in --gpu-mem, and the best mode. A config.json is planned as a bf16 LoRA\n"
      "run with per-layer checkpointing (none for a T5, which keeps every activation) at micro_batch 1 x seq_len\n"
      "2048.");
  plan->add_option("CONFIG", c.config_path, "a training config (.yaml) or a model's config.json (or its folder)")
      ->required();
  auto size = [](const std::string& text) { return ft::parse_byte_size(text); };
  ft::add_parsed_option(*plan, "--gpu-mem", c.options.gpu_mem_bytes, size, "the device's memory (default 24GiB)")
      ->type_name("SIZE");
  c.device = ft::add_choice_option(*plan, "--device", c.options.policy,
                                   ft::EnumNames<ft::MemoryPolicy>(kPlanDevices),
                                   "plan for a GPU or the CPU (default: the config's device; a GPU for auto)");
  ft::add_parsed_option(*plan, "--context-reserve", c.options.context_reserve_bytes, size,
                        "the CUDA context and library handles (default 0.75GiB)")
      ->type_name("SIZE");
  ft::add_number_option<int64_t>(*plan, "--ranks", c.options.ranks, 1, int64_t(1) << 20,
                                 "the job's ranks, parallel.data x parallel.pipeline: adds the per-step gradient\n"
                                 "all-reduce, and with parallel.pipeline P > 1 each stage's layers, replayed peak\n"
                                 "and the 1F1B bubble");
  auto bandwidth = [](const std::string& text) {
    const double bytes_per_s = double(ft::parse_byte_size(text));
    FT_CHECK(bytes_per_s > 0, "expected > 0 bytes per second, got \"", text, "\"");
    return bytes_per_s;
  };
  plan->add_flag("--max-seq-len", c.options.exact_seq_len,
                 "per mode, the exact largest seq_len (a multiple of 256) that fits at micro_batch 1, and where\n"
                 "the next one's peak goes (weights and state, checkpoints, the live layer and logits)");
  ft::add_parsed_option(*plan, "--h2d-bandwidth", c.options.h2d_bytes_per_s, bandwidth,
                        "host-to-device bytes per second, a streamed base's time model (default 25GB)")
      ->type_name("SIZE");
  auto flops = [](const std::string& text) {
    const double tflops = ft::number_in(text, 0.0, 1e6);
    FT_CHECK(tflops > 0, "expected a number in (0, 1e6], got \"", text, "\"");
    return tflops * 1e12;
  };
  ft::add_parsed_option(*plan, "--tflops", c.options.flops_per_s, flops,
                        "the GEMM rate of a streamed base's time model (default 100)")
      ->type_name("NUMBER");
  add_overrides(*plan, c.overrides);
  return plan;
}

void plan_one(const PlanCommand& c, const ft::TrainConfig& config) {
  ft::PlanOptions options = c.options;
  if (!c.device->count())  // a run with device: cpu trains on the CPU: plan that
    options.policy = config.device == ft::DeviceChoice::cpu ? ft::MemoryPolicy::cpu : ft::MemoryPolicy::cuda;
  ft::print_plan(config, options);
}

// A comparison file (compare:) plans each of its runs in turn.
int run_plan(const PlanCommand& c) {
  const bool model_config = c.config_path.ends_with(".json") || std::filesystem::is_directory(c.config_path);
  if (model_config) {
    plan_one(c, ft::plan_config_for_model(c.config_path, c.overrides));
  } else if (ft::is_comparison_file(c.config_path)) {
    std::vector<std::string> earlier_adapters;  // what the runs above write
    for (ft::ComparedRun run : ft::load_comparison(c.config_path, c.overrides).runs) {
      std::cout << "== compare run \"" << run.name << "\"\n" << std::flush;
      std::string& reward_adapter = run.config.rewards.model_adapter;
      const auto written = std::find(earlier_adapters.begin(), earlier_adapters.end(), reward_adapter);
      if (!reward_adapter.empty() && written != earlier_adapters.end() &&
          !std::filesystem::exists(std::filesystem::path(reward_adapter) / "adapter_config.json")) {
        // The earlier run writes it: its size is not known until then (LoRA weights: a few MiB).
        std::cout << "note: rewards.model_adapter " << reward_adapter
                  << " is written by a run above: the reward model is planned without its LoRA\n";
        reward_adapter.clear();
      }
      earlier_adapters.push_back((std::filesystem::path(run.config.output_dir) / "adapter").lexically_normal().string());
      plan_one(c, run.config);
    }
  } else {
    plan_one(c, ft::load_train_config(c.config_path, c.overrides));
  }
  return 0;
}

// The model configs the trainer ships, wherever it runs from: under an
// install prefix beside the binary (PREFIX/bin/finetune ->
// PREFIX/share/finetune/configs), else in the source tree it was built from.
std::string shipped_configs_dir() {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::path binary = fs::read_symlink("/proc/self/exe", error);
  const fs::path installed = binary.parent_path() / ".." / "share" / "finetune" / "configs";
  if (!error && fs::exists(installed / "pythia-1b" / "config.json", error)) return fs::weakly_canonical(installed).string();
  return FT_SOURCE_CONFIGS_DIR;
}

// finetune course [CONFIGS_DIR]: the course's figures (trainer/cli/course.h).
CLI::App* add_course_command(CLI::App& app, std::string& configs_dir) {
  CLI::App* course = app.add_subcommand("course", "The course's memory and LoRA figures, computed by this trainer");
  course->add_option("CONFIGS_DIR", configs_dir,
                     "the folder of the model configs pythia-1b/, gpt-neox-20b/ and flan-t5-base/ (default: the\n"
                     "configs this build ships, " + shipped_configs_dir() + ")");
  return course;
}

// What every rank of a job must agree on: the config file by its contents,
// not its path (each node may hold its own copy), the overrides and the flags.
std::string command_text(const TrainCommand& c) {
  std::string text = "a config file of " + ft::file_fingerprint(c.config_path);
  for (const std::string& set : c.overrides) text += " --set " + set;
  if (c.options.resume) text += " --resume";
  if (c.options.allow_data_change) text += " --allow-data-change";
  if (c.options.overwrite) text += " --overwrite";
  return text;
}

// world: set for training, so that an error names the rank and ends the job.
int run_training(TrainCommand& c, int argc, char** argv, std::unique_ptr<ft::Collectives>& world) {
  FT_CHECK(!c.config_path.empty(), "no config file given (finetune --help shows the usage)");
  FT_CHECK(c.options.resume || !c.options.allow_data_change, "--allow-data-change applies to --resume only");
  FT_CHECK(!c.options.resume || !c.options.overwrite, "--resume continues a run; --overwrite starts one afresh: give one");
  if (ft::is_comparison_file(c.config_path)) {  // a top-level compare: list (trainer/cli/compare.h)
    FT_CHECK(!c.options.resume, c.config_path, ": --resume continues one run; a comparison starts its runs afresh");
    return ft::run_comparison(ft::load_comparison(c.config_path, c.overrides), std::cout);
  }
  // Before MPI_Init where the launcher says: a CUDA-aware MPI may start CUDA there.
  const int launcher_local_rank = ft::launcher_local_rank();
  if (launcher_local_rank >= 0) ft::bind_local_device(launcher_local_rank);
  world = ft::join_world(&argc, &argv);
  if (launcher_local_rank < 0 && world->world_size() > 1) ft::bind_local_device(world->local_rank());
  c.options.collectives = world.get();
  const ft::TrainConfig config = ft::load_train_config(c.config_path, c.overrides);
  world->set_timeout_s(config.parallel.timeout_s);
  ft::check_same_command(*world, command_text(c));
  return ft::run_training(config, c.options);
}

// Parses argv into app; returns the exit status for --help and --version
// (printed to stdout), nothing when there is work to do. A bad command line is
// an Error of one line naming the subcommand and the option.
std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  auto command_prefix = [&app] {
    const std::vector<CLI::App*> subcommands = app.get_subcommands();
    return subcommands.empty() ? std::string() : subcommands[0]->get_name() + ": ";
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::RequiredError& error) {
    // CLI11 checks what is missing before what was not expected; an unknown
    // option (`finetune plan --bogus`) is the mistake to name.
    const std::vector<CLI::App*> subcommands = app.get_subcommands();
    const std::vector<std::string> extras = subcommands.empty() ? app.remaining() : subcommands[0]->remaining();
    if (!extras.empty()) ft::fail(command_prefix(), "The following argument was not expected: ", extras[0]);
    ft::fail(command_prefix(), error.what());
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == 0) return app.exit(error);
    ft::fail(command_prefix(), error.what());
  }
  // The top level's CONFIG and options are a training run's: "finetune a.yaml plan b" is a mistake.
  const std::vector<CLI::Option*> given = app.get_options([](CLI::Option* option) { return option->count() > 0; });
  FT_CHECK(app.get_subcommands().empty() || given.empty(), given[0]->get_name(), " belongs to a training run, not to ",
           app.get_subcommands()[0]->get_name(), " (finetune ", app.get_subcommands()[0]->get_name(),
           " --help lists its options)");
  return std::nullopt;
}

int run(int argc, char** argv, std::unique_ptr<ft::Collectives>& world) {
  CLI::App app("Fine-tunes a language model (LoRA over an INT8 or NF4 base, or full) from one YAML config",
               "finetune");
  app.set_version_flag("--version", version_text(), "print the version and the backends this build has");
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // the last of a repeated option
  TrainCommand train;
  add_train_options(app, train);
  PlanCommand plan;
  CLI::App* plan_command = add_plan_command(app, plan);
  ft::GenerateCommand generate;
  CLI::App* generate_command = ft::add_generate_command(app, generate);
  ft::MergeCommand merge;
  CLI::App* merge_command = ft::add_merge_command(app, merge);
  ft::ScoreCommand score;
  CLI::App* score_command = ft::add_score_command(app, score);
  ft::GgufExportCommand gguf_export;
  CLI::App* export_command = ft::add_export_command(app, gguf_export);
  std::string configs_dir = shipped_configs_dir();
  CLI::App* course_command = add_course_command(app, configs_dir);
  // After the subcommands: each would inherit it.
  app.footer(
      "A CONFIG with a top-level compare: list runs each entry, then prints one table (ROUGE, trainable\n"
      "parameters, peak memory, wall time) and writes it as CSV with a ROUGE bar chart (configs/course-lab2.yaml);\n"
      "reward-model and PPO entries print their held-out figures before and after instead (configs/course-lab3.yaml).\n"
      "SIGINT/SIGTERM (Ctrl-C) save a checkpoint at the next step and exit; a second one stops at once.\n"
      "finetune SUBCOMMAND --help lists a subcommand's options.");
  if (const std::optional<int> status = parse(app, argc, argv)) return *status;

  if (*plan_command) return run_plan(plan);
  if (*generate_command) return ft::run_generate(generate);
  if (*score_command) return ft::run_score(score);
  if (*merge_command) {
    ft::merge_adapter(merge, std::cout);
    return 0;
  }
  if (*export_command) {
    ft::export_gguf(gguf_export, std::cout);
    return 0;
  }
  if (*course_command) {
    ft::print_course(ft::course_figures(configs_dir), configs_dir, std::cout);
    return 0;
  }
  return run_training(train, argc, argv, world);
}

}  // namespace

// With several ranks the error names its rank and ends every rank: the
// others would otherwise wait for it in the next collective.
int report_error(const std::exception& error, ft::Collectives* world) {
  const std::string rank = world ? ft::rank_label(*world) : "";
  // One write: ranks that fail at once must not cut into each other's lines.
  std::cerr << "error" + (rank.empty() ? "" : " (" + rank + ")") + ": " + error.what() + "\n" << std::flush;
  if (!rank.empty()) world->abort(1);
  return 1;
}

int main(int argc, char** argv) {
  std::unique_ptr<ft::Collectives> world;
  try {
    return run(argc, argv, world);
  } catch (const std::exception& error) {  // ft::Error included
    return report_error(error, world.get());
  }
}
