// Chat and Alpaca rows: released chat templates run by our Jinja interpreter,
// their text, ids and assistant-only loss masks against transformers'
// apply_chat_template (tests/fixtures/chat/, scripts/make_chat_fixture.py),
// the interpreter's constructs, and the errors.
#include <doctest/doctest.h>

#include <ctime>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kernels/error.h"
#include "tokenizer/bpe_tokenizer.h"
#include "trainer/data/chat_template.h"
#include "trainer/evaluate.h"
#include "trainer/data/data.h"
#include "trainer/data/jinja/render.h"

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

// The local time at noon of the fixture's "date" (YYYY-MM-DD): strftime_now's day in any time zone.
std::time_t fixture_now(const std::string& date) {
  std::tm local{};
  local.tm_year = std::stoi(date.substr(0, 4)) - 1900;
  local.tm_mon = std::stoi(date.substr(5, 2)) - 1;
  local.tm_mday = std::stoi(date.substr(8, 2));
  local.tm_hour = 12;
  local.tm_isdst = -1;
  return std::mktime(&local);
}

TEST_CASE("released chat templates render, tokenize and mask as apply_chat_template does") {
  // The real templates of these families run in our Jinja interpreter; data.chat_template: auto takes each.
  const char* families[] = {"chatml",      "qwen2",      "llama2",       "llama3",  "zephyr",  "llama3_1",
                            "llama3_2",    "mistral_v1", "mistral_v3",   "mistral_nemo", "qwen2_5", "qwen3",
                            "gemma2",      "gemma3",     "phi3",         "phi3_5",  "deepseek_r1", "deepseek_v3",
                            "granite3_1",  "smollm2",    "smollm3"};
  int rendered = 0, refused = 0, with_tools = 0, prompts = 0;
  for (const char* family : families) {
    CAPTURE(family);
    const std::string dir = kChatDir + "/" + family;
    std::ifstream file(dir + "/cases.json");
    REQUIRE(file.good());
    const nlohmann::ordered_json fixture = nlohmann::ordered_json::parse(file);  // key order matters to tojson
    BpeTokenizer tokenizer(std::string(FT_FIXTURES_DIR) + "/" + fixture["tokenizer"].get<std::string>() +
                           "/tokenizer.json");
    ChatTemplate chat = resolve_chat_template(ChatTemplateKind::automatic, dir);
    CHECK(chat.kind == ChatTemplateKind::automatic);
    chat.now = fixture_now(fixture["date"]);
    for (const nlohmann::ordered_json& c : fixture["cases"]) {
      const std::string where = std::string(family) + " case " + std::to_string(rendered + refused);
      CAPTURE(where);
      const nlohmann::ordered_json tools = c.contains("tools") ? c["tools"] : nlohmann::ordered_json();
      const bool add_generation_prompt = c["add_generation_prompt"];
      if (c.contains("error")) {  // the template refuses the conversation, as Jinja2 did
        const std::string error = error_of([&] { render_chat(chat, c["messages"], tools, add_generation_prompt, "row"); });
        CHECK(error.starts_with("row: " + dir + "/tokenizer_config.json: chat_template line "));
        if (error.find("raised an exception") != std::string::npos)
          CHECK(error.ends_with("the template raised an exception: " + c["error"].get<std::string>()));
        refused++;
        continue;
      }
      std::vector<RenderedPiece> pieces = render_chat(chat, c["messages"], tools, add_generation_prompt, "row");
      CHECK(joined(pieces) == c["text"].get<std::string>());
      TokenSequence seq = tokenize_chat(pieces, tokenizer);
      CHECK(seq.tokens == c["ids"].get<std::vector<int32_t>>());
      CHECK(std::vector<int>(seq.loss_mask.begin(), seq.loss_mask.end()) == c["mask"].get<std::vector<int>>());
      // What generation is given for the conversation: the same ids, no special token added or dropped
      // (the tokenizer's bos is not added where the template writes none, nor dropped where it writes one).
      if (add_generation_prompt)
        CHECK(prompt_tokens(tokenizer, reply_prompt(chat, c["messages"], tools, "row"), PromptForm::chat) == seq.tokens);
      rendered++;
      with_tools += !tools.is_null();
      prompts += add_generation_prompt;
    }
  }
  CHECK(rendered == 128);
  CHECK(refused == 9);
  CHECK(with_tools == 9);
  CHECK(prompts == 22);
}

TEST_CASE("data.chat_template names a built-in template; auto takes the checkpoint's; an unsupported one is one error") {
  CHECK(resolve_chat_template(ChatTemplateKind::zephyr, kChatDir + "/chatml").kind == ChatTemplateKind::zephyr);
  const ChatTemplate named = resolve_chat_template(ChatTemplateKind::llama2, kChatDir + "/unknown");
  CHECK(named.source == "data.chat_template");
  CHECK(render_chat_text(named, {{{"role", "user"}, {"content", "Hi"}}}, nullptr, true, "x") == "<s>[INST] Hi [/INST]");
  // A construct the interpreter does not run ({% call %} blocks) is refused when the template is resolved.
  const std::string unknown = kChatDir + "/unknown/tokenizer_config.json";
  CHECK(error_of([&] { resolve_chat_template(ChatTemplateKind::automatic, kChatDir + "/unknown"); }) ==
        unknown + ": chat_template line 1: unsupported construct '{% call %}' (chat templates here may use if, for, "
                  "set, macro, with, filter, generation, break and continue)");
  const std::string none = std::string(FT_FIXTURES_DIR) + "/tokenizer";
  CHECK(error_of([&] { resolve_chat_template(ChatTemplateKind::automatic, none); }) ==
        none + "/tokenizer_config.json: no chat_template to render chat rows with; set data.chat_template to one of "
               "chatml, llama2, llama3, zephyr");
  // A template in chat_template.jinja (transformers' newer layout) is named by that file, and the setting
  // named is the caller's.
  const std::filesystem::path dir = std::filesystem::path(FT_BINARY_DIR) / "test_chat_jinja";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "chat_template.jinja") << "{% for m in messages %}<start_of_turn>{{ m.content | frobnicate }}\n{% endfor %}";
  // A filter no rendering can run is refused when the template is resolved (before any row), as Jinja2
  // refuses it when it compiles; inside an if, only a row that reaches it is refused, as in Jinja2.
  CHECK(error_of([&] { resolve_chat_template(ChatTemplateKind::automatic, dir.string(), "--chat-template"); }) ==
        (dir / "chat_template.jinja").string() + " line 1: no filter named 'frobnicate' (Jinja2 has none either)");
  std::ofstream(dir / "chat_template.jinja") << "{% for m in messages %}{% if m.role == 'tool' %}{{ m.content | wordwrap }}"
                                                "{% endif %}{{ m.content }}\n{% endfor %}";
  const ChatTemplate deferred = resolve_chat_template(ChatTemplateKind::automatic, dir.string());
  CHECK(deferred.jinja->deferred_faults == std::vector<std::string>{"line 1: unsupported construct: filter 'wordwrap'"});
  CHECK(render_chat_text(deferred, {{{"role", "user"}, {"content", "Hi"}}}, nullptr, false, "x") == "Hi\n");
  CHECK(error_of([&] { render_chat_text(deferred, {{{"role", "tool"}, {"content", "Hi"}}}, nullptr, false, "row 2"); }) ==
        "row 2: " + (dir / "chat_template.jinja").string() + " line 1: unsupported construct: filter 'wordwrap'");
  std::ofstream(dir / "chat_template.jinja") << "{%- for m in messages %}\n  {{- '<|' + m.role + '|>' + m.content }}\n{% endfor %}";
  const ChatTemplate from_jinja = resolve_chat_template(ChatTemplateKind::automatic, dir.string());
  CHECK(from_jinja.source == (dir / "chat_template.jinja").string());
  CHECK(render_chat_text(from_jinja, {{{"role", "user"}, {"content", "Hi"}}, {{"role", "assistant"}, {"content", "Yo"}}},
                         nullptr, false, "x") == "<|user|>Hi\n<|assistant|>Yo\n");  // as Jinja2 renders it
  CHECK(resolve_chat_template(ChatTemplateKind::zephyr, dir.string()).source == "data.chat_template");
  // Beside a tokenizer_config.json template the file comes first, as transformers' from_pretrained takes it.
  // Special tokens only special_tokens_map.json names (a config without added_tokens_decoder) are read from it,
  // as transformers reads an older checkpoint's.
  std::ofstream(dir / "tokenizer_config.json") << R"({"chat_template": "config's", "eos_token": "</s>"})";
  std::ofstream(dir / "special_tokens_map.json") << R"({"bos_token": {"content": "<s>", "lstrip": false}})";
  const ChatTemplate both = resolve_chat_template(ChatTemplateKind::automatic, dir.string());
  CHECK(both.source == (dir / "chat_template.jinja").string());
  CHECK(both.special_tokens == std::map<std::string, std::string>{{"bos_token", "<s>"}, {"eos_token", "</s>"}});
  std::ofstream(dir / "tokenizer_config.json") << R"({"chat_template": "config's", "added_tokens_decoder": {}})";
  CHECK(resolve_chat_template(ChatTemplateKind::automatic, dir.string()).special_tokens.empty());
  std::filesystem::remove(dir / "chat_template.jinja");
  CHECK(render_chat_text(resolve_chat_template(ChatTemplateKind::automatic, dir.string()), nlohmann::json::array(),
                         nullptr, false, "x") == "config's");
  std::filesystem::remove_all(dir);
}

TEST_CASE("the Jinja interpreter runs what chat templates use and names the line of what it cannot") {
  auto render_text = [](const std::string& source, const nlohmann::ordered_json& context) {
    return jinja::render(*jinja::compile(source, "t.jinja"), context, 0).text;
  };
  const nlohmann::ordered_json none = nlohmann::ordered_json::object();
  // Expected texts are what Jinja2 3.1 (trim_blocks, lstrip_blocks) renders for each.
  CHECK(render_text("{% set ns = namespace(n=0) %}{% for x in [3, 4, 5] if x > 3 %}{% set ns.n = ns.n + x %}"
                    "{{ loop.index0 }}{{ '|' if not loop.last }}{% endfor %}={{ ns.n }}", none) == "0|1=9");
  CHECK(render_text("{% macro tag(name, close=false) %}<{{ '/' if close }}{{ name }}>{% endmacro %}"
                    "{{ tag('a') }}{{ tag('a', close=true) }}", none) == "<a></a>");
  CHECK(render_text("  {% if true %}\n    x\n  {% endif %}\nend\n", none) == "    x\nend");
  CHECK(render_text("{{ ' a b '.strip().split(' ') | join(',') }} {{ 'Ab'.lower() ~ 'x'.upper() }} "
                    "{{ [1, 2, 3][1:] | length }} {{ 'abc'[::-1] }} {{ 7 // 2 }} {{ -7 % 3 }} {{ 1 / 4 }}", none) ==
        "a,b abX 2 cba 3 2 0.25");
  CHECK(render_text("{{ {'b': [1, 2.5, none, true], 'a': 'é\"'} | tojson }} {{ {'k': 'v'} | tojson(indent=2) }} "
                    "{{ {'b': 1, 'a': 'x\\'s'} | string }}", none) ==
        "{\"b\": [1, 2.5, null, true], \"a\": \"é\\\"\"} {\n  \"k\": \"v\"\n} {'b': 1, 'a': \"x's\"}");
  CHECK(render_text("{{ m | selectattr('role', 'equalto', 'user') | map(attribute='c') | list }} "
                    "{{ m | rejectattr('role', 'in', ['user']) | list | length }} {% for k, v in m[0] | items %}{{ k }}{% endfor %}",
                    {{"m", {{{"role", "user"}, {"c", 1}}, {{"role", "bot"}, {"c", 2}}}}}) == "[1] 1 rolec");
  CHECK(render_text("{{ x is defined }} {{ y.z is defined }} {{ y is mapping }} {{ x | default('d') }} {{ none }}",
                    {{"y", nlohmann::ordered_json::object()}}) == "False False True d None");
  CHECK(render_text("{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}"
                    "{{ i }}{% endfor %}", none) == "02");
  CHECK(render_text("{{ strftime_now('%Y') }}", none) == "1970");
  // Python's % formatting (the format filter too), center, exponent literals, loop.cycle, with and filter
  // blocks, the comparison tests.
  CHECK(render_text("{{ '%s-%d' % ('a', 3) }}|{{ '%s!' | format('x') }}|{{ '%(n)s=%(v).2f' % {'n': 'pi', 'v': 3.14159} }}"
                    "|{{ '%5s|%-4d|%03d|%x|%r|%%' % ('ab', 7, 5, 255, 'q') }}", none) ==
        "a-3|x!|pi=3.14|   ab|7   |005|ff|'q'|%");
  CHECK(render_text("{{ '%.3s|%c' % ('abcdef', 'z') }}|{{ '%d' % 3.9 }}|{{ '%s' % none }}|{{ '%s %s' % (true, [1, 'a']) }}"
                    "|{{ '%+.1e' % 12345.678 }}|{{ '%g' % 0.0001 }}", none) ==
        "abc|z|3|None|True [1, 'a']|+1.2e+04|0.0001");
  CHECK(render_text("{{ 'x' | center(5) }}|{{ 'ab' | center(5) }}|{{ 'abc'.center(6) }}|{{ 1e3 }}|{{ 2.5e-2 }}|{{ 1E+2 }}",
                    none) == "  x  |  ab | abc  |1000.0|0.025|100.0");
  CHECK(render_text("{% for m in [1,2,3] %}{{ loop.cycle('A', 'B') }}{% endfor %}", none) == "ABA");
  CHECK(render_text("{% set a = 1 %}{% with a = 2, b = a %}{{ a }}{{ b }}{% set c = 5 %}{% endwith %}{{ a }}"
                    "{{ c is defined }}", none) == "211False");
  CHECK(render_text("{% filter upper | replace('B', 'b') %}ab{{ 'c' }}{% endfilter %}|{% filter center(7) %}mid"
                    "{% endfilter %}|", none) == "AbC|  mid  |");
  CHECK(render_text("{{ 3 is gt 2 }}{{ 2 is lessthan 1 }}{{ 2 is ge 2 }}{{ 'a' is le 'b' }}", none) == "TrueFalseTrueTrue");
  const std::string generation = "a{% generation %}bc{% endgeneration %}d";
  CHECK(jinja::render(*jinja::compile(generation, "t"), none, 0).generation ==
        std::vector<std::pair<size_t, size_t>>{{1, 3}});
  // Errors name the template, the line and the construct.
  auto compile_error = [](const std::string& source) { return error_of([&] { jinja::compile(source, "t.jinja"); }); };
  CHECK(compile_error("a\n{% include 'x' %}") ==
        "t.jinja line 2: unsupported construct '{% include %}' (chat templates here may use if, for, set, macro, "
        "with, filter, generation, break and continue)");
  CHECK(compile_error("{% if x %}\n\nopen") == "t.jinja line 1: '{% if %}' is never closed with '{% endif %}'");
  CHECK(compile_error("{{ x }\n") == "t.jinja line 1: a tag is never closed with }}");
  CHECK(compile_error("{% endfor %}") == "t.jinja line 1: '{% endfor %}' closes nothing");
  CHECK(error_of([&] { render_text("\n\n{{ raise_exception('No system role') }}", none); }) ==
        "t.jinja line 3: the template raised an exception: No system role");
  CHECK(error_of([&] { render_text("{{ 'a' + 1 }}", none); }) ==
        "t.jinja line 1: unsupported operand types for +: str and int");
  CHECK(error_of([&] { render_text("{{ x.y }}", none); }) == "t.jinja line 1: 'x' is undefined (looked up .y in it)");
  CHECK(error_of([&] { render_text("{{ range() }}", none); })
            .starts_with("t.jinja line 1: a filter, test or call got arguments it cannot take"));
  CHECK(compile_error("{{ '\\u12' }}") == "t.jinja line 1: a \\u escape needs 4 hex digits");
  CHECK(error_of([&] { render_text("{{ '%s %s' % ('a',) }}", none); }) ==
        "t.jinja line 1: not enough arguments for format string");
  CHECK(error_of([&] { render_text("{{ '%s' % ('a', 'b') }}", none); }) ==
        "t.jinja line 1: not all arguments converted during string formatting");
  CHECK(error_of([&] { render_text("{{ '%d' % 'x' }}", none); }) ==
        "t.jinja line 1: %d format: a real number is required, not str");
  CHECK(compile_error("\n{{ x | wordwrap(4) }}") == "t.jinja line 2: unsupported construct: filter 'wordwrap'");
  CHECK(compile_error("{{ x is frob }}") == "t.jinja line 1: no test named 'frob' (Jinja2 has none either)");
  CHECK(compile_error("{{ x if y else z | frob }}").empty());  // an if expression: left to the rendering, as Jinja2
  // Nesting past any real template's is refused rather than exhausting the stack.
  CHECK(compile_error("{{ " + std::string(200, '(') + "1" + std::string(200, ')') + " }}") ==
        "t.jinja line 1: statements or expressions nest deeper than 64");
  // A template that would recurse or allocate without end is an error, not a crash.
  CHECK(error_of([&] { render_text("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", none); }) ==
        "t.jinja line 1: macro f calls nest deeper than 64");
  CHECK(error_of([&] { render_text("{{ range(10000000000) | length }}", none); }) ==
        "t.jinja line 1: range() of more than 1048576 items");
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
  std::vector<nlohmann::json> cases;  // the conversations that end with the assistant: training rows
  for (const nlohmann::json& c : fixture["cases"])
    if (!c["add_generation_prompt"].get<bool>()) cases.push_back(c);
  for (const nlohmann::json& c : cases) rows.examples.push_back({"", "", messages_of(c["messages"]), 1});
  TokenizedDataset tokens = tokenize_dataset(rows, tokenizer, 512, /*eos_id=*/4, &chat);
  REQUIRE(tokens.examples.size() == cases.size());
  int64_t expected_loss = 0, longer_than_61 = 0;
  for (size_t i = 0; i < tokens.examples.size(); i++) {
    longer_than_61 += cases[i]["ids"].size() > 61;
    // The template places every special token: no bos or eos is added around it.
    CHECK(tokens.examples[i].tokens == cases[i]["ids"].get<std::vector<int32_t>>());
    for (int bit : cases[i]["mask"].get<std::vector<int>>()) expected_loss += bit;
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
  // A rendered "text" kept beside "messages" is an extra field, as trl reads the row.
  const Dataset with_text = load_string("{\"messages\": [{\"role\": \"assistant\", \"content\": \"a\"}], \"text\": \"b\"}");
  CHECK(with_text.format == DataFormat::chat);
  CHECK(with_text.examples[0].messages.size() == 1);
  CHECK(load_error("{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"messages\": [{\"role\": \"assistant\", \"content\": "
                   "\"a\"}]}") == "chat.jsonl:2: a chat row, but line 1 is a prompt_completion row and all rows must agree");

  // Llama-2's template takes alternating user/assistant turns only: found when rendering, named by line.
  Dataset data = load_string("\n\n{\"messages\": [{\"role\": \"assistant\", \"content\": \"a\"}]}");
  const ChatTemplate llama2 = resolve_chat_template(ChatTemplateKind::automatic, kChatDir + "/llama2");
  BpeTokenizer tokenizer(std::string(FT_FIXTURES_DIR) + "/tokenizers/llama2/tokenizer.json");
  CHECK(error_of([&] { tokenize_dataset(data, tokenizer, 64, 2, &llama2); }) ==
        "chat.jsonl:3: " + kChatDir + "/llama2/tokenizer_config.json: chat_template line 1: the template raised an "
        "exception: Conversation roles must alternate user/assistant/user/assistant/...");
  CHECK(error_of([&] { tokenize_dataset(data, tokenizer, 64, 2); }) == "chat.jsonl: chat rows need a chat template");

  // A template that rewrites the reply (upper case) under a header that moves with the message count: its
  // assistant text cannot be found to train alone, but assistant_only_loss: false trains every token anyway.
  const std::filesystem::path dir = std::filesystem::path(FT_BINARY_DIR) / "test_chat_rewrites_reply";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer_config.json")
      << nlohmann::json{{"chat_template", "{{ messages | length }}\n{% for m in messages %}{{ m.role }}: "
                                          "{{ m.content | upper if m.role == 'assistant' else m.content }}\n"
                                          "{% endfor %}"}}.dump();
  const ChatTemplate rewrites = resolve_chat_template(ChatTemplateKind::automatic, dir.string());
  Dataset row = load_string("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
                            "\"content\": \"hello\"}]}");
  CHECK(error_of([&] { tokenize_dataset(row, tokenizer, 64, 2, &rewrites); }) ==
        "chat.jsonl:1: messages[1] (assistant): its content is not in the text " + (dir / "tokenizer_config.json").string() +
            " renders, so its tokens cannot be found to train on (data.assistant_only_loss: false trains every token)");
  const TokenizedDataset whole = tokenize_dataset(row, tokenizer, 64, 2, &rewrites, RowLayout::causal, Packing{},
                                                  LossScope{.completion_only = true, .assistant_only = false});
  REQUIRE(whole.examples.size() == 1);
  CHECK(whole.examples[0].tokens == tokenizer.encode("2\nuser: hi\nassistant: HELLO\n"));
  // Every token trains but the first, which no position predicts.
  CHECK(whole.loss_token_count == int64_t(whole.examples[0].tokens.size()) - 1);
}

TEST_CASE("chat rows with content as a list of text parts train and prompt as apply_chat_template renders them") {
  // Gemma 3's template takes a system message only as parts ({"type": "text", "text": ...}); the fixture's
  // parts conversations (scripts/make_chat_fixture.py) as JSONL rows, through load_jsonl and tokenize_dataset.
  const std::string dir = kChatDir + "/gemma3";
  const nlohmann::ordered_json fixture = nlohmann::ordered_json::parse(std::ifstream(dir + "/cases.json"));
  BpeTokenizer tokenizer(std::string(FT_FIXTURES_DIR) + "/" + fixture["tokenizer"].get<std::string>() + "/tokenizer.json");
  ChatTemplate chat = resolve_chat_template(ChatTemplateKind::automatic, dir);
  chat.now = fixture_now(fixture["date"]);
  int trained = 0, asked = 0;
  for (const nlohmann::ordered_json& c : fixture["cases"]) {
    if (!c["messages"][0]["content"].is_array()) continue;
    const nlohmann::ordered_json row = {{"messages", c["messages"]}};
    if (c["add_generation_prompt"].get<bool>()) {  // a prompt, as generate --chat --file reads it
      const nlohmann::ordered_json conversation = written_conversation(row, "q.jsonl:1", true);
      const std::string prompt = reply_prompt(chat, conversation["messages"], nullptr, "q.jsonl:1");
      CHECK(prompt == c["text"].get<std::string>());
      CHECK(prompt_tokens(tokenizer, prompt, PromptForm::chat) == c["ids"].get<std::vector<int32_t>>());
      asked++;
      continue;
    }
    Dataset data = load_string(row.dump() + "\n");
    REQUIRE(data.examples.size() == 1);
    CHECK(data.examples[0].messages.back().content == message_text(c["messages"].back()));
    const TokenizedDataset tokens = tokenize_dataset(data, tokenizer, 4096, /*eos_id=*/0, &chat);
    REQUIRE(tokens.examples.size() == 1);
    CHECK(tokens.examples[0].tokens == c["ids"].get<std::vector<int32_t>>());
    const std::vector<uint8_t>& mask = tokens.examples[0].loss_mask;
    CHECK(std::vector<int>(mask.begin(), mask.end()) == c["mask"].get<std::vector<int>>());
    trained++;
  }
  CHECK(trained == 1);
  CHECK(asked == 1);
  // Per-row template arguments (trl passes them to the template) are refused, not dropped in silence.
  CHECK(load_error(R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}],)"
                   R"( "chat_template_kwargs": {"enable_thinking": false}})" "\n") ==
        "chat.jsonl:1: \"chat_template_kwargs\": trl passes them to the chat template, which is not done here (the "
        "row would render otherwise than trl renders it); remove the field");
  // Nesting past Python's recursion limit is refused (the template's tojson would recurse through it).
  const std::string deep = std::string(1001, '[') + std::string(1001, ']');
  CHECK(load_error(R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}],)"
                   R"( "tools": [{"parameters": )" + deep + "}]}\n") ==
        "chat.jsonl:1: the row nests lists and objects more than 1000 levels deep (Python's json and Jinja2 stop at "
        "their recursion limit)");
  CHECK(load_error(R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}],)"
                   R"( "tools": "[{\"name\": "})" "\n") ==
        "chat.jsonl:1: \"tools\" is a string that is not JSON (expected a list of tool schemas, or that list written "
        "as a JSON string)");
  // Only text parts are read: an image part, or a part that is not a typed object, is one error naming it.
  CHECK(load_error(R"({"messages": [{"role": "user", "content": [{"type": "image", "url": "a.png"}]},)"
                   R"( {"role": "assistant", "content": "A cat."}]})" "\n") ==
        "chat.jsonl:1: messages[0].content[0] is a part of type \"image\": only text parts are read (this trainer trains "
        "language models on text)");
  CHECK(load_error(R"({"messages": [{"role": "user", "content": ["Hi"]}, {"role": "assistant", "content": "Hello"}]})"
                   "\n") ==
        "chat.jsonl:1: messages[0].content[0] must be a {\"type\": \"text\", \"text\": ...} object, got \"Hi\"");
}

TEST_CASE("chat rows with tools, tool calls and tool results train as apply_chat_template(messages, tools=...) masks them") {
  // The fixtures' tool conversations (a call, its result, the answer) as JSONL data rows, through load_jsonl and
  // tokenize_dataset: the text, ids and assistant mask transformers gives (scripts/make_chat_fixture.py), for every
  // family whose template takes tools. The row's key order is kept: templates write schemas with tojson.
  int64_t rows = 0, prefixes = 0;
  for (const std::filesystem::directory_entry& entry : std::filesystem::directory_iterator(kChatDir)) {
    if (!std::filesystem::exists(entry.path() / "cases.json")) continue;
    std::ifstream file(entry.path() / "cases.json");
    const nlohmann::ordered_json fixture = nlohmann::ordered_json::parse(file);
    const std::string family = entry.path().filename().string();
    CAPTURE(family);
    for (const nlohmann::ordered_json& c : fixture["cases"]) {
      if (!c.contains("tools") || c["add_generation_prompt"].get<bool>() || c.contains("error")) continue;
      nlohmann::ordered_json row = {{"messages", c["messages"]}, {"tools", c["tools"]}};
      Dataset data = load_string(row.dump() + "\n");
      CHECK(data.format == DataFormat::chat);
      REQUIRE(data.examples.size() == 1);
      BpeTokenizer tokenizer(std::string(FT_FIXTURES_DIR) + "/" + fixture["tokenizer"].get<std::string>() +
                             "/tokenizer.json");
      ChatTemplate chat = resolve_chat_template(ChatTemplateKind::automatic, entry.path().string());
      chat.now = fixture_now(fixture["date"]);
      const TokenizedDataset tokens = tokenize_dataset(data, tokenizer, 4096, /*eos_id=*/0, &chat);
      REQUIRE(tokens.examples.size() == 1);
      CHECK(tokens.examples[0].tokens == c["ids"].get<std::vector<int32_t>>());
      const std::vector<uint8_t>& mask = tokens.examples[0].loss_mask;
      CHECK(std::vector<int>(mask.begin(), mask.end()) == c["mask"].get<std::vector<int>>());
      // The tools written as a JSON string (datasets store mixed schemas so): trl json.loads them.
      nlohmann::ordered_json as_string = row;
      as_string["tools"] = c["tools"].dump();
      const TokenizedDataset from_string = tokenize_dataset(load_string(as_string.dump() + "\n"), tokenizer, 4096, 0, &chat);
      REQUIRE(from_string.examples.size() == 1);
      CHECK(from_string.examples[0].tokens == tokens.examples[0].tokens);
      // The sample prompt: the conversation up to the tool's result, with the tools, ready for the reply.
      set_chat_prompts(data, chat);
      const std::string answer = c["messages"].back()["content"];
      CHECK(data.examples[0].completion == answer);
      CHECK(data.examples[0].prompt.find("celsius") != std::string::npos);  // the result (some templates quote it)
      CHECK(data.examples[0].prompt.find(answer) == std::string::npos);
      // The same conversation without its answer, as generate --chat --file reads it: what transformers renders
      // before the answer.
      nlohmann::ordered_json question = row;
      question["messages"].erase(question["messages"].end() - 1);
      const nlohmann::ordered_json asked = written_conversation(question, "q.jsonl:1", true);
      const std::string prompt = reply_prompt(chat, asked["messages"], asked["tools"], "q.jsonl:1");
      const std::string text = c["text"].get<std::string>();
      prefixes += text.starts_with(prompt) && text.find(answer, prompt.size()) != std::string::npos;
      rows++;
    }
  }
  CHECK(rows == 9);
  CHECK(prefixes == 9);
  // A template that never mentions tools (every built-in one) would drop them: refused, naming it.
  for (ChatTemplateKind kind : {ChatTemplateKind::chatml, ChatTemplateKind::llama3}) {
    ChatTemplate built_in = resolve_chat_template(kind, std::string(FT_FIXTURES_DIR) + "/tokenizer");
    Dataset data = load_string("{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], "
                               "\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", "
                               "\"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": {}}}]}]}\n");
    CHECK_THROWS_WITH_AS(tokenize_dataset(data, BpeTokenizer(std::string(FT_FIXTURES_DIR) + "/bpe_tokenizer/tokenizer.json"),
                                          4096, 0, &built_in),
                         ("chat.jsonl:1: the conversation has tools, tool calls or tool results, and the built-in " +
                          std::string(enum_name(kind)) + " chat template never mentions tools (it would drop them); use a "
                          "template that renders them, such as a tool-calling checkpoint's own (its "
                          "tokenizer_config.json)")
                             .c_str(),
                         Error);
  }
  // Tool rows are checked as rows: each error names the line and the message.
  const std::string call = "{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": {}}}]}";
  const std::string result = "{\"role\": \"tool\", \"content\": \"1\"}", answer = "{\"role\": \"assistant\", \"content\": \"a\"}";
  CHECK(load_string("{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, " + call + ", " + result + ", " + answer +
                    "]}").examples[0].messages.size() == 4);
  CHECK(load_error("{\"messages\": [{\"role\": \"user\", \"content\": \"q\", \"tool_calls\": []}, " + answer + "]}") ==
        "chat.jsonl:1: messages[0].tool_calls: only an assistant message calls tools");
  CHECK(load_error("{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"tool_calls\": "
                   "[{\"function\": {\"name\": \"f\"}}]}, " + answer + "]}") ==
        "chat.jsonl:1: messages[1].tool_calls[0].function.arguments must be an object (or its JSON text)");
  CHECK(load_error("{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, " + call + ", {\"role\": \"tool\"}, " +
                   answer + "]}") ==
        "chat.jsonl:1: messages[2] lacks \"content\" (only an assistant message with tool_calls may leave it out)");
  CHECK(load_error("{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, " + call + "], \"tools\": {}}") ==
        "chat.jsonl:1: \"tools\": expected a JSON list of tool schemas (objects), got {}");
  CHECK(load_error("{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, " + call + ", " + result + "]}") ==
        "chat.jsonl:1: the last message is the tool's (expected an assistant turn to train on)");
  CHECK(load_error("{\"messages\": [{\"role\": \"robot\", \"content\": \"q\"}, " + call + "]}") ==
        "chat.jsonl:1: messages[0].role is \"robot\" (expected system, user, assistant or tool)");
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
  // apply_chat_template's text less the last " answer </s>" (its leading "<s>" kept: the template writes it).
  CHECK(data.examples[0].prompt == text.substr(0, text.rfind(" " + last + " </s>")));
  CHECK(data.examples[0].completion == last);
}

TEST_CASE("chat rows whose reply follows a system message, another reply or nothing train, as trl trains them") {
  // trl's SFTTrainer prepares each of these rows (Qwen2.5's released template); the sample and ROUGE prompt
  // is the conversation before the reply as apply_chat_template(add_generation_prompt=True) renders it, and
  // none for a reply with nothing before it.
  const nlohmann::json fixture = read_json(kChatDir + "/qwen2_5/cases.json");
  BpeTokenizer tokenizer(std::string(FT_FIXTURES_DIR) + "/" + fixture["tokenizer"].get<std::string>() +
                         "/tokenizer.json");
  const ChatTemplate chat = resolve_chat_template(ChatTemplateKind::automatic, kChatDir + "/qwen2_5");
  const auto message = [](const char* role, const char* content) {
    return std::string("{\"role\": \"") + role + "\", \"content\": \"" + content + "\"}";
  };
  const std::string user = message("user", "Hi"), system = message("system", "Be brief.");
  const std::string reply = message("assistant", "Hello"), again = message("assistant", "Again");
  Dataset data = load_string("{\"messages\": [" + user + ", " + system + ", " + reply + "]}\n" +
                             "{\"messages\": [" + user + ", " + reply + ", " + again + "]}\n" +
                             "{\"messages\": [" + system + ", " + reply + "]}\n" +
                             "{\"messages\": [" + reply + "]}\n" +
                             "{\"prompt\": [" + user + ", " + system + "], \"completion\": [" + reply + "]}\n");
  REQUIRE(data.examples.size() == 5);
  const TokenizedDataset tokens = tokenize_dataset(data, tokenizer, 4096, /*eos_id=*/-1, &chat);
  REQUIRE(tokens.examples.size() == 5);
  set_chat_prompts(data, chat);
  for (size_t i = 0; i < 5; ++i) {
    CAPTURE(i);
    const TokenSequence& row = tokens.examples[i];
    std::vector<int32_t> trained;
    for (size_t t = 0; t < row.tokens.size(); ++t)
      if (row.loss_mask[t]) trained.push_back(row.tokens[t]);
    // The last reply trains (decode drops the template's <|im_end|>), and every assistant turn before it.
    const std::string last = data.examples[i].completion;
    CHECK(tokenizer.decode(trained).starts_with(i == 1 ? "HelloAgain" : "Hello"));
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    for (const ChatMessage& m : data.examples[i].messages) messages.push_back({{"role", m.role}, {"content", m.content}});
    const std::string whole = render_chat_text(chat, messages, nullptr, false, "chat.jsonl");
    const std::string& prompt = data.examples[i].prompt;
    if (i == 3) {
      CHECK(prompt.empty());
      continue;
    }
    CHECK(prompt.ends_with("<|im_start|>assistant\n"));
    CHECK(whole.starts_with(prompt + last + "<|im_end|>"));
  }
}
