// The training run: builds backend, model, data and optimizer from a
// TrainConfig, evaluates before, trains, evaluates after, writes outputs.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trainer/parallel/collectives.h"
#include "trainer/parameter_count.h"
#include "trainer/report/rouge.h"
#include "trainer/setup.h"
#include "trainer/train_config.h"

namespace ft {

// objective: grpo, ppo: one evaluation on the held-out prompts
// (trainer/rl/rollouts.h's evaluate_rollouts).
struct HeldOutSummary {
  double reward = 0.0, reward_std = 0.0, kl = 0.0;
  std::vector<double> model_scores;  // each completion's rewards.model score; empty without one
  std::vector<std::string> prompts, completions;
};

// What a finished run reports to its caller (a comparison of runs).
struct RunSummary {
  double eval_loss = 0.0;  // the final evaluation's (0 without data.eval)
  bool has_rouge = false;  // task_metric: rouge
  RougeScores rouge;
  bool has_preference = false;      // objective: dpo, reward: the held-out pairs' accuracy
  double preference_accuracy = 0.0;
  bool has_held_out = false;        // objective: grpo, ppo with data.eval: before and after training
  HeldOutSummary held_out_before, held_out_after;
  ParameterCount parameters;
  size_t peak_memory_bytes = 0;  // everything the run's tracker held at once
};

struct RunOptions {
  bool resume = false;  // continue from output_dir/train_state.safetensors
  // With resume: accept a checkpoint whose data files differ from this run's
  // (never one whose base model, adapter config or tokenizer differ).
  bool allow_data_change = false;
  // Without resume: start afresh in an output_dir that holds an earlier run's
  // checkpoint, replacing its files (otherwise refused: that run's work would
  // be lost without a word).
  bool overwrite = false;
  // The job's ranks (collectives.h); null: a single process. Rank 0 prints,
  // evaluates and writes every file; the others train their share.
  Collectives* collectives = nullptr;
  // Evaluate before training too and print the change (a comparison's
  // original-model run evaluates that once for all).
  bool evaluate_before = true;
  RunSummary* summary = nullptr;  // filled at the end when given
};

// Returns the exit status: 0, or 128 + the signal when SIGINT or SIGTERM
// stopped the run at a step boundary after saving a checkpoint to resume from.
int run_training(const TrainConfig& config, const RunOptions& options);

}  // namespace ft
