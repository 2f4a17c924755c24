// The prompt rows of online RL (objective: grpo, ppo): JSONL rows with a
// "prompt" string; their other fields are there for the rewards (e.g. a
// reference text for rewards.rouge, an answer for rewards.answer). Drawn in
// a shuffled order per epoch, as the data loader draws training rows, so a
// run resumed at a position draws the same prompts.
#pragma once
#include <cstdint>
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
  std::string prompt;
  // A decoder-only policy's: bos (when the tokenizer adds one) and the
  // prompt, its end kept within max_prompt_tokens; a seq2seq policy's
  // encoder tokens: the prompt, its start kept, then eos (as
  // tokenize_seq2seq_example).
  std::vector<int32_t> tokens;
};

// Every row of path; a row without a "prompt" string, or one the rule
// rewards cannot score (check_reward_fields), is an Error naming the line.
std::vector<PromptRow> load_prompt_rows(const std::string& path, const Tokenizer& tokenizer,
                                        int64_t max_prompt_tokens, ModelKind kind = ModelKind::causal,
                                        const RewardRules* rewards = nullptr);

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
