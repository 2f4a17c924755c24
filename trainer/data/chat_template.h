// Chat conversations rendered as the common chat templates render them, without
// running Jinja: the checkpoint's tokenizer_config.json `chat_template` is
// recognised by its distinctive markers, or data.chat_template names one.
//
//   chatml  <|im_start|>{role}\n{content}<|im_end|>\n per message (Qwen2's
//           default system message is kept when its template has one)
//   llama2  <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s>
//           (bos before every user turn, contents stripped, roles alternate)
//   llama3  <|begin_of_text|> then <|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>
//   zephyr  <|{role}|>\n{content}</s>\n per message
//
// The rendered text is what transformers' apply_chat_template produces; pieces
// flagged `loss` are an assistant turn's content and its end marker.
#pragma once
#include <string>
#include <vector>

#include "trainer/enum_names.h"

namespace ft {

enum class ChatTemplateKind { automatic, chatml, llama2, llama3, zephyr };
EnumNames<ChatTemplateKind> enum_names(ChatTemplateKind);  // data.chat_template's spellings (trainer/enum_names.h)

struct ChatMessage {
  std::string role;  // system, user or assistant
  std::string content;
};

struct ChatTemplate {
  ChatTemplateKind kind = ChatTemplateKind::automatic;
  std::string bos_token = "<s>";  // tokenizer_config.json's, else the family's
  std::string eos_token = "</s>";
  std::string default_system;     // chatml: the system message a template adds when a conversation has none
  std::string source;             // where the choice came from: the option that named it, or the template's file
};

struct RenderedPiece {
  std::string text;
  bool loss;
};

// Which family a Jinja chat_template string is; automatic when none matches.
ChatTemplateKind recognise_chat_template(const std::string& jinja);

// The template to render with: `configured` unless automatic, else the one
// recognised in tokenizer_dir's tokenizer_config.json (or chat_template.jinja).
// Special-token strings come from that tokenizer_config.json when present.
// An unrecognised or missing template is an Error naming the file and
// `setting`, the option that names one (data.chat_template, or generate's
// --chat-template).
ChatTemplate resolve_chat_template(ChatTemplateKind configured, const std::string& tokenizer_dir,
                                   const char* setting = "data.chat_template");

// Roles every template takes: a non-empty list of system, user and assistant
// messages ending with an assistant turn (training needs one to learn from).
// Errors name `where` (file:line) and the message index.
void check_chat_roles(const std::vector<ChatMessage>& messages, const std::string& where);

// The conversation as the template renders it for training. `where` (file:line)
// names the row in errors: roles the template cannot take (llama2: user and
// assistant must alternate) or a last message that is not the assistant's.
std::vector<RenderedPiece> render_chat(const ChatTemplate& chat, const std::vector<ChatMessage>& messages,
                                       const std::string& where);

}  // namespace ft
