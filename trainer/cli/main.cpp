// finetune CONFIG.yaml [--set key=value]... [--resume [--allow-data-change]]
// finetune plan CONFIG.yaml|MODEL/config.json [--gpu-mem SIZE] [--device cuda|cpu] [--context-reserve SIZE] [--ranks N] [--h2d-bandwidth SIZE] [--tflops N] [--set key=value]...
// finetune generate MODEL ... (trainer/cli/generate_command.h)
// finetune merge MODEL --adapter DIR --out DIR ... (trainer/cli/merge.h)
// finetune course [CONFIGS_DIR] (trainer/cli/course.h)
// Every user-caused problem is an ft::Error: printed, exit status 1. SIGINT or
// SIGTERM during training saves a checkpoint at the next step boundary and
// exits with 128 + the signal (130, 143); --resume continues from it.
// `mpirun -np N finetune CONFIG.yaml` trains data parallel on N ranks
// (trainer/parallel/data_parallel.h); an error on any rank is printed with the rank
// named and ends the whole job (MPI_Abort).
#include <charconv>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "kernels/error.h"
#include "trainer/cli/compare.h"
#include "trainer/cli/course.h"
#include "trainer/cli/generate_command.h"
#include "trainer/cli/merge.h"
#include "trainer/device_backend.h"
#include "trainer/parallel/collectives.h"
#include "trainer/plan.h"
#include "trainer/train_config.h"
#include "trainer/trainer.h"

namespace {

const char* kUsage =
    "usage: finetune CONFIG.yaml [--set key=value]... [--resume [--allow-data-change]]\n"
    "  --set key=value  override a config field (dotted keys: lora.r=16); repeatable\n"
    "  --resume         continue from output_dir/train_state.safetensors; refused when the base model,\n"
    "                   adapter config, tokenizer or data files differ from the checkpoint's\n"
    "  --allow-data-change  with --resume: accept changed data files\n"
    "  SIGINT/SIGTERM (Ctrl-C) save a checkpoint at the next step and exit; a second one stops at once\n"
    "usage: finetune plan CONFIG.yaml|MODEL/config.json [--gpu-mem 24GiB] [--device cuda|cpu]\n"
    "                     [--context-reserve 0.75GiB] [--ranks N] [--h2d-bandwidth 25GB]\n"
    "                     [--tflops 100] [--set key=value]...\n"
    "  plans one training step's memory on the meta device (no weights read) and\n"
    "  prints where it goes, its peak, and for each mode (bf16 / int8 / nf4 base,\n"
    "  resident or streamed from host memory, optimizer state on the device or the\n"
    "  host) the largest seq_len and micro_batch\n"
    "  that fit in --gpu-mem, and the best mode; a config.json is planned as a bf16\n"
    "  LoRA run with per-layer checkpointing at micro_batch 1 x seq_len 2048;\n"
    "  --ranks N: the job's ranks, parallel.data x parallel.pipeline; adds the per-step\n"
    "  gradient all-reduce of the data-parallel ranks, and with parallel.pipeline P > 1\n"
    "  each stage's layers, replayed peak and the 1F1B bubble\n"
    "  --h2d-bandwidth (bytes per second) and --tflops set a streamed base's time model\n"
    "usage: finetune COMPARISON.yaml [--set key=value]...\n"
    "  a config with a top-level compare: list runs each entry, then prints one table (ROUGE, trainable\n"
    "  parameters, peak memory, wall time) and writes it as CSV with a ROUGE bar chart (configs/course-lab2.yaml)\n"
    "usage: finetune course [CONFIGS_DIR]\n"
    "  prints the course's memory and LoRA figures computed by this trainer, from the model configs\n"
    "  pythia-1b/, gpt-neox-20b/ and flan-t5-base/ under CONFIGS_DIR (default: configs)\n"
    "Fields are documented in configs/README.md.\n";

int64_t parse_ranks(const std::string& text) {
  int64_t ranks = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), ranks);
  FT_CHECK(error == std::errc() && end == text.data() + text.size() && ranks >= 1 && ranks <= (int64_t(1) << 20),
           "--ranks must be an integer in [1, 1048576], got \"", text, "\"");
  return ranks;
}

double parse_tflops(const std::string& text) {
  double tflops = 0.0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), tflops);
  FT_CHECK(error == std::errc() && end == text.data() + text.size() && tflops > 0 && tflops <= 1e6,
           "--tflops must be a number in (0, 1e6], got \"", text, "\"");
  return tflops;
}

// finetune plan ...: the memory planner (trainer/plan.h).
int run_plan(int argc, char** argv) {
  std::string config_path;
  std::vector<std::string> overrides;
  ft::PlanOptions options;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--gpu-mem" && has_value) {
      options.gpu_mem_bytes = ft::parse_byte_size(argv[++i]);
    } else if (arg == "--context-reserve" && has_value) {
      options.context_reserve_bytes = ft::parse_byte_size(argv[++i]);
    } else if (arg == "--device" && has_value) {
      const std::string device = argv[++i];
      FT_CHECK(device == "cuda" || device == "cpu", "--device must be cuda or cpu, got \"", device, "\"");
      options.policy = device == "cuda" ? ft::MemoryPolicy::cuda : ft::MemoryPolicy::cpu;
    } else if (arg == "--ranks" && has_value) {
      options.ranks = parse_ranks(argv[++i]);
    } else if (arg == "--h2d-bandwidth" && has_value) {
      options.h2d_bytes_per_s = double(ft::parse_byte_size(argv[++i]));
      FT_CHECK(options.h2d_bytes_per_s > 0, "--h2d-bandwidth must be > 0 bytes per second, got \"", argv[i], "\"");
    } else if (arg == "--tflops" && has_value) {
      options.flops_per_s = parse_tflops(argv[++i]) * 1e12;
    } else if (arg == "--set" && has_value) {
      overrides.push_back(argv[++i]);
    } else if (arg.rfind("-", 0) == 0 || !config_path.empty()) {
      ft::fail("unexpected argument \"", arg, "\"\n", kUsage);
    } else {
      config_path = arg;
    }
  }
  FT_CHECK(!config_path.empty(), "plan: no config file given\n", kUsage);
  const bool model_config = config_path.ends_with(".json") || std::filesystem::is_directory(config_path);
  ft::print_plan(model_config ? ft::plan_config_for_model(config_path, overrides)
                              : ft::load_train_config(config_path, overrides),
                 options);
  return 0;
}

// finetune course [CONFIGS_DIR]: the course's figures (trainer/cli/course.h).
int run_course(int argc, char** argv) {
  FT_CHECK(argc <= 3, "course: unexpected argument \"", argc > 3 ? argv[3] : "", "\"\n", kUsage);
  const std::string configs_dir = argc == 3 ? argv[2] : "configs";
  ft::print_course(ft::course_figures(configs_dir), configs_dir, std::cout);
  return 0;
}

// world: set for training, so that an error names the rank and ends the job.
int run(int argc, char** argv, std::unique_ptr<ft::Collectives>& world) {
  if (argc > 1 && std::string(argv[1]) == "course") return run_course(argc, argv);
  if (argc > 1 && std::string(argv[1]) == "plan") return run_plan(argc, argv);
  if (argc > 1 && std::string(argv[1]) == "generate") return ft::run_generate(ft::parse_generate_args(argc, argv, 2));
  if (argc > 1 && std::string(argv[1]) == "merge") {
    ft::merge_adapter(ft::parse_merge_args(argc, argv, 2), std::cout);
    return 0;
  }
  std::string config_path;
  std::vector<std::string> overrides;
  ft::RunOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage << ft::kGenerateUsage << ft::kMergeUsage;
      return 0;
    } else if (arg == "--resume") {
      options.resume = true;
    } else if (arg == "--allow-data-change") {
      options.allow_data_change = true;
    } else if (arg == "--set") {
      FT_CHECK(i + 1 < argc, "--set needs key=value");
      overrides.push_back(argv[++i]);
    } else if (arg.rfind("--set=", 0) == 0) {
      overrides.push_back(arg.substr(6));
    } else if (arg.rfind("-", 0) == 0 || !config_path.empty()) {
      ft::fail("unexpected argument \"", arg, "\"\n", kUsage);
    } else {
      config_path = arg;
    }
  }
  FT_CHECK(!config_path.empty(), "no config file given\n", kUsage);
  FT_CHECK(options.resume || !options.allow_data_change, "--allow-data-change applies to --resume only\n", kUsage);
  if (ft::is_comparison_file(config_path)) {  // a top-level compare: list (trainer/cli/compare.h)
    FT_CHECK(!options.resume, config_path, ": --resume continues one run; a comparison starts its runs afresh");
    return ft::run_comparison(ft::load_comparison(config_path, overrides), std::cout);
  }
  // Before MPI_Init where the launcher says: a CUDA-aware MPI may start CUDA there.
  const int launcher_local_rank = ft::launcher_local_rank();
  if (launcher_local_rank >= 0) ft::bind_local_device(launcher_local_rank);
  world = ft::join_world(&argc, &argv);
  if (launcher_local_rank < 0 && world->world_size() > 1) ft::bind_local_device(world->local_rank());
  options.collectives = world.get();
  return ft::run_training(ft::load_train_config(config_path, overrides), options);
}

}  // namespace

// With several ranks the error names its rank and ends every rank: the
// others would otherwise wait for it in the next collective.
int report_error(const std::exception& error, ft::Collectives* world) {
  const std::string rank = world ? ft::rank_label(*world) : "";
  std::cerr << "error" << (rank.empty() ? "" : " (" + rank + ")") << ": " << error.what() << "\n" << std::flush;
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
