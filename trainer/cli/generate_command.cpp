#include "trainer/cli/generate_command.h"

#include <CLI/CLI.hpp>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "kernels/error.h"
#include "model/families.h"
#include "model/peft_adapter.h"
#include "model/safetensors.h"
#include "tokenizer/load_tokenizer.h"
#include "trainer/cli/options.h"
#include "trainer/data/data.h"
#include "trainer/data/special_tokens.h"
#include "trainer/device_backend.h"
#include "trainer/evaluate.h"
#include "trainer/trainer.h"

namespace ft {

namespace {

// Prints a row's completion as its tokens arrive: the decoded text grows, and
// only what is new is written. Text that could still become the start of a
// stop string is held back until it cannot (or the row ends).
class StreamPrinter {
 public:
  StreamPrinter(const Tokenizer& tokenizer, const std::vector<std::string>& stop_strings)
      : tokenizer_(tokenizer), stop_strings_(stop_strings) {
    for (const std::string& stop : stop_strings) held_bytes_ = std::max(held_bytes_, stop.size());
  }
  void on_token(int32_t token) {
    tokens_.push_back(token);
    const std::string text = visible_text();
    write(text, text.size() - std::min(text.size(), held_bytes_ ? held_bytes_ - 1 : 0));
  }
  // The rest of the text, also after a rewrite of what was already printed.
  void finish() {
    const std::string text = visible_text();
    if (text.size() > printed_.size()) std::cout << text.substr(printed_.size());
    std::cout << "\n" << std::flush;
  }

 private:
  std::string visible_text() const {
    std::string text = tokenizer_.decode(tokens_);
    return text.substr(0, find_stop_string(text, stop_strings_));
  }
  // Writes text[printed, end) while the printed prefix still matches (a
  // decoder may rewrite the last characters when a token completes them:
  // then it waits for finish).
  void write(const std::string& text, size_t end) {
    end = std::min(end, text.size());
    if (end <= printed_.size() || text.compare(0, printed_.size(), printed_) != 0) return;
    std::cout << text.substr(printed_.size(), end - printed_.size()) << std::flush;
    printed_ = text.substr(0, end);
  }
  const Tokenizer& tokenizer_;
  const std::vector<std::string>& stop_strings_;
  size_t held_bytes_ = 0;
  std::vector<int32_t> tokens_;
  std::string printed_;
};

struct Session {
  HostAllocator host;
  DeviceBackend device;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<CausalLM> model;
  StopCondition stop;
  SpecialTokens special;
};

void load_session(Session& session, const GenerateCommand& command) {
  TrainConfig config;
  config.source = "finetune generate";
  config.model = command.model;
  config.tokenizer = command.tokenizer.empty() ? default_tokenizer_path(command.model) : command.tokenizer;
  config.quantization.mode = command.quantization;
  config.precision = command.precision;
  for (const std::string& stop : command.stop) config.generate.stop.push_back(TokenRef{-1, stop});
  const std::string config_json = (std::filesystem::path(command.model) / "config.json").string();
  FT_CHECK(std::filesystem::is_directory(command.model), command.model,
           ": MODEL must be a Hugging Face checkpoint folder (config.json, safetensors, tokenizer)");
  const ModelConfig model_config = read_model_config(config_json);
  session.tokenizer = load_tokenizer(config.tokenizer, model_config.vocab_size);
  session.special = resolve_special_tokens(config, *session.tokenizer, model_config.vocab_size);
  ModelOptions options = model_options(config);
  options.lora.reset();
  if (!command.adapter.empty()) options.lora = read_peft_adapter_config(command.adapter).lora;
  session.device = make_device_backend(command.device, config.source, session.host, std::cerr);
  session.model = make_causal_lm(model_config, *session.device.backend, options);
  session.model->load(Checkpoint(command.model));
  if (!command.adapter.empty()) load_peft_adapter(command.adapter, *session.model);
  session.stop = StopCondition{session.special.stop_ids, session.special.stop_strings, session.tokenizer.get()};
  if (command.ignore_eos) session.stop.ids.clear();
  std::cerr << "special tokens: " << describe(session.special) << "\n";
}

// One prompt, streamed to stdout; returns the number of new tokens.
int64_t stream_completion(Session& session, const std::string& prompt, const SamplingOptions& sampling) {
  StreamPrinter printer(*session.tokenizer, session.stop.strings);
  const auto generated = generate(*session.model, {prompt_tokens(*session.tokenizer, prompt)}, sampling, session.stop,
                                  [&](size_t, int32_t token) { printer.on_token(token); });
  printer.finish();
  return int64_t(generated[0].size());
}

}  // namespace

CLI::App* add_generate_command(CLI::App& app, GenerateCommand& c) {
  CLI::App* generate =
      app.add_subcommand("generate", "Text from a Hugging Face checkpoint, with a PEFT LoRA adapter when given");
  generate->footer(
      "Give exactly one of --prompt (streams one completion), --file (one JSON line {\"prompt\", \"completion\"}\n"
      "per row, generated in batches) and --interactive (a prompt a line from stdin). Status lines go to stderr,\n"
      "so stdout is the text alone.");
  generate->add_option("MODEL", c.model, "a Hugging Face checkpoint folder")->required();
  generate->add_option("--adapter", c.adapter, "a PEFT LoRA adapter folder")->type_name("DIR");
  generate->add_option("--tokenizer", c.tokenizer, "tokenizer.model or tokenizer.json (default: MODEL's)")
      ->type_name("FILE");
  generate->add_option("--prompt", c.prompt, "one prompt; its completion is streamed")->type_name("TEXT");
  generate->add_option("--file", c.prompts_file, "JSONL of {\"prompt\": ...} rows, generated in batches")
      ->type_name("JSONL");
  generate->add_flag("--interactive", c.interactive, "a prompt a line from stdin");
  add_number_option<int64_t>(*generate, "--max-new-tokens", c.sampling.max_new_tokens, 1, 1 << 20, "default 128");
  add_number_option(*generate, "--temperature", c.sampling.temperature, 0.0, 100.0, "0 (the default) is greedy");
  add_number_option(*generate, "--top-p", c.sampling.top_p, 1e-9, 1.0, "nucleus sampling (default 1)");
  add_number_option<int64_t>(*generate, "--top-k", c.sampling.top_k, 0, int64_t(1) << 31, "0 (the default): all");
  add_number_option(*generate, "--repetition-penalty", c.sampling.repetition_penalty, 1e-3, 1e3, "default 1");
  add_repeated_option(*generate, "--stop", c.stop,
                      "a text or special token that ends a row, besides the checkpoint's EOS; repeatable")
      ->type_name("TEXT");
  auto seed = [](const std::string& text) { return uint64_t(number_in<int64_t>(text, 0, INT64_MAX)); };
  add_parsed_option(*generate, "--seed", c.sampling.seed, seed, "sampling seed (default 0)")->type_name("INT");
  add_number_option<int64_t>(*generate, "--batch-size", c.batch_size, 1, 4096, "--file rows per batch (default 8)");
  generate->add_flag_callback("--no-kv-cache", [&c] { c.sampling.kv_cache = false; },
                              "recompute every position each step (the old path)");
  generate->add_flag("--ignore-eos", c.ignore_eos,
                     "the EOS tokens do not stop a row (benchmarks: exactly --max-new-tokens each)");
  add_choice_option(*generate, "--quantization", c.quantization, enum_names(QuantizedBase{}),
                    "the base's quantization, as the adapter was trained over it (default none: full precision)");
  add_choice_option(*generate, "--precision", c.precision, enum_names(Precision{}), "default fp32");
  add_choice_option(*generate, "--device", c.device, enum_names(DeviceChoice{}), "default auto");
  return generate;
}

int run_generate(const GenerateCommand& command) {
  const int sources = int(!command.prompt.empty()) + int(!command.prompts_file.empty()) + int(command.interactive);
  FT_CHECK(sources == 1, "generate: give exactly one of --prompt, --file and --interactive");
  Session session;
  load_session(session, command);
  const auto start = std::chrono::steady_clock::now();
  std::string done;  // what was generated, for the closing line
  if (!command.prompt.empty()) {
    done = std::to_string(stream_completion(session, command.prompt, command.sampling)) + " new tokens";
  } else if (command.interactive) {
    int64_t new_tokens = 0;
    std::string line;
    while (std::cerr << "> " << std::flush, std::getline(std::cin, line))
      if (!line.empty()) new_tokens += stream_completion(session, line, command.sampling);
    done = std::to_string(new_tokens) + " new tokens";
  } else {
    const std::vector<std::string> prompts = load_prompts(command.prompts_file);
    const std::vector<std::string> completions = complete_prompts(
        *session.model, *session.tokenizer, prompts, command.sampling, session.stop, command.batch_size);
    for (size_t i = 0; i < prompts.size(); ++i)
      std::cout << nlohmann::json{{"prompt", prompts[i]}, {"completion", completions[i]}}.dump() << "\n";
    done = std::to_string(prompts.size()) + " completions";
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cerr << "generate: " << done << " in " << seconds << " s ("
            << (command.sampling.kv_cache ? "with" : "without") << " the key/value cache)\n";
  return 0;
}

}  // namespace ft
