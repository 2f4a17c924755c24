#include "trainer/rl/prompts.h"

#include <algorithm>

#include "kernels/error.h"
#include "trainer/evaluate.h"
#include "trainer/rl/rewards.h"

namespace ft {

namespace {

const char* const kExpected = "a \"prompt\" string or list of messages";

// trl's is_conversational: the prompt is a list (of messages).
bool conversational(const nlohmann::json& row) { return row.contains("prompt") && row["prompt"].is_array(); }

// A chat template renders conversational prompts for a decoder-only policy; a
// seq2seq one has none (transformers refuses apply_chat_template without one).
void check_conversational_policy(ModelKind kind, const std::string& where) {
  FT_CHECK(kind != ModelKind::seq2seq, where, ": \"prompt\" is a list of messages (trl's conversational prompt), "
           "which a decoder-only policy's chat template renders; this policy is an encoder-decoder (seq2seq) model "
           "without one: give \"prompt\" strings");
}

// A conversational row's messages as written, checked: a non-empty list of
// {"role", "content"} strings, each role system, user or assistant.
nlohmann::ordered_json prompt_messages(const std::string& line, const nlohmann::json& row, const std::string& where) {
  const std::string field = where + ": \"prompt\"";
  FT_CHECK(!row["prompt"].empty(), field, " is an empty list (expected ", kExpected, ")");
  check_message_roles(chat_messages(nlohmann::json{{"messages", row["prompt"]}}, field), field);
  return nlohmann::ordered_json::parse(line)["prompt"];
}

// The policy's tokens for a row's prompt text (see PromptRow::tokens).
std::vector<int32_t> policy_prompt_tokens(const PromptRow& row, const Tokenizer& tokenizer, int64_t max_prompt_tokens,
                                          ModelKind kind, const std::string& where) {
  std::vector<int32_t> tokens;
  if (kind == ModelKind::seq2seq) {
    FT_CHECK(tokenizer.eos_id() >= 0, where, ": a seq2seq policy's prompt ends with eos; the tokenizer has none");
    tokens = tokenizer.encode(row.prompt);
    tokens.resize(std::min<size_t>(tokens.size(), size_t(std::max<int64_t>(max_prompt_tokens - 1, 0))));
    tokens.push_back(tokenizer.eos_id());
    return tokens;
  }
  tokens = prompt_tokens(tokenizer, row.prompt, row.messages.is_null() ? PromptForm::text : PromptForm::chat);
  FT_CHECK(!tokens.empty(), where, ": \"prompt\" is empty and the tokenizer adds no bos token, so the policy would "
           "have no token to generate from (give every prompt some text)");
  // The prompt's end is kept (as transformers' left truncation): it leads into the completion.
  if (int64_t(tokens.size()) > max_prompt_tokens) tokens.erase(tokens.begin(), tokens.end() - max_prompt_tokens);
  return tokens;
}

}  // namespace

std::vector<PromptRow> load_prompt_rows(const std::string& path, const Tokenizer& tokenizer,
                                        int64_t max_prompt_tokens, ModelKind kind, const RewardRules* rewards,
                                        const ChatTemplate* chat) {
  std::vector<PromptRow> rows;
  read_jsonl_lines(path, "prompt file", kExpected,
                   [&](const std::string& line, const nlohmann::json& row, const std::string& where) {
    FT_CHECK(row.contains("prompt"), where, ": row lacks \"prompt\": expected a \"prompt\" string or list of "
             "messages (objective: grpo and ppo generate from prompts), got ", key_list(row));
    FT_CHECK(row["prompt"].is_string() || row["prompt"].is_array(), where, ": \"prompt\" must be a string or a "
             "list of {\"role\", \"content\"} messages (trl's conversational prompt), got ", row["prompt"].type_name());
    // trl tells the forms apart by the first row (is_conversational(prompts[0])).
    FT_CHECK(rows.empty() || conversational(row) == !rows[0].messages.is_null(), where, ": \"prompt\" is a ",
             conversational(row) ? "list of messages" : "string", " and the first row's is not: give every row's "
             "prompt in one form");
    PromptRow out{row, "", {}, nullptr};
    if (conversational(row)) {
      check_conversational_policy(kind, where);
      FT_CHECK(chat, where, ": \"prompt\" is a list of messages (trl's conversational prompt), and no chat template "
               "was given to render it");
      out.messages = prompt_messages(line, row, where);
      out.prompt = reply_prompt(*chat, out.messages, nullptr, where);
    } else {
      out.prompt = row["prompt"].get<std::string>();
    }
    if (rewards) check_reward_fields(*rewards, row, where);
    out.tokens = policy_prompt_tokens(out, tokenizer, max_prompt_tokens, kind, where);
    rows.push_back(std::move(out));
  });
  FT_CHECK(!rows.empty(), path, ": no prompt rows");
  return rows;
}

std::optional<ChatTemplate> prompt_chat_template(const std::vector<std::string>& paths, ChatTemplateKind configured,
                                                 const std::string& tokenizer_dir, ModelKind kind) {
  std::string first;  // the first conversational row, "path:line"
  for (const std::string& path : paths) {
    if (path.empty() || !first.empty()) continue;
    read_jsonl_rows(path, "prompt file", kExpected, [&](const nlohmann::json& row, const std::string& where) {
      if (first.empty() && conversational(row)) first = where;
    });
  }
  if (first.empty()) return std::nullopt;
  check_conversational_policy(kind, first);
  try {
    return resolve_chat_template(configured, tokenizer_dir);
  } catch (const Error& e) {
    fail(first, ": \"prompt\" is a list of messages (trl's conversational prompt), which the policy's chat template "
         "renders: ", e.what());
  }
}

PromptLoader::PromptLoader(std::vector<PromptRow> rows, uint64_t seed)
    : rows_(std::move(rows)), seed_(seed), order_(shuffled_order(int64_t(rows_.size()), seed, 0)) {}

std::vector<const PromptRow*> PromptLoader::next(int64_t count) {
  std::vector<const PromptRow*> out;
  for (int64_t i = 0; i < count; ++i) {
    if (position_.index == int64_t(rows_.size())) {
      position_ = {position_.epoch + 1, 0};
      order_ = shuffled_order(int64_t(rows_.size()), seed_, position_.epoch);
    }
    out.push_back(&rows_[size_t(order_[size_t(position_.index++)])]);
  }
  return out;
}

void PromptLoader::set_position(DataPosition position) {
  FT_CHECK(position.index >= 0 && position.index <= int64_t(rows_.size()), "the checkpoint's prompt position ",
           position.index, " is past the ", rows_.size(), " prompt rows");
  position_ = position;
  order_ = shuffled_order(int64_t(rows_.size()), seed_, position.epoch);
}

}  // namespace ft
