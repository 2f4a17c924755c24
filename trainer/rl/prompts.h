// The prompt rows of online RL (objective: grpo, ppo): JSONL rows with a
// "prompt" string, or, as trl's conversational prompts, a "prompt" list of
// {"role", "content"} messages (system, user, assistant), which the policy's
// chat template renders with add_generation_prompt, whatever the last role,
// as trl's GRPOTrainer tokenizes them (_tokenize_prompts); a file's rows take
// one form, as trl decides by the first. Their other fields are there for the
// rewards (e.g. a reference text for rewards.rouge, an answer for
// rewards.answer). Drawn in a shuffled order per epoch, as the data loader
// draws training rows, so a run resumed at a position draws the same prompts.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/families.h"
#include "tokenizer/tokenizer.h"
#include "trainer/data/data.h"

namespace ft {

struct RewardRules;

struct PromptRow {
  nlohmann::json row;
  std::string prompt;  // the text: a conversational prompt's as the chat template renders it
  // A decoder-only policy's: bos (when the tokenizer adds one) and the
  // prompt, its end kept within max_prompt_tokens (a conversational prompt's
  // rendering encoded alone: the template writes its special tokens, as
  // apply_chat_template tokenizes); a seq2seq policy's encoder tokens: the
  // prompt, its start kept, then eos (as tokenize_seq2seq_example).
  std::vector<int32_t> tokens;
  // A conversational prompt's messages as written (key order kept: a template
  // may write them with tojson); null for a "prompt" string.
  nlohmann::ordered_json messages = nullptr;
};

// Every row of path; a row without a "prompt" string or list of messages,
// one whose form is not the first row's, or one the rule rewards cannot
// score (check_reward_fields), is an Error naming the line. chat renders
// conversational prompts (a decoder-only policy's only).
std::vector<PromptRow> load_prompt_rows(const std::string& path, const Tokenizer& tokenizer,
                                        int64_t max_prompt_tokens, ModelKind kind = ModelKind::causal,
                                        const RewardRules* rewards = nullptr, const ChatTemplate* chat = nullptr);

// The policy's chat template (resolve_chat_template(configured,
// tokenizer_dir)) when a row of these prompt files (empty paths skipped) is
// conversational, else nullopt: found, or refused, before the weights load.
// No template, or a seq2seq policy (it has none), is an Error naming the
// first such row (file:line).
std::optional<ChatTemplate> prompt_chat_template(const std::vector<std::string>& paths, ChatTemplateKind configured,
                                                 const std::string& tokenizer_dir, ModelKind kind);

class PromptLoader {
 public:
  PromptLoader(std::vector<PromptRow> rows, uint64_t seed);
  // The next count prompts of the shuffled order (the next epoch's order after the last).
  std::vector<const PromptRow*> next(int64_t count);
  const std::vector<PromptRow>& rows() const { return rows_; }
  // index: prompts drawn within the epoch.
  DataPosition position() const { return position_; }
  void set_position(DataPosition position);

 private:
  std::vector<PromptRow> rows_;
  uint64_t seed_;
  DataPosition position_;
  std::vector<int64_t> order_;
};

}  // namespace ft
