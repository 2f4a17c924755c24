#include "trainer/rl/prompts.h"

#include <algorithm>

#include "kernels/error.h"
#include "trainer/evaluate.h"
#include "trainer/rl/rewards.h"

namespace ft {

std::vector<PromptRow> load_prompt_rows(const std::string& path, const Tokenizer& tokenizer,
                                        int64_t max_prompt_tokens, ModelKind kind, const RewardRules* rewards) {
  std::vector<PromptRow> rows;
  read_jsonl_rows(path, "prompt file", "a \"prompt\" string", [&](const nlohmann::json& row, const std::string& where) {
    FT_CHECK(row.contains("prompt"), where, ": row lacks \"prompt\": expected a \"prompt\" string (objective: grpo "
             "and ppo generate from prompts), got ", key_list(row));
    PromptRow out{row, string_field(row, "prompt", where), {}};
    if (rewards) check_reward_fields(*rewards, row, where);
    if (kind == ModelKind::seq2seq) {
      FT_CHECK(tokenizer.eos_id() >= 0, where, ": a seq2seq policy's prompt ends with eos; the tokenizer has none");
      out.tokens = tokenizer.encode(out.prompt);
      out.tokens.resize(std::min<size_t>(out.tokens.size(), size_t(std::max<int64_t>(max_prompt_tokens - 1, 0))));
      out.tokens.push_back(tokenizer.eos_id());
    } else {
      out.tokens = prompt_tokens(tokenizer, out.prompt);
      // The prompt's end is kept (as transformers' left truncation): it leads into the completion.
      if (int64_t(out.tokens.size()) > max_prompt_tokens)
        out.tokens.erase(out.tokens.begin(), out.tokens.end() - max_prompt_tokens);
    }
    rows.push_back(std::move(out));
  });
  FT_CHECK(!rows.empty(), path, ": no prompt rows");
  return rows;
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
