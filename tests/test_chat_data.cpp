// Chat and Alpaca rows: rendering with the recognised chat templates, ids and
// assistant-only loss masks against transformers' apply_chat_template
// (tests/fixtures/chat/, scripts/make_chat_fixture.py), and the errors.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kernels/error.h"
#include "tokenizer/bpe_tokenizer.h"
#include "trainer/data/chat_template.h"
#include "trainer/data/data.h"

using namespace ft;

namespace {

const std::string kChatDir = std::string(FT_FIXTURES_DIR) + "/chat";

nlohmann::json read_json(const std::string& path) {
  std::ifstream file(path);
  REQUIRE(file.good());
  return nlohmann::json::parse(file);
}

std::vector<ChatMessage> messages_of(const nlohmann::json& list) {
  std::vector<ChatMessage> messages;
  for (const nlohmann::json& m : list) messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  return messages;
}

std::string joined(const std::vector<RenderedPiece>& pieces) {
  std::string text;
  for (const RenderedPiece& piece : pieces) text += piece.text;
  return text;
}

std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

Dataset load_string(const std::string& content, DataFormat format = DataFormat::automatic) {
  std::istringstream input(content);
  return load_jsonl(input, "chat.jsonl", format);
}

std::string load_error(const std::string& content) {
  return error_of([&] { load_string(content); });
}

}  // namespace

TEST_CASE("chat templates render, tokenize and mask as apply_chat_template does") {
  const std::pair<const char*, ChatTemplateKind> families[] = {{"chatml", ChatTemplateKind::chatml},
                                                               {"qwen2", ChatTemplateKind::chatml},
                                                               {"llama2", ChatTemplateKind::llama2},
                                                               {"llama3", ChatTemplateKind::llama3},
                                                               {"zephyr", ChatTemplateKind::zephyr}};
  for (const auto& family_kind : families) {
    const char* family = family_kind.first;  // not a structured binding: CAPTURE cannot take one (clang, OpenMP)
    const ChatTemplateKind kind = family_kind.second;
    CAPTURE(family);
    const std::string dir = kChatDir + "/" + family;
    const nlohmann::json fixture = read_json(dir + "/cases.json");
    BpeTokenizer tokenizer(std::string(FT_FIXTURES_DIR) + "/" + fixture["tokenizer"].get<std::string>() +
                           "/tokenizer.json");
    ChatTemplate chat = resolve_chat_template(ChatTemplateKind::automatic, dir);
    CHECK(chat.kind == kind);
    for (const nlohmann::json& c : fixture["cases"]) {
      std::vector<RenderedPiece> pieces = render_chat(chat, messages_of(c["messages"]), "fixture");
      CHECK(joined(pieces) == c["text"].get<std::string>());
      TokenSequence seq = tokenize_chat(pieces, tokenizer);
      CHECK(seq.tokens == c["ids"].get<std::vector<int32_t>>());
      CHECK(std::vector<int>(seq.loss_mask.begin(), seq.loss_mask.end()) == c["mask"].get<std::vector<int>>());
    }
  }
}

TEST_CASE("data.chat_template wins over tokenizer_config.json; an unknown template is one clear error") {
  CHECK(resolve_chat_template(ChatTemplateKind::zephyr, kChatDir + "/chatml").kind == ChatTemplateKind::zephyr);
  CHECK(resolve_chat_template(ChatTemplateKind::llama2, kChatDir + "/unknown").kind == ChatTemplateKind::llama2);
  const std::string unknown = kChatDir + "/unknown/tokenizer_config.json";
  CHECK(error_of([&] { resolve_chat_template(ChatTemplateKind::automatic, kChatDir + "/unknown"); }) ==
        unknown + ": its chat_template is none of the templates this trainer renders (chatml, llama2, llama3, zephyr; "
                  "Jinja is not run); set data.chat_template to one of chatml, llama2, llama3, zephyr");
  const std::string none = std::string(FT_FIXTURES_DIR) + "/tokenizer";
  CHECK(error_of([&] { resolve_chat_template(ChatTemplateKind::automatic, none); }) ==
        none + "/tokenizer_config.json: no chat_template to render chat rows with; set data.chat_template to one of "
               "chatml, llama2, llama3, zephyr");
  // A template in chat_template.jinja (transformers' newer layout) is named by that file, and the setting
  // named is the caller's.
  const std::filesystem::path dir = std::filesystem::path(FT_BINARY_DIR) / "test_chat_jinja";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "chat_template.jinja") << "{% for m in messages %}<start_of_turn>{{ m.content }}{% endfor %}";
  CHECK(error_of([&] { resolve_chat_template(ChatTemplateKind::automatic, dir.string(), "--chat-template"); }) ==
        (dir / "chat_template.jinja").string() +
            ": its chat_template is none of the templates this trainer renders (chatml, llama2, llama3, zephyr; "
            "Jinja is not run); set --chat-template to one of chatml, llama2, llama3, zephyr");
  std::ofstream(dir / "chat_template.jinja") << "{{ '<|im_start|>' + m.role }}{{ '<|im_end|>' }}";
  const ChatTemplate from_jinja = resolve_chat_template(ChatTemplateKind::automatic, dir.string());
  CHECK(from_jinja.kind == ChatTemplateKind::chatml);
  CHECK(from_jinja.source == (dir / "chat_template.jinja").string());
  CHECK(resolve_chat_template(ChatTemplateKind::zephyr, dir.string()).source == "data.chat_template");
  std::filesystem::remove_all(dir);
}

TEST_CASE("chat rows load, are detected from the first row, and train only assistant turns") {
  Dataset data = load_string(
      "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello\"}]}\n");
  CHECK(data.format == DataFormat::chat);
  REQUIRE(data.examples.size() == 1);
  CHECK(data.examples[0].messages.size() == 2);
  CHECK(data.examples[0].line == 1);
  CHECK(load_string("{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\"}]}", DataFormat::chat).format ==
        DataFormat::chat);

  const nlohmann::json fixture = read_json(kChatDir + "/llama3/cases.json");
  BpeTokenizer tokenizer(std::string(FT_FIXTURES_DIR) + "/" + fixture["tokenizer"].get<std::string>() +
                         "/tokenizer.json");
  const ChatTemplate chat = resolve_chat_template(ChatTemplateKind::automatic, kChatDir + "/llama3");
  Dataset rows{"mem", DataFormat::chat, {}};
  for (const nlohmann::json& c : fixture["cases"]) rows.examples.push_back({"", "", messages_of(c["messages"]), 1});
  TokenizedDataset tokens = tokenize_dataset(rows, tokenizer, 512, /*eos_id=*/4, &chat);
  REQUIRE(tokens.examples.size() == fixture["cases"].size());
  int64_t expected_loss = 0, longer_than_61 = 0;
  for (size_t i = 0; i < tokens.examples.size(); i++) {
    longer_than_61 += fixture["cases"][i]["ids"].size() > 61;
    // The template places every special token: no bos or eos is added around it.
    CHECK(tokens.examples[i].tokens == fixture["cases"][i]["ids"].get<std::vector<int32_t>>());
    for (int bit : fixture["cases"][i]["mask"].get<std::vector<int>>()) expected_loss += bit;
  }
  CHECK(tokens.loss_token_count == expected_loss);
  // Cut to seq_len + 1 tokens like any other row.
  TokenizedDataset cut = tokenize_dataset(rows, tokenizer, 60, 4, &chat);
  CHECK(cut.truncated_count == longer_than_61);
  CHECK(longer_than_61 > 0);
  for (const TokenSequence& seq : cut.examples) CHECK(seq.tokens.size() <= 61);
}

TEST_CASE("chat row errors name the file, the line and what was expected") {
  CHECK(load_error("{\"messages\": []}") ==
        "chat.jsonl:1: \"messages\" is empty (expected at least one user and one assistant turn)");
  CHECK(load_error("{\"messages\": [{\"role\": \"bot\", \"content\": \"x\"}]}") ==
        "chat.jsonl:1: messages[0].role is \"bot\" (expected system, user or assistant)");
  CHECK(load_error("{\"messages\": [{\"role\": \"user\", \"content\": 3}]}") ==
        "chat.jsonl:1: messages[0].content must be a string, got number");
  CHECK(load_error("{\"messages\": [{\"role\": \"user\"}]}") == "chat.jsonl:1: messages[0] lacks \"content\"");
  CHECK(load_error("{\"messages\": {\"role\": \"user\"}}") ==
        "chat.jsonl:1: \"messages\" must be a list of {\"role\", \"content\"} objects, got object");
  CHECK(load_error("\n{\"messages\": [{\"role\": \"assistant\", \"content\": \"a\"}, {\"role\": \"user\", \"content\": "
                   "\"b\"}]}") == "chat.jsonl:2: the last message is the user's (expected an assistant turn to train on)");
  CHECK(load_error("{\"messages\": [{\"role\": \"assistant\", \"content\": \"a\"}], \"text\": \"b\"}") ==
        "chat.jsonl:1: a row has one of \"prompt\"/\"completion\", \"text\", \"messages\" or \"instruction\"/\"output\", "
        "got keys \"messages\", \"text\"");
  CHECK(load_error("{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"messages\": [{\"role\": \"assistant\", \"content\": "
                   "\"a\"}]}") == "chat.jsonl:2: a chat row, but line 1 is a prompt_completion row and all rows must agree");

  // Llama-2's template takes alternating user/assistant turns only: found when rendering, named by line.
  Dataset data = load_string("\n\n{\"messages\": [{\"role\": \"assistant\", \"content\": \"a\"}]}");
  const ChatTemplate llama2 = resolve_chat_template(ChatTemplateKind::automatic, kChatDir + "/llama2");
  BpeTokenizer tokenizer(std::string(FT_FIXTURES_DIR) + "/tokenizers/llama2/tokenizer.json");
  CHECK(error_of([&] { tokenize_dataset(data, tokenizer, 64, 2, &llama2); }) ==
        "chat.jsonl:3: messages[0].role is \"assistant\" but the llama2 chat template needs user and assistant turns "
        "to alternate (after an optional system message), starting with user");
  CHECK(error_of([&] { tokenize_dataset(data, tokenizer, 64, 2); }) == "chat.jsonl: chat rows need a chat template");
}

TEST_CASE("Alpaca rows get Stanford Alpaca's prompt and train on the output") {
  const nlohmann::json fixture = read_json(kChatDir + "/alpaca.json");
  std::string jsonl;
  for (const nlohmann::json& c : fixture) jsonl += c["row"].dump() + "\n";
  Dataset data = load_string(jsonl);
  CHECK(data.format == DataFormat::alpaca);
  REQUIRE(data.examples.size() == fixture.size());
  for (size_t i = 0; i < fixture.size(); i++) {
    CHECK(data.examples[i].prompt == fixture[i]["prompt"].get<std::string>());
    CHECK(data.examples[i].completion == fixture[i]["row"]["output"].get<std::string>());
  }
  CHECK(load_error("{\"instruction\": \"a\"}") == "chat.jsonl:1: row lacks \"output\"");
  CHECK(load_error("{\"instruction\": \"a\", \"input\": 1, \"output\": \"b\"}") ==
        "chat.jsonl:1: \"input\" must be a string, got number");
}

TEST_CASE("chat examples get the conversation before the last assistant turn as their sample prompt") {
  const nlohmann::json c = read_json(kChatDir + "/llama2/cases.json")["cases"][1];
  Dataset data{"mem", DataFormat::chat, {{"", "", messages_of(c["messages"]), 1}}};
  set_chat_prompts(data, resolve_chat_template(ChatTemplateKind::automatic, kChatDir + "/llama2"));
  const std::string text = c["text"].get<std::string>();
  const std::string last = c["messages"].back()["content"].get<std::string>();
  // apply_chat_template's text less its leading "<s>" (generation adds bos) and the last " answer </s>".
  CHECK(data.examples[0].prompt == text.substr(3, text.rfind(" " + last + " </s>") - 3));
  CHECK(data.examples[0].completion == last);
}
