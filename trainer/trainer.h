// The training run: builds backend, model, data and optimizer from a
// TrainConfig, evaluates before, trains, evaluates after, writes outputs.
#pragma once
#include <memory>

#include "model/causal_lm.h"
#include "trainer/optimizer.h"
#include "trainer/train_config.h"

namespace ft {

// How a run builds its model and optimizer from the config; the memory
// planner (plan.h) calls the same functions so it plans what a run holds.
ModelOptions model_options(const TrainConfig& config);
// Gives gradient buffers to what the config trains: the adapters, or everything.
void set_trainable(CausalLM& model, const TrainConfig& config);
// AdamW over the model's trainable parameters with the config's options.
std::unique_ptr<AdamW> make_optimizer(Backend& backend, CausalLM& model, const TrainConfig& config);

struct RunOptions {
  bool resume = false;  // continue from output_dir/train_state.safetensors
};

void run_training(const TrainConfig& config, const RunOptions& options);

}  // namespace ft
