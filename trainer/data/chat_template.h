// Chat conversations rendered as transformers' apply_chat_template renders
// them: the template's Jinja source runs in trainer/data/jinja/. The template
// is the checkpoint's own (data.chat_template: auto; tokenizer_config.json's
// chat_template, else chat_template.jinja) or a family's, built in, when
// data.chat_template names one:
//
//   chatml  <|im_start|>{role}\n{content}<|im_end|>\n per message
//   llama2  <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s>
//   llama3  <|begin_of_text|> then <|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>
//   zephyr  <|{role}|>\n{content}</s>\n per message
//
// Which text trains (the pieces flagged `loss`): with {% generation %} blocks
// in the template, what they write (transformers' return_assistant_tokens_mask);
// else, for each assistant message k of the conversation M with rendering T,
// the span found by rendering prefixes: it starts after render(M[:k],
// add_generation_prompt) (else render(M[:k]); where neither begins T, at the
// content's first occurrence after the previous span and after the previous
// message's content, which may hold the reply's words) and ends where the next
// message begins, render(M[:k+1]), when that begins T; else after the stripped
// content and the text the template writes after it in render(M[:k+1]); for a
// message without content (a tool call), after the longest end of
// render(M[:k+1]) that T continues with at the start (Qwen3 writes a <think>
// block in the last assistant turn only); else at the last whitespace before T
// and render(M[:k+1]) part. Trailing whitespace never trains.
// scripts/make_chat_fixture.py computes the same with Jinja2.
#pragma once
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "trainer/enum_names.h"

namespace ft {

namespace jinja {
struct Template;
}

enum class ChatTemplateKind { automatic, chatml, llama2, llama3, zephyr };
EnumNames<ChatTemplateKind> enum_names(ChatTemplateKind);  // data.chat_template's spellings (trainer/enum_names.h)

struct ChatMessage {
  std::string role;  // system, user or assistant
  std::string content;
};

struct ChatTemplate {
  ChatTemplateKind kind = ChatTemplateKind::automatic;  // automatic: the checkpoint's own template
  // The special-token strings the template sees (bos_token, eos_token, ...), as transformers passes them.
  nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object();
  std::string source;  // where the choice came from: the option that named it, or the template's file
  std::string name;    // for messages: "the built-in chatml chat template", or the file and field
  // Whether the template's text mentions tools at all ("tool"): one that does
  // not would drop a row's tools and tool calls silently, so such rows are refused.
  bool renders_tools = false;
  std::shared_ptr<const jinja::Template> jinja;
  std::time_t now = 0;  // the time strftime_now formats: when the template was resolved (tests set it)
};

struct RenderedPiece {
  std::string text;
  bool loss;
};

// The template to render with: `configured`'s built-in one unless automatic,
// else tokenizer_dir's tokenizer_config.json chat_template (or
// chat_template.jinja). Special-token strings come from that
// tokenizer_config.json when present. A missing template is an Error naming
// the file and `setting`, the option that names one (data.chat_template, or
// generate's --chat-template; nullptr where none does, as for a reward
// model's template); a template using what the interpreter does not
// run is one naming the file, line and construct.
ChatTemplate resolve_chat_template(ChatTemplateKind configured, const std::string& tokenizer_dir,
                                   const char* setting = "data.chat_template");

// Roles every training row takes: a non-empty list of system, user and
// assistant messages ending with an assistant turn (training needs one to
// learn from). Errors name `where` (file:line) and the message index.
void check_chat_roles(const std::vector<ChatMessage>& messages, const std::string& where);
// Each message's role one of system, user and assistant (a prompt to reply to
// may end with any of them); errors name `where` and the message index.
void check_message_roles(const std::vector<ChatMessage>& messages, const std::string& where);

// A message's content as text: the string, or its text parts joined (content
// as a list of {"type": "text", "text"} parts); "" for none.
std::string message_text(const nlohmann::ordered_json& message);

// apply_chat_template(messages, tools=tools, add_generation_prompt=...)'s text.
// messages: [{"role", "content", ...}]; tools: null or a list of tool schemas.
// Errors (the template raising, e.g. roles it cannot take) name `where` first.
std::string render_chat_text(const ChatTemplate& chat, const nlohmann::ordered_json& messages,
                             const nlohmann::ordered_json& tools, bool add_generation_prompt, const std::string& where);

// The rendered conversation in pieces, the assistant's trained text flagged
// `loss` (see the top of this file); with assistant_only false, the whole
// text (no assistant span is looked for).
std::vector<RenderedPiece> render_chat(const ChatTemplate& chat, const nlohmann::ordered_json& messages,
                                       const nlohmann::ordered_json& tools, bool add_generation_prompt,
                                       const std::string& where, bool assistant_only = true);
// A training row: its roles are checked, then rendered without tools or a generation prompt.
std::vector<RenderedPiece> render_chat(const ChatTemplate& chat, const std::vector<ChatMessage>& messages,
                                       const std::string& where, bool assistant_only = true);

}  // namespace ft
