#include "trainer/cli/generate_command.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "kernels/error.h"
#include "kernels/input_file.h"
#include "model/families.h"
#include "model/peft_adapter.h"
#include "model/safetensors.h"
#include "tokenizer/load_tokenizer.h"
#include "trainer/adapter_record.h"
#include "trainer/cli/inference_model.h"
#include "trainer/cli/options.h"
#include "trainer/data/data.h"
#include "trainer/data/special_tokens.h"
#include "trainer/device_backend.h"
#include "trainer/evaluate.h"
#include "trainer/generate_seq2seq.h"
#include "trainer/trainer.h"

namespace ft {

namespace {

// The bytes of text before its trailing run of U+FFFD: what decode gives for
// a character whose bytes have not all arrived (a byte-level BPE or byte
// fallback token can end mid-character), which the next token may turn into
// that character. Before it the text no longer changes: UTF-8 decodes left to
// right, so only an incomplete tail depends on bytes to come.
size_t settled_bytes(const std::string& text) {
  static const std::string replacement = "\xEF\xBF\xBD";
  size_t end = text.size();
  while (end >= replacement.size() && text.compare(end - replacement.size(), replacement.size(), replacement) == 0)
    end -= replacement.size();
  return end;
}

// Prints a row's completion as its tokens arrive: the decoded text grows, and
// only what is new is written. Text that could still become the start of a
// stop string, or a character still missing bytes, is held back until it
// cannot change (or the row ends), as transformers' TextStreamer holds back
// an incomplete character.
class StreamPrinter {
 public:
  StreamPrinter(const Tokenizer& tokenizer, const std::vector<std::string>& stop_strings)
      : tokenizer_(tokenizer), stop_strings_(stop_strings) {
    for (const std::string& stop : stop_strings) held_bytes_ = std::max(held_bytes_, stop.size());
  }
  void on_token(int32_t token) {
    tokens_.push_back(token);
    const std::string text = visible_text();
    write(text, std::min(settled_bytes(text), text.size() - std::min(text.size(), held_bytes_ ? held_bytes_ - 1 : 0)));
  }
  // The row's text so far (stop strings cut).
  std::string text() const { return visible_text(); }
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
  InferenceModel loaded;
  LanguageModel* model = nullptr;  // a CausalLM, or a T5Model: its encoder reads the prompt
  Tokenizer* tokenizer = nullptr;
  StopCondition stop;
  std::optional<ChatTemplate> chat;  // --chat
  std::string system;                // --chat --system
  nlohmann::ordered_json tools;      // --chat --tools: the schemas as written (null: none)
};

// --tools: a JSON list of tool schemas (objects), key order kept as the template prints them.
nlohmann::ordered_json read_tools(const std::string& path) {
  std::ifstream file = open_input_file(path, "tools file (a JSON list of tool schemas)");
  nlohmann::ordered_json tools;
  try {
    tools = nlohmann::ordered_json::parse(file);
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": invalid JSON: ", e.what());
  }
  check_tool_schemas(tools, path);
  return tools;
}

void load_session(Session& session, const GenerateCommand& command) {
  load_inference_model(session.loaded,
                       {command.model, command.adapter, command.tokenizer, command.quantization, command.precision,
                        command.device, OutputHead::none, "finetune generate", true},
                       command.stop);
  session.model = session.loaded.model.get();
  session.tokenizer = session.loaded.tokenizer.get();
  const SpecialTokens& special = session.loaded.special;
  session.stop = StopCondition{special.stop_ids, special.stop_strings, session.tokenizer};
  if (command.ignore_eos) session.stop.ids.clear();
  std::cerr << "special tokens: " << describe(special, *session.tokenizer) << "\n";
  FT_CHECK(!command.chat || !session.model->as_seq2seq(), "generate: --chat: ", command.model,
           " is an encoder-decoder model (T5), which has no chat template: give its input text as the prompt");
  const std::optional<AdapterRecord>& record = session.loaded.record;
  const std::optional<ChatTemplateKind> trained_chat = record ? record->chat_template : std::nullopt;
  if (!command.chat) {
    if (trained_chat)
      std::cerr << "generate: the adapter was trained on chat rows (template " << enum_name(*trained_chat)
                << "): add --chat to give it prompts as it saw them\n";
    return;
  }
  ChatTemplateKind kind = command.chat_template;
  if (kind == ChatTemplateKind::automatic && record && record->chat_template) kind = *record->chat_template;
  session.chat = resolve_chat_template(kind,
                                       std::filesystem::path(session.loaded.config.tokenizer).parent_path().string(),
                                       "--chat-template");
  session.system = command.system;
  if (!command.tools_file.empty()) session.tools = read_tools(command.tools_file);
  std::cerr << "chat template: " << enum_name(session.chat->kind) << "\n";
}

// What the model is given for a prompt: the text itself, or with --chat the
// generation prompt of the conversation (the system message first, if any),
// tokenized as apply_chat_template does (session_form).
std::string model_prompt(const Session& session, std::vector<ChatMessage> conversation, const std::string& where) {
  if (!session.chat) return conversation.back().content;
  if (!session.system.empty()) conversation.insert(conversation.begin(), {"system", session.system});
  return generation_prompt(*session.chat, conversation, where, session.tools);
}

PromptForm session_form(const Session& session) { return session.chat ? PromptForm::chat : PromptForm::text; }

// A --file row kept as written (tools, tool calls or results, content parts): its conversation as
// written (key order kept), the system message first, its own tools (else
// --tools), ready for the reply.
std::string written_row_prompt(const Session& session, const std::string& line, const std::string& where) {
  nlohmann::ordered_json conversation = written_conversation(nlohmann::ordered_json::parse(line), where, true);
  nlohmann::ordered_json& messages = conversation["messages"];
  if (!session.system.empty()) messages.insert(messages.begin(), {{"role", "system"}, {"content", session.system}});
  return reply_prompt(*session.chat, messages, conversation["tools"].is_null() ? session.tools : conversation["tools"],
                      where);
}

struct Completion {
  int64_t new_tokens = 0;
  std::string text;
};

// One prompt, streamed to stdout. A reply that ends before its first token
// (a stop token first: a chat model given a bare prompt often does) says so.
Completion stream_completion(Session& session, const std::string& prompt, const SamplingOptions& sampling) {
  StreamPrinter printer(*session.tokenizer, session.stop.strings);
  const TokenCallback on_token = [&](size_t, int32_t token) { printer.on_token(token); };
  T5Model* t5 = session.model->as_seq2seq();
  CausalLM* causal = session.model->as_causal_lm();
  const std::vector<int32_t> tokens = t5 ? seq2seq_prompt_tokens(*session.tokenizer, prompt)
                                         : prompt_tokens(*session.tokenizer, prompt, session_form(session));
  FT_CHECK(!tokens.empty(), "generate: the prompt is empty and the tokenizer adds no BOS token: nothing to continue");
  if (causal && int64_t(tokens.size()) > prompt_token_limit(*causal))
    std::cerr << "generate: the prompt is " << tokens.size() << " tokens; the model takes "
              << causal->config().position_limit() << " positions, so it continues the last "
              << prompt_token_limit(*causal) << " and its first tokens were cut\n";
  const auto generated = t5 ? generate_seq2seq(*t5, {tokens}, sampling, session.stop, on_token)
                            : generate(*causal, {tokens}, sampling, session.stop, on_token);
  printer.finish();
  const int64_t new_tokens = int64_t(generated[0].size());
  if (causal) {
    const int64_t positions = causal->config().position_limit();
    const int64_t prompt_length = std::min<int64_t>(int64_t(tokens.size()), prompt_token_limit(*causal));
    if (new_tokens < sampling.max_new_tokens && prompt_length + new_tokens >= positions)
      std::cerr << "generate: stopped after " << new_tokens << " of " << sampling.max_new_tokens
                << " new tokens: with the prompt's " << prompt_length << " they fill the model's " << positions
                << " positions (max_position_embeddings)\n";
  }
  if (generated[0].empty())
    std::cerr << "generate: the first token generated was a stop token: no new text"
              << (session.chat || t5 ? "" : " (a model trained on chat data replies to its chat template: try --chat)")
              << "\n";
  return {new_tokens, printer.text()};
}

// --file: each row's prompt text for the model, and the row's own fields
// for the output line ({"prompt"}, or with --chat {"messages"} too).
struct PromptRows {
  std::vector<std::string> prompts;
  std::vector<nlohmann::json> rows;
};
PromptRows load_prompt_rows(const Session& session, const std::string& path) {
  if (!session.chat) {
    PromptRows loaded{load_prompts(path), {}};
    for (const std::string& prompt : loaded.prompts) loaded.rows.push_back({{"prompt", prompt}});
    return loaded;
  }
  PromptRows loaded;
  read_jsonl_lines(path, "prompts file", "a \"prompt\" string or a \"messages\" list ending with a user message",
                   [&](const std::string& line, const nlohmann::json& row, const std::string& where) {
                     FT_CHECK(row.contains("prompt") || row.contains("messages"), where,
                              ": expected a \"prompt\" string or a \"messages\" list, got ", key_list(row));
                     if (row.contains("messages") && kept_as_written(row))
                       loaded.prompts.push_back(written_row_prompt(session, line, where));
                     else if (row.contains("messages"))
                       loaded.prompts.push_back(model_prompt(session, chat_messages(row, where), where));
                     else
                       loaded.prompts.push_back(model_prompt(session, {{"user", string_field(row, "prompt", where)}}, where));
                     nlohmann::json out = row.contains("messages") ? nlohmann::json{{"messages", row["messages"]}}
                                                                   : nlohmann::json{{"prompt", row["prompt"]}};
                     if (row.contains("tools")) out["tools"] = row["tools"];
                     loaded.rows.push_back(out);
                   });
  return loaded;
}

}  // namespace

CLI::App* add_generate_command(CLI::App& app, GenerateCommand& c) {
  CLI::App* generate =
      app.add_subcommand("generate", "Text from a Hugging Face checkpoint, with a PEFT LoRA adapter when given");
  generate->footer(
      "Give exactly one of --prompt (streams one completion), --file (one JSON line {\"prompt\", \"completion\"}\n"
      "per row, generated in batches) and --interactive (a prompt a line from stdin). With --chat a prompt is a\n"
      "user message rendered with the checkpoint's chat template, --file rows may be {\"messages\": [...]} ending\n"
      "with a user message, and --interactive keeps one conversation. A T5 checkpoint (FLAN-T5) reads each prompt as\n"
      "its encoder's input, as in training, and generates the decoder's text. Status lines go to stderr, so stdout\n"
      "is the text alone.");
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
                    "the base's quantization (default: as the adapter was trained, recorded in its\n"
                    "finetune_run.json; else none: full precision)");
  add_choice_option(*generate, "--precision", c.precision, enum_names(Precision{}),
                    "default: as the adapter was trained; else fp32");
  add_choice_option(*generate, "--device", c.device, enum_names(DeviceChoice{}), "default auto");
  generate->add_flag("--chat", c.chat,
                     "prompts are user messages, rendered with the chat template (add_generation_prompt)");
  generate->add_option("--system", c.system, "with --chat: the system message each conversation starts with")
      ->type_name("TEXT");
  add_choice_option(*generate, "--chat-template", c.chat_template, enum_names(ChatTemplateKind{}),
                    "with --chat: the template (default: the adapter's, as trained; else the checkpoint's\n"
                    "tokenizer_config.json)");
  generate->add_option("--tools", c.tools_file,
                       "with --chat: a JSON file, a list of tool schemas the template is given (apply_chat_template's\n"
                       "tools); a --file row's own \"tools\" win")
      ->type_name("FILE");
  return generate;
}

int run_generate(const GenerateCommand& command) {
  const int sources = int(command.prompt.has_value()) + int(!command.prompts_file.empty()) + int(command.interactive);
  FT_CHECK(sources == 1, "generate: give exactly one of --prompt, --file and --interactive");
  for (const std::string& stop : command.stop)
    FT_CHECK(!stop.empty(), "generate: --stop is empty; give the text (or special token) that ends a row");
  FT_CHECK(command.chat || (command.system.empty() && command.chat_template == ChatTemplateKind::automatic &&
                            command.tools_file.empty()),
           "generate: --system, --chat-template and --tools apply to --chat");
  Session session;
  load_session(session, command);
  const auto start = std::chrono::steady_clock::now();
  std::string done;  // what was generated, for the closing line
  if (command.prompt) {
    const std::string prompt = model_prompt(session, {{"user", *command.prompt}}, "--prompt");
    done = std::to_string(stream_completion(session, prompt, command.sampling).new_tokens) + " new tokens";
  } else if (command.interactive) {
    int64_t new_tokens = 0;
    std::vector<ChatMessage> conversation;  // --chat: every turn so far
    std::string line;
    while (std::cerr << "> " << std::flush, std::getline(std::cin, line)) {
      if (line.empty()) continue;
      conversation.push_back({"user", line});
      const Completion reply =
          stream_completion(session, model_prompt(session, conversation, "--interactive"), command.sampling);
      new_tokens += reply.new_tokens;
      if (session.chat) conversation.push_back({"assistant", reply.text});
      else conversation.clear();
    }
    done = std::to_string(new_tokens) + " new tokens";
  } else {
    const PromptRows loaded = load_prompt_rows(session, command.prompts_file);
    int64_t cut = 0;
    const std::vector<std::string> completions = complete_prompts(*session.model, *session.tokenizer, loaded.prompts,
                                                                  command.sampling, session.stop, command.batch_size,
                                                                  session_form(session), &cut);
    if (cut > 0)
      std::cerr << "generate: " << cut << " of " << loaded.prompts.size() << " prompts are longer than the model's "
                << session.model->as_causal_lm()->config().position_limit()
                << " positions: each continues its last " << prompt_token_limit(*session.model->as_causal_lm())
                << " tokens\n";
    for (size_t i = 0; i < loaded.prompts.size(); ++i) {
      nlohmann::json out = loaded.rows[i];
      out["completion"] = completions[i];
      std::cout << out.dump() << "\n";
    }
    done = std::to_string(loaded.prompts.size()) + " completions";
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cerr << "generate: " << done << " in " << seconds << " s ("
            << (command.sampling.kv_cache ? "with" : "without") << " the key/value cache)\n";
  return 0;
}

}  // namespace ft
