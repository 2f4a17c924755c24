// The rewards of online RL (objective: grpo, ppo): built-in rules over a
// completion's text and its prompt row's fields, and a reward model, summed
// with their weights (trl's reward_funcs with reward_weights). Rules:
//   regex:  1 when the completion matches the pattern (PCRE2, a search:
//           anchor it with ^ and $ to match the whole completion), else 0;
//   rouge:  ROUGE-L F1 of the completion against the row's field (rouge.h);
//   answer: 1 when the last number in the completion equals the row's
//           field read as a number (a final answer, GSM8K-style), else 0;
//   length: -|completion tokens - target| / target;
//   model:  a reward model's score of prompt + completion (reward.h); with
//           conversational prompts, of the prompt's messages and the
//           completion as an assistant message, rendered with the reward
//           tokenizer's chat template (trl's GRPOTrainer).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/causal_lm.h"
#include "tokenizer/tokenizer.h"
#include "trainer/data/chat_template.h"

namespace ft {

struct RewardRules {
  std::string regex;
  double regex_weight = 1.0;
  std::string rouge;  // the row field holding the reference text
  double rouge_weight = 1.0;
  std::string answer;  // the row field holding the final answer
  double answer_weight = 1.0;
  int64_t length = 0;  // target completion tokens; 0 = no length reward
  double length_weight = 1.0;
  std::string model;          // a reward model folder (resolved); "" = none
  std::string model_adapter;  // its SEQ_CLS adapter folder, or ""
  // The reward model's own tokenizer file: prompt and completion text are
  // encoded anew with it. "" = the policy's, which the model's folder must
  // then hold too (a different one is refused).
  std::string model_tokenizer;
  double model_weight = 1.0;
  // The rules configured, by the names of their metrics ("regex", "rouge", ...).
  std::vector<std::string> names() const;
};

// Refuses a prompt row that rules.rouge or rules.answer cannot score (its
// field missing or not a string; for answer, no number in it), at where
// (file:line), when the data loads rather than when the row is drawn.
void check_reward_fields(const RewardRules& rules, const nlohmann::json& row, const std::string& where);

// One completion (a rollout) to reward: its prompt row (the data file's JSON row), its text and tokens.
struct Rollout {
  const nlohmann::json* row = nullptr;
  std::string prompt;                          // the row's prompt text
  std::vector<int32_t> prompt_tokens, tokens;  // tokens: the completion's, its eos included when it ended so
  std::string text;                            // decoded completion, eos excluded
  const nlohmann::ordered_json* messages = nullptr;  // PromptRow::messages: a conversational prompt's, else null
};

// The reward model's chat template for conversational prompts: its
// tokenizer's own (tokenizer_file's folder), as trl's GRPOTrainer renders
// them with the reward processing class; none is an Error saying why one is needed.
ChatTemplate reward_chat_template(const std::string& tokenizer_file);
// What a reward model reads for a conversational rollout (trl's
// _calculate_rewards): the prompt's messages then {"role": "assistant",
// "content": text}, rendered by `chat` without a generation prompt and
// encoded alone (add_special_tokens=False: the template writes its own).
std::vector<int32_t> conversation_reward_tokens(const Rollout& rollout, const Tokenizer& tokenizer,
                                                const ChatTemplate& chat);

// rules.model as a reward model on backend, built with options
// (setup.h's reward_model_options: the policy's quantisation and precision,
// the score head and the adapter). policy_tokenizer_file: the file the
// policy's tokens come from. A seq2seq policy's prompt tokens are its
// encoder's (no bos, an eos after the prompt): with policy_seq2seq the
// text is encoded anew, as with rules.model_tokenizer. With
// conversational_prompts every rollout is scored as
// conversation_reward_tokens with the reward tokenizer (rules.model_tokenizer,
// else the model folder's) and its reward_chat_template. scores() runs
// rows_per_forward rows a forward.
class RewardModel {
 public:
  RewardModel(const RewardRules& rules, Backend& backend, const ModelOptions& options,
              const std::string& policy_tokenizer_file, bool policy_seq2seq, int64_t rows_per_forward,
              bool conversational_prompts = false);
  ~RewardModel();
  std::vector<double> scores(const std::vector<Rollout>& completions) const;

 private:
  std::unique_ptr<CausalLM> model_;
  std::unique_ptr<Tokenizer> tokenizer_;  // set: prompts and completions encoded anew (rules.model_tokenizer, seq2seq)
  std::optional<ChatTemplate> chat_;      // set with conversational prompts: they are rendered with it
  int32_t pad_id_ = 0, eos_id_ = 0;
  int64_t rows_per_forward_ = 1;
};

// Per reward rule (in names() order) the value of each completion, and the
// weighted sum. reward_model: null unless rules.model is set.
struct Rewards {
  std::vector<std::string> names;
  std::vector<std::vector<double>> values;  // [rule][completion]
  std::vector<double> total;                // [completion]
  nlohmann::json metrics() const;           // trl's rewards/<name>/mean, rewards/<name>/std, reward
};
Rewards compute_rewards(const RewardRules& rules, const std::vector<Rollout>& completions,
                        const RewardModel* reward_model);

}  // namespace ft
