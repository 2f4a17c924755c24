#include "trainer/data/chat_template.h"

#include <filesystem>
#include <iostream>
#include <fstream>
#include <optional>
#include <sstream>

#include "kernels/error.h"
#include "kernels/input_file.h"
#include "tokenizer/json_fields.h"
#include "trainer/data/jinja/render.h"

namespace ft {
namespace {

using Json = nlohmann::ordered_json;

// The built-in families' templates, as their checkpoints' tokenizer_config.json hold them.
// The generic ChatML template.
constexpr const char* kChatml =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
// meta-llama/Llama-2-7b-chat-hf.
constexpr const char* kLlama2 =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
    "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
    "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
    "loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if "
    "message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == "
    "'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";
// meta-llama/Meta-Llama-3-8B-Instruct.
constexpr const char* kLlama3 =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 "
    "%}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";
// HuggingFaceH4/zephyr-7b-beta.
constexpr const char* kZephyr =
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\\n' + message['content'] + "
    "eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\\n' + message['content'] + eos_token }}\n{% "
    "elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\\n'  + message['content'] + eos_token }}\n{% endif "
    "%}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}";

const char* built_in(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::chatml:
      return kChatml;
    case ChatTemplateKind::llama2:
      return kLlama2;
    case ChatTemplateKind::llama3:
      return kLlama3;
    case ChatTemplateKind::zephyr:
      return kZephyr;
    case ChatTemplateKind::automatic:
      break;
  }
  return "";
}

// tokenizer_config.json's special tokens: a string or {"content": ...}.
std::optional<std::string> token_text(const nlohmann::json& config, const char* key) {
  if (!config.contains(key)) return std::nullopt;
  const nlohmann::json& value = config[key];
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string())
    return value["content"].get<std::string>();
  return std::nullopt;
}

// The chat_template of a tokenizer_config.json: a string, or a list of
// {"name", "template"} of which "default" is the one transformers applies.
std::string template_string(const nlohmann::json& config) {
  if (!config.contains("chat_template")) return "";
  const nlohmann::json& value = config["chat_template"];
  if (value.is_string()) return value.get<std::string>();
  if (value.is_array())
    for (const nlohmann::json& entry : value)
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string())
        return entry["template"].get<std::string>();
  return "";
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream file = open_input_file(path, "a chat template");
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

std::string python_strip(const std::string& text) {
  const char* space = " \t\n\r\v\f";
  size_t begin = text.find_first_not_of(space);
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(space) - begin + 1);
}

size_t common_prefix(const std::string& a, const std::string& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) n++;
  return n;
}

using Spans = std::vector<std::pair<size_t, size_t>>;

std::optional<std::string> try_render(const ChatTemplate& chat, const Json& messages, const Json& tools,
                                      bool add_generation_prompt) {
  try {
    return render_chat_text(chat, messages, tools, add_generation_prompt, "");
  } catch (const Error&) {  // the template refuses this prefix: nothing to align with
    return std::nullopt;
  }
}

Json first(const Json& messages, size_t count) { return Json(messages.begin(), messages.begin() + long(count)); }

// Where assistant message k's trained text lies in `text`, the whole
// rendering (see the top of chat_template.h); cursor: where the previous span ended.
std::pair<size_t, size_t> prefix_span(const ChatTemplate& chat, const Json& messages, const Json& tools,
                                      const std::string& text, size_t k, size_t cursor, const std::string& where) {
  const Json& message = messages[k];
  const std::string content = python_strip(message_text(message));
  std::optional<size_t> start;
  for (bool add_generation_prompt : {true, false}) {
    if (k == 0 || start) break;
    std::optional<std::string> before = try_render(chat, first(messages, k), tools, add_generation_prompt);
    if (before && text.starts_with(*before) && before->size() >= cursor) start = before->size();
  }
  if (!start) {  // the template moves text around (Mistral puts the system message last): find the content
    // after the message before it (the user's turn, a tool's result), whose text may hold the reply's words.
    size_t from = cursor;
    const std::string previous = python_strip(message_text(messages[k - (k > 0 ? 1 : 0)]));
    const size_t previous_at = k == 0 || previous.empty() ? std::string::npos : text.find(previous, cursor);
    if (previous_at != std::string::npos) from = previous_at + previous.size();
    size_t found = content.empty() ? std::string::npos : text.find(content, from);
    FT_CHECK(found != std::string::npos, where, ": messages[", k, "] (assistant): ",
             content.empty() ? "it has no content (a tool call) and the conversation before it is not how the text "
                               "begins in what "
                             : "its content is not in the text ",
             chat.source, " renders, so its tokens cannot be found to train on (data.assistant_only_loss: false "
             "trains every token)");
    start = found;
  }
  const std::string through = render_chat_text(chat, first(messages, k + 1), tools, false, where);
  const size_t in_through = content.empty() ? std::string::npos : through.rfind(content);
  const size_t found = content.empty() ? std::string::npos : text.find(content, *start);
  size_t end = *start;
  if (text.starts_with(through) && through.size() > *start) {
    end = through.size();
  } else if (in_through != std::string::npos && found != std::string::npos) {
    std::string after = through.substr(in_through + content.size());
    after.erase(after.find_last_not_of(" \t\n\r\v\f") + 1);
    if (text.compare(found + content.size(), after.size(), after) == 0) end = found + content.size() + after.size();
  }
  if (end == *start && content.empty()) {  // a tool call: the longest end of its rendering found at start
    std::string rendered = through;
    rendered.erase(rendered.find_last_not_of(" \t\n\r\v\f") + 1);
    for (size_t q = 0; q < rendered.size() && end == *start; q++)
      if (text.compare(*start, rendered.size() - q, rendered, q) == 0) end = *start + rendered.size() - q;
  }
  if (end == *start) {  // cut at the last whitespace before the texts part
    size_t shared = std::max(common_prefix(text, through), *start);
    size_t cut = shared > *start ? text.find_last_of(" \t\n\r", shared - 1) : std::string::npos;
    end = cut != std::string::npos && cut >= *start ? cut + 1 : *start;
  }
  while (end > *start && std::isspace((unsigned char)text[end - 1])) end--;
  return {*start, end};
}

Spans prefix_spans(const ChatTemplate& chat, const Json& messages, const Json& tools, const std::string& text,
                   const std::string& where) {
  Spans spans;
  size_t cursor = 0;
  for (size_t k = 0; k < messages.size(); k++) {
    if (messages[k].value("role", "") != "assistant") continue;
    auto [start, end] = prefix_span(chat, messages, tools, text, k, cursor, where);
    if (end > start) spans.push_back({start, end});
    cursor = std::max(cursor, end);
  }
  return spans;
}

bool mentions_tools(const Json& messages, const Json& tools) {
  if (!tools.is_null()) return true;
  for (const Json& message : messages)
    if (message.contains("tool_calls") || message.value("role", "") == "tool") return true;
  return false;
}

jinja::Rendered render_with_spans(const ChatTemplate& chat, const Json& messages, const Json& tools,
                                  bool add_generation_prompt, const std::string& where) {
  FT_CHECK(chat.renders_tools || !mentions_tools(messages, tools), where.empty() ? chat.name : where,
           ": the conversation has tools, tool calls or tool results, and ", chat.name,
           " never mentions tools (it would drop them); use a template that renders them, such as a tool-calling "
           "checkpoint's own (its tokenizer_config.json)");
  Json context = chat.special_tokens;
  context["messages"] = messages;
  context["tools"] = tools;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = add_generation_prompt;
  try {
    return jinja::render(*chat.jinja, context, chat.now);
  } catch (const Error& e) {
    if (where.empty()) throw;
    fail(where, ": ", e.what());
  }
}

}  // namespace

EnumNames<ChatTemplateKind> enum_names(ChatTemplateKind) {
  static const EnumName<ChatTemplateKind> names[] = {{"auto", ChatTemplateKind::automatic},
                                                     {"chatml", ChatTemplateKind::chatml},
                                                     {"llama2", ChatTemplateKind::llama2},
                                                     {"llama3", ChatTemplateKind::llama3},
                                                     {"zephyr", ChatTemplateKind::zephyr}};
  return names;
}

std::string message_text(const Json& message) {
  const Json content = message.value("content", Json());
  if (content.is_string()) return content;
  std::string text;
  if (content.is_array())
    for (const Json& part : content)
      if (part.is_object() && part.value("type", Json()) == "text" && part.value("text", Json()).is_string())
        text += part["text"].get<std::string>();
  return text;
}

void check_message_roles(const std::vector<ChatMessage>& messages, const std::string& where) {
  for (size_t i = 0; i < messages.size(); i++)
    FT_CHECK(messages[i].role == "system" || messages[i].role == "user" || messages[i].role == "assistant", where,
             ": messages[", i, "].role is \"", messages[i].role, "\" (expected system, user or assistant)");
}

void check_chat_roles(const std::vector<ChatMessage>& messages, const std::string& where) {
  FT_CHECK(!messages.empty(), where, ": \"messages\" is empty (expected at least one user and one assistant turn)");
  check_message_roles(messages, where);
  FT_CHECK(messages.back().role == "assistant", where, ": the last message is the ", messages.back().role,
           "'s (expected an assistant turn to train on)");
}

ChatTemplate resolve_chat_template(ChatTemplateKind configured, const std::string& tokenizer_dir,
                                   const char* setting) {
  const std::filesystem::path config_path = std::filesystem::path(tokenizer_dir) / "tokenizer_config.json";
  const std::filesystem::path jinja_path = std::filesystem::path(tokenizer_dir) / "chat_template.jinja";
  nlohmann::json config = json_fields::read_tokenizer_config(tokenizer_dir);
  FT_CHECK(config.is_null() || config.is_object(), config_path.string(), ": expected a JSON object");
  // chat_template.jinja comes first: transformers' from_pretrained lets it replace the config's template.
  std::string source, where, file;
  if (std::filesystem::exists(jinja_path))
    source = read_text(jinja_path), where = file = jinja_path.string();
  else
    source = template_string(config), where = config_path.string() + ": chat_template", file = config_path.string();

  ChatTemplate chat;
  chat.kind = configured;
  chat.source = configured != ChatTemplateKind::automatic ? setting : file;
  if (configured != ChatTemplateKind::automatic) {
    source = built_in(configured);
    where = std::string("the built-in ") + enum_name(configured) + " chat template";
  }
  FT_CHECK(!source.empty(), file, ": no chat_template to render chat rows with",
           setting ? std::string("; set ") + setting + " to one of " +
                         enum_spellings(enum_names(ChatTemplateKind{}), ", ", ChatTemplateKind::automatic)
                   : std::string());
  chat.jinja = jinja::compile(source, where);
  for (const std::string& fault : chat.jinja->deferred_faults)
    std::cerr << "warning: " << where << " " << fault << ": a row whose rendering reaches it is refused\n";
  chat.name = where;
  chat.renders_tools = source.find("tool") != std::string::npos;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"})
    if (std::optional<std::string> text = token_text(config, key)) chat.special_tokens[key] = *text;
  if (!chat.special_tokens.contains("bos_token") && configured != ChatTemplateKind::automatic)
    chat.special_tokens["bos_token"] = configured == ChatTemplateKind::llama3 ? "<|begin_of_text|>" : "<s>";
  if (!chat.special_tokens.contains("eos_token") && configured != ChatTemplateKind::automatic)
    chat.special_tokens["eos_token"] = "</s>";
  chat.now = std::time(nullptr);
  return chat;
}

std::string render_chat_text(const ChatTemplate& chat, const Json& messages, const Json& tools,
                             bool add_generation_prompt, const std::string& where) {
  return render_with_spans(chat, messages, tools, add_generation_prompt, where).text;
}

std::vector<RenderedPiece> render_chat(const ChatTemplate& chat, const Json& messages, const Json& tools,
                                       bool add_generation_prompt, const std::string& where, bool assistant_only) {
  jinja::Rendered rendered = render_with_spans(chat, messages, tools, add_generation_prompt, where);
  const Spans spans = !assistant_only ? Spans{{0, rendered.text.size()}}
                      : chat.jinja->has_generation ? rendered.generation
                                                   : prefix_spans(chat, messages, tools, rendered.text, where);
  std::vector<RenderedPiece> pieces;
  size_t at = 0;
  for (const auto& [start, end] : spans) {
    if (start < at || end <= start) continue;  // spans come in order; an empty or overlapping one adds nothing
    if (start > at) pieces.push_back({rendered.text.substr(at, start - at), false});
    pieces.push_back({rendered.text.substr(start, end - start), true});
    at = end;
  }
  if (at < rendered.text.size()) pieces.push_back({rendered.text.substr(at), false});
  return pieces;
}

std::vector<RenderedPiece> render_chat(const ChatTemplate& chat, const std::vector<ChatMessage>& messages,
                                       const std::string& where, bool assistant_only) {
  check_chat_roles(messages, where);
  Json list = Json::array();
  for (const ChatMessage& message : messages) list.push_back({{"role", message.role}, {"content", message.content}});
  return render_chat(chat, list, nullptr, false, where, assistant_only);
}

}  // namespace ft
