#include "trainer/data/data.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/error.h"
#include "kernels/input_file.h"
#include "model/json_input.h"
#include "model/lora_pattern.h"
#include "tokenizer/tokenizer.h"

namespace ft {
namespace {

bool is_blank(const std::string& line) {
  return std::all_of(line.begin(), line.end(), [](char ch) { return std::isspace((unsigned char)ch); });
}

// Which kind of row this is, from the fields it has.
// A row holding the keys of several formats is read as trl's SFTTrainer
// reads it: prompt/completion, else messages, else (Alpaca's instruction and
// output, then) text; the others are extra fields (a rendered "text" column
// kept beside "messages" is common).
DataFormat row_format(const nlohmann::json& row, const std::string& where) {
  const bool pair = row.contains("prompt") || row.contains("completion");
  const bool chat = !pair && row.contains("messages");
  const bool alpaca = !pair && !chat && (row.contains("instruction") || row.contains("output"));
  const bool text = !pair && !chat && !alpaca && row.contains("text");
  FT_CHECK(pair || text || chat || alpaca, where,
           ": expected \"prompt\" and \"completion\" strings, a \"text\" string, a \"messages\" list or "
           "\"instruction\" and \"output\" strings, got ",
           key_list(row),
           row.contains("conversations") ? " (ShareGPT rows: write \"conversations\" as \"messages\" of {\"role\", "
                                           "\"content\"}, from human -> user, gpt -> assistant, value -> content)"
                                         : "");
  if (chat || (row.contains("prompt") && row["prompt"].is_array())) return DataFormat::chat;  // trl's conversational
  if (alpaca) return DataFormat::alpaca;
  return pair ? DataFormat::prompt_completion : DataFormat::text;
}

}  // namespace

bool holds_chat_rows(const std::string& path, DataFormat format) {
  if (format != DataFormat::automatic && format != DataFormat::prompt_completion) return format == DataFormat::chat;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line) && is_blank(line)) {
  }
  const nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
  auto listed = [&](const char* key) { return row.contains(key) && row[key].is_array(); };
  const bool pair = row.is_object() && (row.contains("prompt") || row.contains("completion"));
  return row.is_object() && ((!pair && row.contains("messages")) || listed("prompt") || listed("chosen"));
}

std::vector<ChatMessage> chat_messages(const nlohmann::json& row, const std::string& where) {
  const nlohmann::json& list = row["messages"];
  FT_CHECK(list.is_array(), where, ": \"messages\" must be a list of {\"role\", \"content\"} objects, got ",
           list.type_name());
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < list.size(); i++) {
    const std::string item = where + ": messages[" + std::to_string(i) + "]";
    FT_CHECK(list[i].is_object(), item, " must be a {\"role\", \"content\"} object, got ", list[i].type_name());
    for (const char* key : {"role", "content"}) {
      FT_CHECK(list[i].contains(key), item, " lacks \"", key, "\"");
      FT_CHECK(list[i][key].is_string(), item, ".", key, " must be a string, got ", list[i][key].type_name());
    }
    messages.push_back({list[i]["role"].get<std::string>(), list[i]["content"].get<std::string>()});
  }
  return messages;
}

bool kept_as_written(const nlohmann::json& row) {
  if (row.contains("tools")) return true;
  const nlohmann::json& list = row["messages"];
  return list.is_array() && std::any_of(list.begin(), list.end(), [](const nlohmann::json& m) {
           return m.is_object() && (m.contains("tool_calls") || m.value("role", nlohmann::json()) == "tool" ||
                                    (m.contains("content") && m["content"].is_array()));
         });
}

namespace {

// An assistant message's "tool_calls": {"function": {"name", "arguments"}} objects, as transformers reads them.
void check_tool_calls(const nlohmann::ordered_json& calls, const std::string& item) {
  FT_CHECK(calls.is_array() && !calls.empty(), item, ".tool_calls must be a non-empty list, got ", calls.dump());
  for (size_t j = 0; j < calls.size(); j++) {
    const std::string call = item + ".tool_calls[" + std::to_string(j) + "]";
    const nlohmann::ordered_json& function = calls[j].is_object() ? calls[j].value("function", nlohmann::ordered_json())
                                                                  : nlohmann::ordered_json();
    FT_CHECK(function.is_object(), call, " must be an object with a \"function\" object, got ", calls[j].dump());
    FT_CHECK(function.contains("name") && function["name"].is_string(), call, ".function.name must be a string");
    FT_CHECK(function.contains("arguments") && (function["arguments"].is_object() || function["arguments"].is_string()),
             call, ".function.arguments must be an object (or its JSON text)");
  }
}

// A message's content given as a list of parts (transformers' multimodal
// layout, which Gemma 3's template needs for a system message): text parts
// only, {"type": "text", "text": ...}.
void check_content_parts(const nlohmann::ordered_json& parts, const std::string& item) {
  for (size_t j = 0; j < parts.size(); j++) {
    const std::string part = item + ".content[" + std::to_string(j) + "]";
    const nlohmann::ordered_json& p = parts[j];
    FT_CHECK(p.is_object() && p.contains("type") && p["type"].is_string(), part,
             " must be a {\"type\": \"text\", \"text\": ...} object, got ", p.dump().substr(0, 80));
    FT_CHECK(p["type"] == "text", part, " is a part of type \"", p["type"].get<std::string>(),
             "\": only text parts are read (this trainer trains language models on text)");
    FT_CHECK(p.contains("text") && p["text"].is_string(), part, ".text must be a string");
  }
}

// Python's json and Jinja2 stop at its recursion limit (1000); the template's
// tojson here recurses too, so a deeper row is refused rather than crash it.
constexpr size_t kMaxJsonDepth = 1000;

size_t json_depth(const nlohmann::ordered_json& value) {
  size_t deepest = 0;
  std::vector<std::pair<const nlohmann::ordered_json*, size_t>> pending = {{&value, 1}};
  while (!pending.empty()) {
    const auto [node, depth] = pending.back();
    pending.pop_back();
    deepest = std::max(deepest, depth);
    if (node->is_structured())
      for (const nlohmann::ordered_json& child : *node) pending.push_back({&child, depth + 1});
  }
  return deepest;
}

// A chat row kept as written: no deeper than kMaxJsonDepth, system, user,
// assistant and tool messages, each with "content" text or a list of text
// parts (an assistant message with tool_calls may have none), ending with an
// assistant turn to train on (to_reply: with a user message or a tool's result
// to reply to). Its "tools" are row_tools'.
void check_written_conversation(const nlohmann::ordered_json& row, const std::string& where, bool to_reply) {
  FT_CHECK(json_depth(row) <= kMaxJsonDepth, where, ": the row nests lists and objects more than ", kMaxJsonDepth,
           " levels deep (Python's json and Jinja2 stop at their recursion limit)");
  const nlohmann::ordered_json& list = row["messages"];
  FT_CHECK(list.is_array() && !list.empty(), where, ": \"messages\" must be a non-empty list, got ", list.dump());
  for (size_t i = 0; i < list.size(); i++) {
    const std::string item = where + ": messages[" + std::to_string(i) + "]";
    const nlohmann::ordered_json& m = list[i];
    FT_CHECK(m.is_object() && m.contains("role") && m["role"].is_string(), item,
             " must be an object with a \"role\" string, got ", m.dump());
    const std::string role = m["role"];
    FT_CHECK(role == "system" || role == "user" || role == "assistant" || role == "tool", item, ".role is \"", role,
             "\" (expected system, user, assistant or tool)");
    const bool calls = m.contains("tool_calls");
    FT_CHECK(!calls || role == "assistant", item, ".tool_calls: only an assistant message calls tools");
    if (calls) check_tool_calls(m["tool_calls"], item);
    if (m.contains("content") && m["content"].is_array()) check_content_parts(m["content"], item);
    else if (m.contains("content") && !m["content"].is_null())
      FT_CHECK(m["content"].is_string(), item, ".content must be a string or a list of text parts, got ",
               m["content"].type_name());
    else FT_CHECK(calls, item, " lacks \"content\" (only an assistant message with tool_calls may leave it out)");
  }
  const std::string last = list.back()["role"];
  if (to_reply)
    FT_CHECK(last == "user" || last == "tool", where, ": the last message is the ", last,
             "'s (expected a user message or a tool's result to reply to)");
  else FT_CHECK(last == "assistant", where, ": the last message is the ", last, "'s (expected an assistant turn to train on)");
}

}  // namespace

void check_tool_schemas(const nlohmann::ordered_json& tools, const std::string& what) {
  FT_CHECK(tools.is_array() && std::all_of(tools.begin(), tools.end(), [](const auto& t) { return t.is_object(); }),
           what, ": expected a JSON list of tool schemas (objects), got ", tools.dump().substr(0, 80));
}

nlohmann::ordered_json row_tools(const nlohmann::ordered_json& row, const std::string& where) {
  if (!row.contains("tools") || row["tools"].is_null()) return nullptr;
  nlohmann::ordered_json tools = row["tools"];
  if (tools.is_string()) {  // trl json.loads it
    tools = nlohmann::ordered_json::parse(tools.get<std::string>(), nullptr, false);
    FT_CHECK(!tools.is_discarded(), where, ": \"tools\" is a string that is not JSON (expected a list of tool "
             "schemas, or that list written as a JSON string)");
  }
  check_tool_schemas(tools, where + ": \"tools\"");
  return tools;
}

nlohmann::ordered_json written_conversation(const nlohmann::ordered_json& row, const std::string& where,
                                            bool to_reply) {
  check_written_conversation(row, where, to_reply);
  return {{"messages", row["messages"]}, {"tools", row_tools(row, where)}};
}

nlohmann::ordered_json prompt_and_reply(const nlohmann::ordered_json& prompt, const nlohmann::ordered_json& reply,
                                        const nlohmann::ordered_json& tools) {
  nlohmann::ordered_json messages = prompt;
  for (const nlohmann::ordered_json& m : reply) messages.push_back(m);
  nlohmann::ordered_json conversation = {{"messages", messages}, {"prompt_messages", prompt.size()}};
  if (!tools.is_null()) conversation["tools"] = tools;
  return conversation;
}

namespace {

// A chat row kept as written (kept_as_written; parsed with its key order kept).
Example read_written_example(const nlohmann::ordered_json& row, const std::string& where) {
  Example example;
  example.conversation = written_conversation(row, where, false);
  for (const nlohmann::ordered_json& m : example.conversation["messages"])
    example.messages.push_back({m["role"].get<std::string>(), message_text(m)});
  return example;
}

// trl's conversational prompt/completion row: {"prompt": [messages], "completion": [messages]}
// (and "tools"), kept as written with the prompt's message count.
Example read_prompt_completion_conversation(const std::string& line, const std::string& where) {
  const nlohmann::ordered_json row = nlohmann::ordered_json::parse(line);
  FT_CHECK(row.contains("completion") && row["completion"].is_array() && !row["completion"].empty(), where,
           ": a conversational row's \"prompt\" is a list of messages, so \"completion\" must be a non-empty list of "
           "them too (trl's conversational prompt/completion), got ", row.value("completion", nlohmann::ordered_json()).dump().substr(0, 60));
  FT_CHECK(!row["prompt"].empty(), where, ": \"prompt\" is an empty list (expected the messages before the completion)");
  Example example = read_written_example(
      prompt_and_reply(row["prompt"], row["completion"], row_tools(row, where)), where);
  example.conversation["prompt_messages"] = row["prompt"].size();
  return example;
}

Example read_example(const nlohmann::json& row, DataFormat kind, const std::string& where) {
  switch (kind) {
    case DataFormat::text:
      return {"", string_field(row, "text", where)};
    case DataFormat::chat:
      {
        std::vector<ChatMessage> messages = chat_messages(row, where);
        check_chat_roles(messages, where);
        return {"", "", std::move(messages)};
      }
    case DataFormat::alpaca: {
      std::string input = row.contains("input") ? string_field(row, "input", where) : "";
      return {alpaca_prompt(string_field(row, "instruction", where), input), string_field(row, "output", where)};
    }
    default:
      FT_CHECK(row.contains("completion") || !row.contains("chosen"), where, ": a preference pair (\"chosen\", "
               "\"rejected\"), and objective: sft trains on a \"completion\": set objective: dpo (or reward) to "
               "train on pairs");
      return {string_field(row, "prompt", where), string_field(row, "completion", where)};
  }
}

// Reads the next line of input (without its '\n') into line; false once the
// input is exhausted. Stops with an Error as soon as a line passes
// kMaxJsonlLineBytes, so a file without newlines is never held whole.
bool read_line(std::istream& input, std::string& line, const std::string& path, int64_t line_number) {
  line.clear();
  std::streambuf* buffer = input.rdbuf();
  for (int ch = buffer->sbumpc(); ch != '\n'; ch = buffer->sbumpc()) {
    if (ch == std::char_traits<char>::eof()) return !line.empty();
    FT_CHECK(line.size() < kMaxJsonlLineBytes, path, ":", line_number, ": line is longer than the limit of ",
             kMaxJsonlLineBytes, " bytes (expected one JSON object a line)");
    line.push_back(char(ch));
  }
  return true;
}

// Refuses what is not JSONL before the parser does, saying what it is: a
// UTF-16 file, a JSON list, a pretty-printed object.
void check_jsonl_line(const std::string& line, const std::string& where, int64_t line_number) {
  FT_CHECK(line_number > 1 || !(line.starts_with("\xFF\xFE") || line.starts_with("\xFE\xFF")), where,
           ": the file is UTF-16 (it starts with UTF-16's byte order mark); save it as UTF-8");
  const size_t first = line.find_first_not_of(" \t\r");
  const size_t last = line.find_last_not_of(" \t\r");
  const bool list = first != std::string::npos && line[first] == '[';
  const bool opening = first != std::string::npos && first == last && line[first] == '{';
  FT_CHECK(!list && !opening, where, ": a JSONL file holds one JSON object a line, and this line ",
           list ? "starts a JSON list" : "opens an object over several lines (pretty-printed JSON)",
           ": write each row as one line (Python: for row in rows: print(json.dumps(row)))");
}

}  // namespace

std::string key_list(const nlohmann::json& row) {
  std::string keys;
  for (const auto& item : row.items()) keys += (keys.empty() ? "\"" : ", \"") + item.key() + "\"";
  return keys.empty() ? "no keys" : "keys " + keys;
}

std::string string_field(const nlohmann::json& row, const char* key, const std::string& where) {
  FT_CHECK(row.contains(key), where, ": row lacks \"", key, "\"");
  const nlohmann::json& value = row[key];
  FT_CHECK(value.is_string(), where, ": \"", key, "\" must be a string, got ", value.type_name());
  return value.get<std::string>();
}

EnumNames<Packing> enum_names(Packing) {
  static const EnumName<Packing> names[] = {
      {"none", Packing::none}, {"padding_free", Packing::padding_free}, {"concatenate", Packing::concatenate}};
  return names;
}

EnumNames<DataFormat> enum_names(DataFormat) {
  static const EnumName<DataFormat> names[] = {{"auto", DataFormat::automatic},
                                               {"prompt_completion", DataFormat::prompt_completion},
                                               {"text", DataFormat::text},
                                               {"chat", DataFormat::chat},
                                               {"alpaca", DataFormat::alpaca}};
  return names;
}

std::string alpaca_prompt(const std::string& instruction, const std::string& input) {
  if (input.empty())
    return "Below is an instruction that describes a task. Write a response that appropriately completes the "
           "request.\n\n### Instruction:\n" +
           instruction + "\n\n### Response:";
  return "Below is an instruction that describes a task, paired with an input that provides further context. Write a "
         "response that appropriately completes the request.\n\n### Instruction:\n" +
         instruction + "\n\n### Input:\n" + input + "\n\n### Response:";
}

std::string file_extension(const std::string& path) {
  return ascii_lowercase(std::filesystem::path(path).extension().string());
}

Dataset load_jsonl(const std::string& path, DataFormat format) {
  const std::string extension = file_extension(path);
  FT_CHECK(extension != ".parquet" && extension != ".arrow", path, ": a ", extension.substr(1), " file; data files "
           "are JSONL, one JSON object a line (datasets writes one with Dataset.to_json(path, lines=True))");
  FT_CHECK(extension != ".csv", path, ": a CSV file, which data.template.prompt and .completion read (their "
           "{column} names); without them data files are JSONL, one JSON object a line");
  std::ifstream file = open_input_file(path, "data file");
  return load_jsonl(file, path, format);
}

namespace {

// trl passes a row's chat_template_kwargs to the chat template (enable_thinking:
// false renders Qwen3's and SmolLM3's no-think prompt); they are not passed
// here, so such a row is refused rather than rendered otherwise in silence.
void check_no_template_kwargs(const nlohmann::json& row, const std::string& where) {
  FT_CHECK(!row.contains("chat_template_kwargs"), where, ": \"chat_template_kwargs\": trl passes them to the chat "
           "template, which is not done here (the row would render otherwise than trl renders it); remove the field");
}

}  // namespace

Dataset load_jsonl(std::istream& input, const std::string& path, DataFormat format) {
  Dataset data{path, format, {}};
  int64_t first_line = 0;  // the row that decided the format when format is auto
  std::string line;
  for (int64_t line_number = 1; read_line(input, line, path, line_number); line_number++) {
    if (is_blank(line)) continue;
    std::string where = path + ":" + std::to_string(line_number);
    check_jsonl_line(line, where, line_number);
    nlohmann::json row = parse_json(line, where);
    FT_CHECK(row.is_object(), where, ": expected a JSON object, got ", row.type_name());
    check_no_template_kwargs(row, where);
    DataFormat kind = row_format(row, where);
    if (data.format == DataFormat::automatic) data.format = kind, first_line = line_number;
    FT_CHECK(kind == data.format, where, ": a ", enum_name(kind), " row, but ",
             first_line ? "line " + std::to_string(first_line) + " is a " + enum_name(data.format) +
                              " row and all rows must agree"
                        : std::string("data.format is ") + enum_name(data.format));
    if (kind == DataFormat::chat && row.contains("prompt")) data.examples.push_back(read_prompt_completion_conversation(line, where));
    else if (kind == DataFormat::chat && kept_as_written(row)) data.examples.push_back(read_written_example(nlohmann::ordered_json::parse(line), where));
    else data.examples.push_back(read_example(row, kind, where));
    data.examples.back().line = line_number;
  }
  FT_CHECK(!data.examples.empty(), path, ": the dataset is empty (no JSON rows)");
  return data;
}

void read_jsonl_rows(const std::string& path, const char* file_kind, const std::string& expected,
                     const std::function<void(const nlohmann::json& row, const std::string& where)>& on_row) {
  read_jsonl_lines(path, file_kind, expected,
                   [&](const std::string&, const nlohmann::json& row, const std::string& where) { on_row(row, where); });
}

void read_jsonl_lines(const std::string& path, const char* file_kind, const std::string& expected,
                      const std::function<void(const std::string& line, const nlohmann::json& row,
                                               const std::string& where)>& on_row) {
  std::ifstream input = open_input_file(path, file_kind);
  std::string line;
  int64_t rows = 0;
  for (int64_t line_number = 1; read_line(input, line, path, line_number); line_number++) {
    if (is_blank(line)) continue;
    const std::string where = path + ":" + std::to_string(line_number);
    check_jsonl_line(line, where, line_number);
    nlohmann::json row = parse_json(line, where);
    FT_CHECK(row.is_object(), where, ": expected a JSON object with ", expected, ", got ", row.type_name());
    check_no_template_kwargs(row, where);
    on_row(line, row, where);
    rows++;
  }
  FT_CHECK(rows > 0, path, ": no rows (expected JSON rows with ", expected, ")");
}

std::vector<std::string> load_prompts(const std::string& path) {
  std::vector<std::string> prompts;
  read_jsonl_rows(path, "prompts file", "a \"prompt\" string", [&](const nlohmann::json& row, const std::string& where) {
    FT_CHECK(row.contains("prompt"), where, ": expected a \"prompt\" string, got ", key_list(row));
    prompts.push_back(string_field(row, "prompt", where));
  });
  return prompts;
}

namespace {

// Cuts seq to seq_len + 1 tokens (inputs and targets of seq_len positions);
// true when it was longer.
bool truncate_to(TokenSequence& seq, int64_t seq_len) {
  if (int64_t(seq.tokens.size()) <= seq_len + 1) return false;
  seq.tokens.resize(size_t(seq_len + 1));
  seq.loss_mask.resize(size_t(seq_len + 1));
  return true;
}

// The tokens of `whole` (the encoding of the full text) that end before byte
// `boundary`, judged from the encoding of the text up to it (the tokens the
// two share), and whether one more token straddles the boundary.
struct TokenSplit {
  size_t before;
  bool straddles;
};
TokenSplit split_tokens(const std::string& text, size_t boundary, const std::vector<int32_t>& whole,
                        const Tokenizer& tokenizer) {
  std::vector<int32_t> prefix = tokenizer.encode(text.substr(0, boundary));
  const size_t shared = common_prefix_length(prefix, whole);
  return {shared, shared < prefix.size()};
}

}  // namespace

size_t common_prefix_length(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t shared = 0;
  while (shared < a.size() && shared < b.size() && a[shared] == b[shared]) shared++;
  return shared;
}

std::vector<int32_t> text_tokens(const Tokenizer& tokenizer, const std::string& text) {
  std::vector<int32_t> tokens;
  if (tokenizer.bos_id() >= 0) tokens.push_back(tokenizer.bos_id());
  std::vector<int32_t> encoded = tokenizer.encode(text);
  tokens.insert(tokens.end(), encoded.begin(), encoded.end());
  return tokens;
}

TokenSequence completion_sequence(std::vector<int32_t> whole, size_t prompt_tokens, int32_t eos_id, int64_t seq_len,
                                  bool& truncated) {
  TokenSequence seq;
  const bool ends_with_eos = whole.size() > prompt_tokens && whole.back() == eos_id;
  if (eos_id >= 0 && !ends_with_eos) whole.push_back(eos_id);
  seq.loss_mask.resize(whole.size());
  for (size_t i = prompt_tokens; i < whole.size(); i++) seq.loss_mask[i] = 1;
  seq.tokens = std::move(whole);
  truncated = truncate_to(seq, seq_len);
  return seq;
}

TokenSequence tokenize_example(const Example& example, const Tokenizer& tokenizer, int64_t seq_len, int32_t eos_id,
                               bool& truncated) {
  std::vector<int32_t> whole = text_tokens(tokenizer, example.prompt + example.completion);
  const size_t prompt_tokens = common_prefix_length(text_tokens(tokenizer, example.prompt), whole);
  return completion_sequence(std::move(whole), prompt_tokens, eos_id, seq_len, truncated);
}

std::pair<std::string, std::string> split_text_row(const std::string& text, const std::string& marker) {
  const size_t found = marker.empty() ? std::string::npos : text.rfind(marker);
  if (found != std::string::npos) return {text.substr(0, found + marker.size()), text.substr(found + marker.size())};
  const size_t middle = text.size() / 2;
  const size_t after = text.find(' ', middle), before = text.rfind(' ', middle);
  size_t cut = after;
  if (before != std::string::npos && (after == std::string::npos || middle - before < after - middle)) cut = before;
  if (cut == std::string::npos) cut = middle;
  return {text.substr(0, cut), text.substr(cut)};
}

TokenSequence tokenize_seq2seq_example(const Example& example, const Tokenizer& tokenizer, int64_t seq_len,
                                       int32_t eos_id, bool& truncated) {
  FT_CHECK(eos_id >= 0, "seq2seq data needs an end-of-sequence token (data.add_eos or the tokenizer's eos)");
  std::vector<int32_t> prompt = tokenizer.encode(example.prompt), labels = tokenizer.encode(example.completion);
  const size_t max_labels = size_t(std::max<int64_t>(seq_len / 2, 1));  // eos included
  const size_t label_tokens = std::min(labels.size() + 1, max_labels);
  const size_t max_prompt = size_t(seq_len + 1) - label_tokens;  // eos included
  truncated = labels.size() + 1 > max_labels || prompt.size() + 1 > max_prompt;
  prompt.resize(std::min(prompt.size(), max_prompt - 1));
  labels.resize(label_tokens - 1);
  TokenSequence seq;
  for (int32_t id : prompt) seq.tokens.push_back(id);
  seq.tokens.push_back(eos_id);
  seq.loss_mask.assign(seq.tokens.size(), 0);
  for (int32_t id : labels) seq.tokens.push_back(id);
  seq.tokens.push_back(eos_id);
  seq.loss_mask.resize(seq.tokens.size(), 1);
  return seq;
}

std::string reply_prompt(const ChatTemplate& chat, const nlohmann::ordered_json& messages,
                         const nlohmann::ordered_json& tools, const std::string& where) {
  return render_chat_text(chat, messages, tools, /*add_generation_prompt=*/true, where);
}

std::string generation_prompt(const ChatTemplate& chat, const std::vector<ChatMessage>& conversation,
                              const std::string& where, const nlohmann::ordered_json& tools) {
  FT_CHECK(!conversation.empty() && conversation.back().role == "user", where, ": the last message is ",
           conversation.empty() ? "missing" : "the " + conversation.back().role + "'s",
           " (expected a user message to reply to)");
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  for (const ChatMessage& message : conversation) messages.push_back({{"role", message.role}, {"content", message.content}});
  return reply_prompt(chat, messages, tools, where);
}

nlohmann::ordered_json messages_before_reply(const nlohmann::ordered_json& conversation) {
  const nlohmann::ordered_json& messages = conversation["messages"];
  const size_t kept = conversation.value("prompt_messages", messages.size() - 1);
  return nlohmann::ordered_json(messages.begin(), messages.begin() + long(kept));
}

void set_chat_prompts(Dataset& data, const ChatTemplate& chat) {
  for (Example& example : data.examples) {
    const std::string where = data.path + ":" + std::to_string(example.line);
    // The messages before the reply, whatever their roles (a system message,
    // an earlier assistant turn): trl trains such rows, and the template, as
    // apply_chat_template's, says whether it renders them. A reply with
    // nothing before it has no prompt.
    if (example.messages.size() == 1) {
      example.prompt = "";
    } else if (example.conversation.is_null()) {
      nlohmann::ordered_json before_reply = nlohmann::ordered_json::array();
      for (auto m = example.messages.begin(); m + 1 < example.messages.end(); ++m)
        before_reply.push_back({{"role", m->role}, {"content", m->content}});
      example.prompt = reply_prompt(chat, before_reply, nullptr, where);
    } else {
      example.prompt = reply_prompt(chat, messages_before_reply(example.conversation),
                                    example.conversation.value("tools", nlohmann::ordered_json()), where);
    }
    example.completion = example.messages.back().content;
  }
}

TokenSequence tokenize_chat(const std::vector<RenderedPiece>& pieces, const Tokenizer& tokenizer) {
  std::string text;
  std::vector<std::pair<size_t, bool>> starts;  // byte where each run of equal loss begins, its loss
  for (const RenderedPiece& piece : pieces) {
    if (starts.empty() || starts.back().second != piece.loss) starts.push_back({text.size(), piece.loss});
    text += piece.text;
  }
  TokenSequence seq;
  seq.tokens = tokenizer.encode(text);
  seq.loss_mask.assign(seq.tokens.size(), 0);
  for (size_t run = 0; run < starts.size(); run++) {
    if (!starts[run].second) continue;
    // return_assistant_tokens_mask's rule: from the token holding the run's first
    // byte to the one holding its last (a token straddling either edge trains).
    size_t begin = split_tokens(text, starts[run].first, seq.tokens, tokenizer).before;
    size_t end = seq.tokens.size();
    if (run + 1 < starts.size()) {
      TokenSplit split = split_tokens(text, starts[run + 1].first, seq.tokens, tokenizer);
      end = split.before + split.straddles;
    }
    for (size_t i = begin; i < end && i < seq.tokens.size(); i++) seq.loss_mask[i] = 1;
  }
  return seq;
}

TokenSequence tokenize_chat_completion(const ChatTemplate& chat, const nlohmann::ordered_json& conversation,
                                       const Tokenizer& tokenizer, int64_t seq_len, const std::string& where,
                                       bool& truncated) {
  const nlohmann::ordered_json tools = conversation.value("tools", nlohmann::ordered_json());
  const std::vector<int32_t> prompt = tokenizer.encode(reply_prompt(chat, messages_before_reply(conversation), tools, where));
  std::vector<int32_t> whole = tokenizer.encode(render_chat_text(chat, conversation["messages"], tools, false, where));
  const size_t prompt_tokens = common_prefix_length(prompt, whole);
  return completion_sequence(std::move(whole), prompt_tokens, /*eos_id=*/-1, seq_len, truncated);
}

// loss_mask[0] never counts: the first token has nothing before it.
int64_t loss_token_count(const TokenSequence& sequence) {
  if (sequence.loss_mask.empty()) return 0;
  return std::accumulate(sequence.loss_mask.begin() + 1, sequence.loss_mask.end(), int64_t(0));
}

TokenizedDataset tokenize_dataset(const Dataset& data, const Tokenizer& tokenizer, int64_t seq_len, int32_t eos_id,
                                  const ChatTemplate* chat, RowLayout layout, Packing packing, LossScope scope) {
  FT_CHECK(seq_len > 0, "tokenize_dataset: seq_len must be > 0, got ", seq_len);
  FT_CHECK(packing != Packing::concatenate || layout == RowLayout::causal, data.path,
           ": packing: concatenate joins decoder-only rows");
  // Concatenated examples stay whole (a longer cut than any row a JSONL line holds).
  const int64_t cut_tokens = packing == Packing::concatenate ? int64_t(INT32_MAX) : seq_len;
  FT_CHECK(data.format != DataFormat::chat || chat, data.path, ": chat rows need a chat template");
  FT_CHECK(data.format != DataFormat::chat || layout == RowLayout::causal, data.path,
           ": chat rows train decoder-only models; an encoder-decoder model needs prompt/completion rows");
  TokenizedDataset out;
  for (const Example& example : data.examples) {
    bool truncated = false;
    TokenSequence seq;
    bool every_token = false;  // the scope's flag for this row is off
    if (data.format == DataFormat::chat) {
      const std::string where = data.path + ":" + std::to_string(example.line);
      const nlohmann::ordered_json& written = example.conversation;
      if (written.contains("prompt_messages")) {
        seq = tokenize_chat_completion(*chat, written, tokenizer, cut_tokens, where, truncated);
        every_token = !scope.completion_only;
      } else {
        // Every token trains without assistant_only: no assistant span is looked for.
        seq = tokenize_chat(written.is_null() ? render_chat(*chat, example.messages, where, scope.assistant_only)
                                              : render_chat(*chat, written["messages"], written["tools"], false, where,
                                                            scope.assistant_only),
                            tokenizer);
        truncated = truncate_to(seq, cut_tokens);
        every_token = !scope.assistant_only;
      }
    } else if (layout == RowLayout::seq2seq) {
      seq = tokenize_seq2seq_example(example, tokenizer, seq_len, eos_id, truncated);
    } else {
      seq = tokenize_example(example, tokenizer, cut_tokens, eos_id, truncated);
      every_token = !scope.completion_only;
    }
    if (every_token) std::fill(seq.loss_mask.begin(), seq.loss_mask.end(), uint8_t(1));
    out.truncated_count += truncated;
    int64_t loss_tokens = loss_token_count(seq);
    if (loss_tokens == 0) {
      out.dropped_count++;
      continue;
    }
    out.loss_token_count += loss_tokens;
    out.examples.push_back(std::move(seq));
  }
  FT_CHECK(!out.examples.empty(), data.path, ": no example has a completion token within seq_len = ", seq_len, " (all ",
           out.dropped_count, " prompts fill the window)");
  return out;
}

int32_t padding_id(const Tokenizer& tokenizer) {
  if (tokenizer.pad_id() >= 0) return tokenizer.pad_id();
  if (tokenizer.eos_id() >= 0) return tokenizer.eos_id();
  return 0;
}

namespace {

// Examples in groups of at most seq_len inputs (best_fit_decreasing), each
// group joined into one row.
std::vector<TokenSequence> pack_padding_free(const std::vector<TokenSequence>& examples, int64_t seq_len) {
  std::vector<int64_t> slots;
  for (const TokenSequence& example : examples) {
    slots.push_back(input_slots(example));
    FT_CHECK(slots.back() >= 1, "padding-free packing: an example of ", example.tokens.size(),
             " tokens predicts nothing (it needs 2 tokens or more)");
    FT_CHECK(slots.back() <= seq_len, "padding-free packing: an example of ", example.tokens.size(),
             " tokens does not fit a row of seq_len ", seq_len, " + 1 tokens");
  }
  return join_examples(examples, best_fit_decreasing(slots, seq_len));
}

// Examples joined and cut into windows (Packing::concatenate).
std::vector<TokenSequence> concatenate(const std::vector<TokenSequence>& examples, int64_t seq_len) {
  TokenSequence stream;
  for (const TokenSequence& example : examples) {
    stream.tokens.insert(stream.tokens.end(), example.tokens.begin(), example.tokens.end());
    stream.loss_mask.insert(stream.loss_mask.end(), example.loss_mask.begin(), example.loss_mask.end());
  }
  std::vector<TokenSequence> rows;
  int64_t stream_len = int64_t(stream.tokens.size());
  // A window needs two tokens to predict anything; windows start seq_len apart.
  for (int64_t start = 0; start + 1 < stream_len; start += seq_len) {
    int64_t end = std::min(start + seq_len + 1, stream_len);
    rows.push_back({{stream.tokens.begin() + start, stream.tokens.begin() + end},
                    {stream.loss_mask.begin() + start, stream.loss_mask.begin() + end}});
  }
  return rows;
}

// The inputs a row fills: seq_len at most.
int64_t row_inputs(const TokenSequence& row) {
  return int64_t(row.tokens.size()) - std::max<int64_t>(int64_t(row.example_starts.size()), 1);
}

}  // namespace

int64_t input_slots(const TokenSequence& example) { return int64_t(example.tokens.size()) - 1; }

// Longest first, each into the bin whose free space fits it most tightly (a
// new bin if none does); ties keep index order, so the bins depend on the
// sizes alone.
std::vector<std::vector<size_t>> best_fit_decreasing(const std::vector<int64_t>& sizes, int64_t capacity) {
  std::vector<size_t> order(sizes.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  std::vector<std::vector<size_t>> bins;
  std::multimap<int64_t, size_t> bins_by_free_space;
  for (size_t i : order) {
    FT_CHECK(sizes[i] >= 1 && sizes[i] <= capacity, "best_fit_decreasing: item ", i, " of size ", sizes[i],
             " does not fit a bin of ", capacity);
    auto fit = bins_by_free_space.lower_bound(sizes[i]);
    int64_t free_space = capacity;
    size_t bin = bins.size();
    if (fit == bins_by_free_space.end()) {
      bins.emplace_back();
    } else {
      free_space = fit->first, bin = fit->second;
      bins_by_free_space.erase(fit);
    }
    bins[bin].push_back(i);
    if (free_space > sizes[i]) bins_by_free_space.emplace(free_space - sizes[i], bin);
  }
  return bins;
}

std::vector<TokenSequence> join_examples(const std::vector<TokenSequence>& examples,
                                         const std::vector<std::vector<size_t>>& groups) {
  std::vector<TokenSequence> rows(groups.size());
  for (size_t r = 0; r < groups.size(); ++r)
    for (size_t i : groups[r]) {
      TokenSequence& row = rows[r];
      const TokenSequence& example = examples[i];
      row.example_starts.push_back(int64_t(row.tokens.size()));
      row.tokens.insert(row.tokens.end(), example.tokens.begin(), example.tokens.end());
      row.loss_mask.insert(row.loss_mask.end(), example.loss_mask.begin(), example.loss_mask.end());
    }
  return rows;
}

std::vector<TokenSequence> make_rows(const TokenizedDataset& data, int64_t seq_len, Packing packing) {
  switch (packing) {
    case Packing::none: return data.examples;
    case Packing::padding_free: return pack_padding_free(data.examples, seq_len);
    case Packing::concatenate: return concatenate(data.examples, seq_len);
  }
  return {};
}

DataLoader::DataLoader(std::vector<TokenSequence> rows, int64_t micro_batch_size, int64_t seq_len, int32_t pad_id,
                       uint64_t seed, Allocator& host_allocator)
    : rows_(std::move(rows)),
      micro_batch_size_(micro_batch_size),
      seq_len_(seq_len),
      pad_id_(pad_id),
      seed_(seed),
      allocator_(host_allocator) {
  FT_CHECK(!rows_.empty(), "DataLoader: no rows");
  FT_CHECK(micro_batch_size > 0 && seq_len > 0, "DataLoader: micro_batch_size and seq_len must be > 0");
  FT_CHECK(host_allocator.device() == Device::cpu, "DataLoader: batches live in host memory");
  for (const TokenSequence& row : rows_) {
    FT_CHECK(row_inputs(row) <= seq_len && row.tokens.size() == row.loss_mask.size(), "DataLoader: a row of ",
             row.example_starts.size(), " examples in ", row.tokens.size(), " tokens fills ", row_inputs(row),
             " inputs, more than seq_len = ", seq_len);
    FT_CHECK(row.example_starts.empty() || row.example_starts[0] == 0, "DataLoader: a packed row's first example",
             " must start at token 0, got ", row.example_starts.empty() ? 0 : row.example_starts[0]);
    packed_ = packed_ || !row.example_starts.empty();
  }
  identity_order_.resize(rows_.size());
  std::iota(identity_order_.begin(), identity_order_.end(), int64_t(0));
  order_ = epoch_order(0);
}

int64_t DataLoader::batches_per_epoch() const { return (row_count() + micro_batch_size_ - 1) / micro_batch_size_; }

std::vector<int64_t> DataLoader::epoch_order(int64_t epoch) const { return shuffled_order(row_count(), seed_, epoch); }

std::vector<int64_t> DataLoader::next_rows() const {
  const int64_t begin = position_.index * micro_batch_size_, end = std::min(row_count(), begin + micro_batch_size_);
  return std::vector<int64_t>(order_.begin() + begin, order_.begin() + std::max(begin, end));
}

std::vector<int64_t> shuffled_order(int64_t count, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(count));
  std::iota(order.begin(), order.end(), int64_t(0));
  std::mt19937_64 rng(seed + uint64_t(epoch));
  for (int64_t i = int64_t(order.size()) - 1; i > 0; i--) {
    // Plain modulo: its bias is below rows / 2^64, and unlike
    // std::uniform_int_distribution it gives the same draw on every library.
    int64_t j = int64_t(rng() % uint64_t(i + 1));
    std::swap(order[size_t(i)], order[size_t(j)]);
  }
  return order;
}

Batch DataLoader::next() {
  Batch batch = make_batch(order_, position_.index);
  position_.index++;
  if (position_.index == batches_per_epoch()) {
    position_ = {position_.epoch + 1, 0};
    order_ = epoch_order(position_.epoch);
  }
  return batch;
}

void DataLoader::set_position(DataPosition position) {
  FT_CHECK(position.epoch >= 0 && position.index >= 0 && position.index < batches_per_epoch(), "data position (epoch ",
           position.epoch, ", micro-batch ", position.index, ") does not exist: this dataset has ", batches_per_epoch(),
           " micro-batches per epoch (did the data, seq_len, packing or micro_batch_size change?)");
  if (position.epoch != position_.epoch) order_ = epoch_order(position.epoch);
  position_ = position;
}

Batch DataLoader::batch_in_order(int64_t index) const {
  FT_CHECK(index >= 0 && index < batches_per_epoch(), "DataLoader: batch ", index, " out of range [0, ",
           batches_per_epoch(), ")");
  return make_batch(identity_order_, index);
}

// A padding-free row into batch row b: each example's inputs and targets at
// positions 0, 1, ... from where the previous one ended; the padding tail
// after the last counts from 0 again, a sequence of its own.
void DataLoader::write_packed_row(Batch& batch, int64_t b, const TokenSequence& row) const {
  int32_t* inputs = batch.input_ids.ptr<int32_t>() + b * seq_len_;
  int32_t* targets = batch.targets.ptr<int32_t>() + b * seq_len_;
  int32_t* positions = batch.position_ids.ptr<int32_t>() + b * seq_len_;
  int64_t t = 0;
  for (size_t e = 0; e < row.example_starts.size(); ++e) {
    const int64_t start = row.example_starts[e];
    const int64_t end = e + 1 < row.example_starts.size() ? row.example_starts[e + 1] : int64_t(row.tokens.size());
    for (int64_t i = start; i + 1 < end; ++i, ++t) {
      inputs[t] = row.tokens[size_t(i)];
      positions[t] = int32_t(i - start);
      if (!row.loss_mask[size_t(i + 1)]) continue;
      targets[t] = row.tokens[size_t(i + 1)];
      batch.counted_tokens++;
    }
  }
  for (int32_t p = 0; t < seq_len_; ++t, ++p) positions[t] = p;
}

Batch DataLoader::make_batch(const std::vector<int64_t>& order, int64_t index) const {
  Batch batch{Tensor::empty({micro_batch_size_, seq_len_}, DType::i32, allocator_, MemCategory::activations),
              Tensor::empty({micro_batch_size_, seq_len_}, DType::i32, allocator_, MemCategory::activations), 0};
  int32_t* inputs = batch.input_ids.ptr<int32_t>();
  int32_t* targets = batch.targets.ptr<int32_t>();
  std::fill(inputs, inputs + batch.input_ids.numel(), pad_id_);
  std::fill(targets, targets + batch.targets.numel(), kIgnoreIndex);
  if (packed_) {
    batch.position_ids = Tensor::empty(batch.input_ids.shape, DType::i32, allocator_, MemCategory::activations);
    for (int64_t n = 0; n < batch.position_ids.numel(); ++n) batch.position_ids.ptr<int32_t>()[n] = int32_t(n % seq_len_);
  }
  for (int64_t b = 0; b < micro_batch_size_; b++) {
    int64_t slot = index * micro_batch_size_ + b;
    if (slot >= row_count()) break;  // the epoch's last micro-batch: empty rows stay padding
    const TokenSequence& row = rows_[size_t(order[size_t(slot)])];
    if (!row.example_starts.empty()) {
      write_packed_row(batch, b, row);
      continue;
    }
    int64_t length = std::min(int64_t(row.tokens.size()), seq_len_ + 1);
    for (int64_t t = 0; t < std::min(length, seq_len_); t++) inputs[b * seq_len_ + t] = row.tokens[size_t(t)];
    for (int64_t t = 0; t + 1 < length; t++) {
      if (!row.loss_mask[size_t(t + 1)]) continue;
      targets[b * seq_len_ + t] = row.tokens[size_t(t + 1)];
      batch.counted_tokens++;
    }
  }
  return batch;
}

}  // namespace ft
