// `finetune generate MODEL [--adapter DIR] (--prompt TEXT | --file JSONL | --interactive) [--chat] [options]`:
// text from a Hugging Face checkpoint, with a PEFT adapter when given, on the
// INT8 or NF4 base it was trained over (--quantization) or the full-precision
// weights. --prompt and --interactive stream each completion to stdout as it
// is generated; --file writes one JSON line {"prompt", "completion"} per row,
// generated in batches. With --chat each prompt is a user message rendered
// with the checkpoint's chat template (the renderer training uses, with the
// assistant's turn to come), --file also takes {"messages": [...]} rows
// ending with a user message, and --interactive keeps one conversation.
// Status lines go to stderr, so stdout is the text alone.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trainer/data/chat_template.h"
#include "trainer/generate.h"
#include "trainer/train_config.h"

namespace CLI {
class App;
}

namespace ft {

struct GenerateCommand {
  std::string model, adapter;  // folders; adapter "" = the base alone
  std::string tokenizer;       // "" = MODEL's own tokenizer file
  std::optional<std::string> prompt;  // given even when empty: a BOS-only prompt generates unconditionally
  std::string prompts_file;
  bool interactive = false;
  SamplingOptions sampling = {.max_new_tokens = 128};
  std::vector<std::string> stop;  // texts or special tokens, besides the checkpoint's EOS
  int64_t batch_size = 8;         // --file rows per batch
  bool ignore_eos = false;        // no stop ids: every row runs to max_new_tokens (or a stop text)
  // Unset: as the adapter's finetune_run.json records it was trained, else none and fp32.
  std::optional<QuantizedBase> quantization;
  std::optional<Precision> precision;
  DeviceChoice device = DeviceChoice::automatic;
  bool chat = false;       // prompts are user messages, rendered with the chat template
  std::string system;      // --chat: the system message every conversation starts with ("" = none)
  ChatTemplateKind chat_template = ChatTemplateKind::automatic;  // auto: the checkpoint's
  std::string tools_file;  // --chat: a JSON list of tool schemas the template is given ("" = none)
};

// Adds the `generate` subcommand to app: parsing app fills command.
CLI::App* add_generate_command(CLI::App& app, GenerateCommand& command);
// Checks that exactly one of --prompt, --file and --interactive is given, then runs.
int run_generate(const GenerateCommand& command);

}  // namespace ft
