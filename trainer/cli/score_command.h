// `finetune score MODEL [--adapter DIR] --file ROWS.jsonl [options]`: a
// reward model's score for each row, as transformers'
// *ForSequenceClassification gives it (trainer/rl/reward.h). The model is a
// checkpoint with a score head (saved by transformers, or merged from a
// SEQ_CLS adapter), or any checkpoint with an adapter that saved one
// (objective: reward). Rows are {"prompt", "completion"} (tokenized as
// training tokenizes a pair's side: prompt, completion, eos) or {"text"};
// each is written back to stdout as one JSON line with "score" added.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "trainer/train_config.h"

namespace CLI {
class App;
}

namespace ft {

struct ScoreCommand {
  std::string model, adapter;  // folders; adapter "" = the checkpoint's own score head
  std::string tokenizer;       // "" = MODEL's own tokenizer file
  std::string rows_file;
  int64_t batch_size = 8;
  // Unset: as the adapter's finetune_run.json records it was trained, else none and fp32.
  std::optional<QuantizedBase> quantization;
  std::optional<Precision> precision;
  DeviceChoice device = DeviceChoice::automatic;
};

// Adds the `score` subcommand to app: parsing app fills command.
CLI::App* add_score_command(CLI::App& app, ScoreCommand& command);
int run_score(const ScoreCommand& command);

}  // namespace ft
