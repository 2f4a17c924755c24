// finetune CONFIG.yaml [--set key=value]... [--resume]
// Every user-caused problem is an ft::Error: printed, exit status 1.
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "kernels/error.h"
#include "trainer/train_config.h"
#include "trainer/trainer.h"

namespace {

const char* kUsage =
    "usage: finetune CONFIG.yaml [--set key=value]... [--resume]\n"
    "  --set key=value  override a config field (dotted keys: lora.r=16); repeatable\n"
    "  --resume         continue from output_dir/train_state.safetensors\n"
    "Fields are documented in configs/README.md.\n";

int run(int argc, char** argv) {
  std::string config_path;
  std::vector<std::string> overrides;
  ft::RunOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    } else if (arg == "--resume") {
      options.resume = true;
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
  ft::run_training(ft::load_train_config(config_path, overrides), options);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const ft::Error& error) {
    std::cerr << "error: " << error.what() << "\n";
    return 1;
  } catch (const std::exception& error) {
    std::cerr << "error: " << error.what() << "\n";
    return 1;
  }
}
