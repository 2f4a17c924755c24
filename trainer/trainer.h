// The training run: builds backend, model, data and optimizer from a
// TrainConfig, evaluates before, trains, evaluates after, writes outputs.
#pragma once
#include "trainer/train_config.h"

namespace ft {

struct RunOptions {
  bool resume = false;  // continue from output_dir/train_state.safetensors
};

void run_training(const TrainConfig& config, const RunOptions& options);

}  // namespace ft
