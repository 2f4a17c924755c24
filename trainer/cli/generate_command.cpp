#include "trainer/cli/generate_command.h"

#include <charconv>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "kernels/error.h"
#include "model/peft_adapter.h"
#include "model/safetensors.h"
#include "tokenizer/load_tokenizer.h"
#include "trainer/data/data.h"
#include "trainer/data/special_tokens.h"
#include "trainer/device_backend.h"
#include "trainer/evaluate.h"
#include "trainer/trainer.h"

namespace ft {

const char* const kGenerateUsage =
    "usage: finetune generate MODEL [--adapter DIR] [--tokenizer FILE] (--prompt TEXT | --file JSONL | --interactive)\n"
    "         [--max-new-tokens 128] [--temperature 0] [--top-p 1] [--top-k 0] [--repetition-penalty 1]\n"
    "         [--stop TEXT]... [--seed 0] [--batch-size 8] [--quantization none|int8|nf4]\n"
    "         [--precision fp32|bf16] [--device auto|cpu|cuda] [--no-kv-cache] [--ignore-eos]\n"
    "  MODEL: a Hugging Face checkpoint folder; --adapter: a PEFT LoRA adapter folder;\n"
    "  --tokenizer: tokenizer.model or tokenizer.json (default: MODEL's)\n"
    "  --prompt streams one completion; --file reads {\"prompt\": ...} rows and writes one JSON line each;\n"
    "  --interactive reads a prompt a line from stdin. --temperature 0 is greedy.\n"
    "  --ignore-eos: the EOS tokens do not stop a row (benchmarks: exactly --max-new-tokens each)\n"
    "  --quantization: the base as the adapter was trained over (int8, nf4) or full precision (none)\n";

namespace {

// The flag's value as a number (an integer when Number is one) in [lo, hi];
// the error names the flag.
template <class Number>
Number number_arg(const std::string& flag, const std::string& text, Number lo, Number hi) {
  Number value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  FT_CHECK(error == std::errc() && end == text.data() + text.size() && value >= lo && value <= hi, flag, " expects ",
           std::is_integral_v<Number> ? "an integer" : "a number", " in [", lo, ", ", hi, "], got \"", text, "\"");
  return value;
}

template <class Enum>
Enum choice_arg(const std::string& flag, const std::string& text,
                std::initializer_list<std::pair<const char*, Enum>> choices) {
  std::string names;
  for (const auto& [name, value] : choices) {
    if (text == name) return value;
    if (!names.empty()) names += '|';
    names += name;
  }
  fail(flag, " expects ", names, ", got \"", text, "\"");
}

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
  const ModelConfig model_config = ModelConfig::from_json_file(config_json);
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

GenerateCommand parse_generate_args(int argc, char** argv, int first) {
  GenerateCommand c;
  c.sampling.max_new_tokens = 128;
  for (int i = first; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      FT_CHECK(i + 1 < argc, arg, " needs a value\n", kGenerateUsage);
      return argv[++i];
    };
    if (arg == "--adapter") c.adapter = value();
    else if (arg == "--tokenizer") c.tokenizer = value();
    else if (arg == "--prompt") c.prompt = value();
    else if (arg == "--file") c.prompts_file = value();
    else if (arg == "--interactive") c.interactive = true;
    else if (arg == "--max-new-tokens") c.sampling.max_new_tokens = number_arg<int64_t>(arg, value(), 1, 1 << 20);
    else if (arg == "--temperature") c.sampling.temperature = number_arg(arg, value(), 0.0, 100.0);
    else if (arg == "--top-p") c.sampling.top_p = number_arg(arg, value(), 1e-9, 1.0);
    else if (arg == "--top-k") c.sampling.top_k = number_arg<int64_t>(arg, value(), 0, int64_t(1) << 31);
    else if (arg == "--repetition-penalty") c.sampling.repetition_penalty = number_arg(arg, value(), 1e-3, 1e3);
    else if (arg == "--stop") c.stop.push_back(value());
    else if (arg == "--seed") c.sampling.seed = uint64_t(number_arg<int64_t>(arg, value(), 0, INT64_MAX));
    else if (arg == "--batch-size") c.batch_size = number_arg<int64_t>(arg, value(), 1, 4096);
    else if (arg == "--no-kv-cache") c.sampling.kv_cache = false;
    else if (arg == "--ignore-eos") c.ignore_eos = true;
    else if (arg == "--quantization")
      c.quantization = choice_arg<QuantizedBase>(
          arg, value(), {{"none", QuantizedBase::none}, {"int8", QuantizedBase::int8}, {"nf4", QuantizedBase::nf4}});
    else if (arg == "--precision")
      c.precision = choice_arg<Precision>(arg, value(), {{"fp32", Precision::fp32}, {"bf16", Precision::bf16}});
    else if (arg == "--device")
      c.device = choice_arg<DeviceChoice>(arg, value(), {{"auto", DeviceChoice::automatic}, {"cpu", DeviceChoice::cpu},
                                           {"cuda", DeviceChoice::cuda}});
    else if (arg.rfind("-", 0) == 0 || !c.model.empty()) fail("generate: unexpected argument \"", arg, "\"\n", kGenerateUsage);
    else c.model = arg;
  }
  FT_CHECK(!c.model.empty(), "generate: no MODEL folder given\n", kGenerateUsage);
  const int sources = int(!c.prompt.empty()) + int(!c.prompts_file.empty()) + int(c.interactive);
  FT_CHECK(sources == 1, "generate: give exactly one of --prompt, --file and --interactive\n", kGenerateUsage);
  return c;
}

int run_generate(const GenerateCommand& command) {
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
