#include "trainer/cli/score_command.h"

#include <CLI/CLI.hpp>
#include <iostream>
#include <nlohmann/json.hpp>

#include "kernels/error.h"
#include "trainer/cli/inference_model.h"
#include "trainer/cli/options.h"
#include "trainer/data/data.h"
#include "trainer/rl/reward.h"

namespace ft {

CLI::App* add_score_command(CLI::App& app, ScoreCommand& c) {
  CLI::App* score = app.add_subcommand("score", "A reward model's score for each row of a JSONL file");
  score->footer(
      "MODEL has a score head (a *ForSequenceClassification checkpoint, or `finetune merge` of a reward\n"
      "adapter), or --adapter is an objective: reward run's adapter. Rows are {\"prompt\", \"completion\"} or\n"
      "{\"text\"}; each is written to stdout as a JSON line with \"score\" added.");
  score->add_option("MODEL", c.model, "a Hugging Face checkpoint folder")->required();
  score->add_option("--adapter", c.adapter, "a PEFT adapter folder with a score head (modules_to_save)")
      ->type_name("DIR");
  score->add_option("--tokenizer", c.tokenizer, "tokenizer.model or tokenizer.json (default: MODEL's)")
      ->type_name("FILE");
  score->add_option("--file", c.rows_file, "JSONL of {\"prompt\", \"completion\"} or {\"text\"} rows")
      ->type_name("JSONL")
      ->required();
  score->add_option("--batch-size", c.batch_size, "rows per forward (default 8)")->check(CLI::Range(1, 4096));
  add_choice_option(*score, "--quantization", c.quantization, enum_names(QuantizedBase{}),
                    "the base's format (default: as the adapter was trained, else none)");
  add_choice_option(*score, "--precision", c.precision, enum_names(Precision{}),
                    "default: as the adapter was trained, else fp32");
  add_choice_option(*score, "--device", c.device, enum_names(DeviceChoice{}), "default auto");
  return score;
}

namespace {

struct ScoreRows {
  std::vector<nlohmann::json> rows;
  std::vector<Example> examples;
};

ScoreRows read_score_rows(const std::string& path) {
  const std::string expected = "{\"prompt\", \"completion\"} or {\"text\"} strings";
  ScoreRows out;
  read_jsonl_rows(path, "rows file", expected, [&](const nlohmann::json& row, const std::string& where) {
    const bool pair = row.contains("prompt") && row.contains("completion");
    FT_CHECK(!row.contains("text") || !(row.contains("prompt") || row.contains("completion")), where,
             ": row has \"text\" and \"", row.contains("prompt") ? "prompt" : "completion",
             "\": which to score is unclear: expected ", expected);
    FT_CHECK(pair || row.contains("text"), where, ": row lacks \"prompt\" and \"completion\" or \"text\": expected ",
             expected, ", got ", key_list(row));
    out.examples.push_back(pair ? Example{string_field(row, "prompt", where), string_field(row, "completion", where)}
                                : Example{"", string_field(row, "text", where)});
    out.rows.push_back(row);
  });
  FT_CHECK(!out.rows.empty(), path, ": no rows to score");
  return out;
}

}  // namespace

int run_score(const ScoreCommand& command) {
  const ScoreRows input = read_score_rows(command.rows_file);
  InferenceModel loaded;
  load_inference_model(loaded, {command.model, command.adapter, command.tokenizer, command.quantization,
                                command.precision, command.device, OutputHead::score, "finetune score"});
  CausalLM& model = *loaded.model->as_causal_lm();  // load_inference_model builds no other kind here
  FT_CHECK(model.output_head_loaded(), command.model, ": has no score head (score.weight)",
           command.adapter.empty() ? " and no --adapter was given"
                                   : " and the adapter saves none (modules_to_save: objective: reward saves one)",
           ": not a reward model");
  const int32_t pad_id = padding_id(*loaded.tokenizer);
  const int32_t eos_id = loaded.special.example_eos_id;
  const int64_t max_tokens = model.config().position_limit();
  int64_t truncated = 0;
  for (size_t first = 0; first < input.rows.size(); first += size_t(command.batch_size)) {
    const size_t end = std::min(input.rows.size(), first + size_t(command.batch_size));
    std::vector<TokenSequence> sequences;
    for (size_t i = first; i < end; ++i) {
      bool cut = false;
      sequences.push_back(tokenize_example(input.examples[i], *loaded.tokenizer, max_tokens - 1, eos_id, cut));
      truncated += cut;
    }
    HostAllocator host;
    const std::vector<double> scores = sequence_scores(model, scored_sequences(sequences, pad_id, host));
    for (size_t i = first; i < end; ++i) {
      nlohmann::json row = input.rows[i];
      row["score"] = scores[i - first];
      std::cout << row.dump() << "\n";
    }
  }
  std::cerr << "scored " << input.rows.size() << " rows";
  if (truncated) std::cerr << " (" << truncated << " cut to max_position_embeddings " << max_tokens << ")";
  std::cerr << "\n";
  return 0;
}

}  // namespace ft
