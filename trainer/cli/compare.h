// A comparison of runs, as the course's lab 2 compares the original model,
// full fine-tuning and LoRA: a config file whose top-level `compare:` lists
// runs, each a name and the fields it changes; every other top-level field is
// shared. Each run trains into output_dir/<its name>, or with `train: false`
// only evaluates the model as built (the original). Then one table (ROUGE,
// trainable parameters, peak memory, wall time) is printed and written as
// output_dir/comparison.csv, with a bar chart of ROUGE per run,
// output_dir/rouge.svg. The course's lab 3 chains runs the same way: a
// reward model (objective: reward, no ROUGE: its held-out pair accuracy is
// printed), then PPO against it (objective: ppo), whose held-out prompts'
// reward, "toxicity" (sigmoid(-score) of rewards.model) and KL to the
// reference before and after training, with a few samples, make a second
// table, output_dir/held_out.csv.
//
//   model: tiny-t5
//   ...shared fields...
//   compare:
//     - {name: original model, train: false}
//     - {name: full fine-tuning, trainable: all, lr: 1.0e-3}
//     - {name: LoRA, trainable: lora, lora: {r: 32, lora_alpha: 32}}
#pragma once
#include <ostream>
#include <string>
#include <vector>

#include "trainer/report/svg_plot.h"
#include "trainer/train_config.h"
#include "trainer/trainer.h"

namespace ft {

struct ComparedRun {
  std::string name;
  TrainConfig config;  // output_dir already the run's own folder; evaluate_only for `train: false`
};

struct Comparison {
  std::string output_dir;  // the file's, where the table and chart go
  std::vector<ComparedRun> runs;
};

// True when path's top level holds a `compare:` key.
bool is_comparison_file(const std::string& path);

// Every run's config (the shared fields, the entry's on top, then overrides).
// A bad entry is an Error naming the file, its line and the field.
Comparison load_comparison(const std::string& path, const std::vector<std::string>& overrides = {});

struct ComparedResult {
  std::string name;
  RunSummary summary;
  double wall_s = 0.0;
};

// The table as printed, one row per run.
std::string comparison_table(const std::vector<ComparedResult>& results);
// The same as CSV: a header line, then one line per run.
std::string comparison_csv(const std::vector<ComparedResult>& results);
// ROUGE-1/2/L/Lsum per run as grouped bars.
BarChart rouge_chart(const std::vector<ComparedResult>& results);

// Runs every run in order, then prints the table and writes the CSV and the chart.
int run_comparison(const Comparison& comparison, std::ostream& out);

}  // namespace ft
