#include "trainer/data/preference_data.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "kernels/error.h"

namespace ft {

std::vector<PreferencePair> load_preference_jsonl(const std::string& path) {
  const std::string expected =
      "\"prompt\", \"chosen\" and \"rejected\" strings (preference pairs: objective: dpo and reward read them)";
  std::vector<PreferencePair> pairs;
  read_jsonl_rows(path, "data file", expected, [&](const nlohmann::json& row, const std::string& where) {
    for (const char* field : {"prompt", "chosen", "rejected"})
      FT_CHECK(row.contains(field), where, ": row lacks \"", field, "\": expected ", expected, ", got ",
               key_list(row));
    pairs.push_back({string_field(row, "prompt", where), string_field(row, "chosen", where),
                     string_field(row, "rejected", where)});
  });
  return pairs;
}

TokenizedPairs tokenize_pairs(const std::vector<PreferencePair>& pairs, const std::string& path,
                              const Tokenizer& tokenizer, int64_t seq_len, int32_t eos_id) {
  TokenizedPairs out;
  for (const PreferencePair& pair : pairs) {
    bool chosen_cut = false, rejected_cut = false;
    // trl's DPOTrainer: both completions start where the shorter of the two shared prefixes ends.
    const std::vector<int32_t> prompt = text_tokens(tokenizer, pair.prompt);
    std::vector<int32_t> whole_chosen = text_tokens(tokenizer, pair.prompt + pair.chosen);
    std::vector<int32_t> whole_rejected = text_tokens(tokenizer, pair.prompt + pair.rejected);
    const size_t prompt_tokens =
        std::min(common_prefix_length(prompt, whole_chosen), common_prefix_length(prompt, whole_rejected));
    TokenSequence chosen = completion_sequence(std::move(whole_chosen), prompt_tokens, eos_id, seq_len, chosen_cut);
    TokenSequence rejected =
        completion_sequence(std::move(whole_rejected), prompt_tokens, eos_id, seq_len, rejected_cut);
    out.truncated_count += chosen_cut + rejected_cut;
    if (loss_token_count(chosen) == 0 || loss_token_count(rejected) == 0) {
      out.dropped_count++;
      continue;
    }
    out.chosen.push_back(std::move(chosen));
    out.rejected.push_back(std::move(rejected));
  }
  FT_CHECK(!out.chosen.empty(), path, ": no pair has a completion token on both sides within seq_len = ", seq_len,
           " (all ", out.dropped_count, " prompts fill the window)");
  return out;
}

TokenizedPairs packed_pairs(const TokenizedPairs& pairs, int64_t seq_len) {
  std::vector<int64_t> slots;
  for (size_t i = 0; i < pairs.chosen.size(); ++i)
    slots.push_back(std::max(input_slots(pairs.chosen[i]), input_slots(pairs.rejected[i])));
  const std::vector<std::vector<size_t>> groups = best_fit_decreasing(slots, seq_len);
  return {join_examples(pairs.chosen, groups), join_examples(pairs.rejected, groups), pairs.truncated_count,
          pairs.dropped_count};
}

PreferenceLoader::PreferenceLoader(const TokenizedPairs& pairs, int64_t pairs_per_batch, int64_t seq_len,
                                   int32_t pad_id, uint64_t seed, Allocator& host_allocator)
    : chosen_(pairs.chosen, pairs_per_batch, seq_len, pad_id, seed, host_allocator),
      rejected_(pairs.rejected, pairs_per_batch, seq_len, pad_id, seed, host_allocator),
      allocator_(host_allocator) {}

Batch PreferenceLoader::next() {
  Batch chosen = chosen_.next();
  return stacked(chosen, rejected_.next());
}

Batch PreferenceLoader::batch_in_order(int64_t index) const {
  return stacked(chosen_.batch_in_order(index), rejected_.batch_in_order(index));
}

void PreferenceLoader::set_position(DataPosition position) {
  chosen_.set_position(position);
  rejected_.set_position(position);
}

// The chosen rows, then the rejected rows.
Batch PreferenceLoader::stacked(const Batch& chosen, const Batch& rejected) const {
  const int64_t P = chosen.input_ids.dim(0), T = chosen.input_ids.dim(1), n = P * T;
  Batch batch{Tensor::empty({2 * P, T}, DType::i32, allocator_, MemCategory::activations),
              Tensor::empty({2 * P, T}, DType::i32, allocator_, MemCategory::activations),
              chosen.counted_tokens + rejected.counted_tokens};
  std::copy_n(chosen.input_ids.ptr<int32_t>(), n, batch.input_ids.ptr<int32_t>());
  std::copy_n(rejected.input_ids.ptr<int32_t>(), n, batch.input_ids.ptr<int32_t>() + n);
  std::copy_n(chosen.targets.ptr<int32_t>(), n, batch.targets.ptr<int32_t>());
  std::copy_n(rejected.targets.ptr<int32_t>(), n, batch.targets.ptr<int32_t>() + n);
  if (!chosen.position_ids.defined()) return batch;
  batch.position_ids = Tensor::empty({2 * P, T}, DType::i32, allocator_, MemCategory::activations);
  std::copy_n(chosen.position_ids.ptr<int32_t>(), n, batch.position_ids.ptr<int32_t>());
  std::copy_n(rejected.position_ids.ptr<int32_t>(), n, batch.position_ids.ptr<int32_t>() + n);
  return batch;
}

}  // namespace ft
