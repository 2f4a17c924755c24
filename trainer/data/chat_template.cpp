#include "trainer/data/chat_template.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kernels/error.h"
#include "kernels/input_file.h"
#include "model/json_input.h"

namespace ft {
namespace {

bool has(const std::string& text, const char* marker) { return text.find(marker) != std::string::npos; }

// Python's str.strip() (Jinja's trim) on the whitespace chat contents carry.
std::string strip(const std::string& text) {
  const char* space = " \t\n\r\v\f";
  size_t begin = text.find_first_not_of(space);
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(space) - begin + 1);
}

// Qwen2-style ChatML templates open a conversation without a system message
// with a fixed one, written as a string literal in the template.
std::string chatml_default_system(const std::string& jinja) {
  const std::string open = "<|im_start|>system\n", close = "<|im_end|>";
  for (size_t at = jinja.find(open); at != std::string::npos; at = jinja.find(open, at + 1)) {
    size_t begin = at + open.size();
    size_t end = jinja.find_first_of("'\"{}<", begin);
    if (end != std::string::npos && end > begin && jinja.compare(end, close.size(), close) == 0)
      return jinja.substr(begin, end - begin);
  }
  return "";
}

// tokenizer_config.json's bos_token / eos_token: a string or {"content": ...}.
std::string token_text(const nlohmann::json& config, const char* key, const std::string& fallback) {
  if (!config.contains(key)) return fallback;
  const nlohmann::json& value = config[key];
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string())
    return value["content"].get<std::string>();
  return fallback;
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

}  // namespace

void check_chat_roles(const std::vector<ChatMessage>& messages, const std::string& where) {
  FT_CHECK(!messages.empty(), where, ": \"messages\" is empty (expected at least one user and one assistant turn)");
  for (size_t i = 0; i < messages.size(); i++)
    FT_CHECK(messages[i].role == "system" || messages[i].role == "user" || messages[i].role == "assistant", where,
             ": messages[", i, "].role is \"", messages[i].role, "\" (expected system, user or assistant)");
  FT_CHECK(messages.back().role == "assistant", where, ": the last message is the ", messages.back().role,
           "'s (expected an assistant turn to train on)");
}

namespace {

void render_chatml(const ChatTemplate& chat, const std::vector<ChatMessage>& messages, std::vector<RenderedPiece>& out) {
  if (!chat.default_system.empty() && messages[0].role != "system")
    out.push_back({"<|im_start|>system\n" + chat.default_system + "<|im_end|>\n", false});
  for (const ChatMessage& message : messages) {
    bool assistant = message.role == "assistant";
    out.push_back({"<|im_start|>" + message.role + "\n", false});
    out.push_back({message.content + "<|im_end|>", assistant});
    out.push_back({"\n", false});
  }
}

// Meta's Llama-2 chat template: the system message opens the first user turn,
// every user turn starts with bos, and turns must alternate user/assistant.
void render_llama2(const ChatTemplate& chat, const std::vector<ChatMessage>& messages, std::vector<RenderedPiece>& out,
                   const std::string& where) {
  size_t first = messages[0].role == "system" ? 1 : 0;
  for (size_t i = first; i < messages.size(); i++) {
    const ChatMessage& message = messages[i];
    const char* expected = (i - first) % 2 == 0 ? "user" : "assistant";
    FT_CHECK(message.role == expected, where, ": messages[", i, "].role is \"", message.role,
             "\" but the llama2 chat template needs user and assistant turns to alternate (after an optional system "
             "message), starting with user");
    std::string content = message.content;
    if (i == first && first == 1) content = "<<SYS>>\n" + messages[0].content + "\n<</SYS>>\n\n" + content;
    if (message.role == "user")
      out.push_back({chat.bos_token + "[INST] " + strip(content) + " [/INST]", false});
    else
      out.push_back({std::string(" ").append(strip(content)).append(" ").append(chat.eos_token), true});
  }
}

void render_llama3(const ChatTemplate& chat, const std::vector<ChatMessage>& messages, std::vector<RenderedPiece>& out) {
  out.push_back({chat.bos_token, false});
  for (const ChatMessage& message : messages) {
    out.push_back({"<|start_header_id|>" + message.role + "<|end_header_id|>\n\n", false});
    out.push_back({strip(message.content) + "<|eot_id|>", message.role == "assistant"});
  }
}

void render_zephyr(const ChatTemplate& chat, const std::vector<ChatMessage>& messages, std::vector<RenderedPiece>& out) {
  for (const ChatMessage& message : messages) {
    out.push_back({"<|" + message.role + "|>\n", false});
    out.push_back({message.content + chat.eos_token, message.role == "assistant"});
    out.push_back({"\n", false});
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

ChatTemplateKind recognise_chat_template(const std::string& jinja) {
  // Reasoning templates (Qwen3) rewrite assistant turns around <think> blocks.
  if (has(jinja, "<|im_start|>") && has(jinja, "<|im_end|>") && !has(jinja, "<think>")) return ChatTemplateKind::chatml;
  if (has(jinja, "[INST]") && has(jinja, "<<SYS>>")) return ChatTemplateKind::llama2;
  // Llama-3.1 and later add a dated system header (and tools) this renderer does not write.
  if (has(jinja, "<|start_header_id|>") && has(jinja, "<|eot_id|>") && !has(jinja, "Cutting Knowledge Date"))
    return ChatTemplateKind::llama3;
  if (has(jinja, "<|user|>") && has(jinja, "<|assistant|>") && has(jinja, "eos_token")) return ChatTemplateKind::zephyr;
  return ChatTemplateKind::automatic;
}

ChatTemplate resolve_chat_template(ChatTemplateKind configured, const std::string& tokenizer_dir,
                                   const char* setting) {
  const std::filesystem::path config_path = std::filesystem::path(tokenizer_dir) / "tokenizer_config.json";
  const std::filesystem::path jinja_path = std::filesystem::path(tokenizer_dir) / "chat_template.jinja";
  nlohmann::json config = nlohmann::json::object();
  if (std::filesystem::exists(config_path))
    config = read_json_object(config_path.string(), "a tokenizer_config.json");
  std::string jinja = template_string(config), jinja_source = config_path.string();
  if (jinja.empty() && std::filesystem::exists(jinja_path)) jinja = read_text(jinja_path), jinja_source = jinja_path.string();

  ChatTemplate chat;
  chat.kind = configured != ChatTemplateKind::automatic ? configured : recognise_chat_template(jinja);
  chat.source = configured != ChatTemplateKind::automatic ? setting : jinja_source;
  const std::string renderable = enum_spellings(enum_names(ChatTemplateKind{}), ", ", ChatTemplateKind::automatic);
  FT_CHECK(chat.kind != ChatTemplateKind::automatic, jinja_source,
           jinja.empty() ? ": no chat_template to render chat rows with"
                         : ": its chat_template is none of the templates this trainer renders (" + renderable +
                               "; Jinja is not run)",
           "; set ", setting, " to one of ", renderable);
  chat.bos_token = token_text(config, "bos_token", chat.kind == ChatTemplateKind::llama3 ? "<|begin_of_text|>" : "<s>");
  chat.eos_token = token_text(config, "eos_token", "</s>");
  if (chat.kind == ChatTemplateKind::chatml) chat.default_system = chatml_default_system(jinja);
  return chat;
}

std::vector<RenderedPiece> render_chat(const ChatTemplate& chat, const std::vector<ChatMessage>& messages,
                                       const std::string& where) {
  check_chat_roles(messages, where);
  std::vector<RenderedPiece> out;
  switch (chat.kind) {
    case ChatTemplateKind::chatml:
      render_chatml(chat, messages, out);
      break;
    case ChatTemplateKind::llama2:
      render_llama2(chat, messages, out, where);
      break;
    case ChatTemplateKind::llama3:
      render_llama3(chat, messages, out);
      break;
    case ChatTemplateKind::zephyr:
      render_zephyr(chat, messages, out);
      break;
    case ChatTemplateKind::automatic:
      FT_CHECK(false, where, ": no chat template chosen (resolve_chat_template picks one)");
  }
  return out;
}

}  // namespace ft
