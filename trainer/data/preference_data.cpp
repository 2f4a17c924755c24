#include "trainer/data/preference_data.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "kernels/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "trainer/data/chat_template.h"

namespace ft {

namespace {

// The conversation of the prompt then one side, as a chat example keeps it.
nlohmann::ordered_json side_conversation(const nlohmann::ordered_json& conversation, const char* side) {
  return prompt_and_reply(conversation["prompt"], conversation[side], conversation["tools"]);
}

// trl's conversational pair, its prompt extracted where left out (extract_prompt:
// the messages before the first where chosen and rejected differ).
PreferencePair conversational_pair(const std::string& line, const std::string& where) {
  nlohmann::ordered_json row = nlohmann::ordered_json::parse(line);
  for (const char* side : {"chosen", "rejected"})
    FT_CHECK(row.contains(side) && row[side].is_array() && !row[side].empty(), where, ": \"", side,
             "\" must be a non-empty list of messages in a conversational pair (trl's), got ",
             row.value(side, nlohmann::ordered_json()).dump().substr(0, 60));
  if (!row.contains("prompt")) {
    const nlohmann::ordered_json chosen = row["chosen"], rejected = row["rejected"];  // copies: row grows below
    size_t shared = 0;
    while (shared + 1 < std::min(chosen.size(), rejected.size()) && chosen[shared] == rejected[shared]) shared++;
    row["prompt"] = nlohmann::ordered_json(chosen.begin(), chosen.begin() + long(shared));
    row["chosen"] = nlohmann::ordered_json(chosen.begin() + long(shared), chosen.end());
    row["rejected"] = nlohmann::ordered_json(rejected.begin() + long(shared), rejected.end());
  }
  FT_CHECK(row["prompt"].is_array() && !row["prompt"].empty(), where,
           ": \"prompt\" must be a non-empty list of messages in a conversational pair, got ",
           row["prompt"].dump().substr(0, 60));
  PreferencePair pair{"", "", "", {{"prompt", row["prompt"]}, {"chosen", row["chosen"]}, {"rejected", row["rejected"]},
                                   {"tools", row_tools(row, where)}}};
  for (const char* side : {"chosen", "rejected"})  // each conversation checked as a training row
    written_conversation(side_conversation(pair.conversation, side), where + " (" + side + ")", false);
  pair.chosen = message_text(row["chosen"].back());
  pair.rejected = message_text(row["rejected"].back());
  return pair;
}

// trl's extract_prompt on strings: the characters (code points) chosen and
// rejected share up to the first that differs, less a space just before it;
// when one is a prefix of the other, all but the shorter's last character.
// (Where they differ from the first character, trl's chosen[idx - 1] reads
// the last one; the prompt here is empty.)
void extract_text_prompt(PreferencePair& pair, const std::string& where) {
  const std::u32string chosen = unicode::decode_utf8(pair.chosen, where);
  const std::u32string rejected = unicode::decode_utf8(pair.rejected, where);
  FT_CHECK(!chosen.empty() && !rejected.empty(), where, ": the row has no \"prompt\", so it is the text \"chosen\" "
           "and \"rejected\" share (trl's extract_prompt), which needs both non-empty");
  size_t shared = 0;
  while (shared + 1 < std::min(chosen.size(), rejected.size()) && chosen[shared] == rejected[shared]) shared++;
  if (chosen[shared] != rejected[shared] && shared > 0 && chosen[shared - 1] == U' ') shared--;
  pair.prompt = unicode::encode_utf8(chosen.substr(0, shared));
  pair.chosen = unicode::encode_utf8(chosen.substr(shared));
  pair.rejected = unicode::encode_utf8(rejected.substr(shared));
}

std::optional<double> margin_field(const nlohmann::json& row, const std::string& where) {
  if (!row.contains("margin")) return std::nullopt;
  const nlohmann::json& margin = row["margin"];
  FT_CHECK(margin.is_number() && std::isfinite(margin.get<double>()), where, ": \"margin\" must be a finite number "
           "(trl's RewardTrainer subtracts it from the pair's score difference), got ", margin.dump().substr(0, 60));
  return margin.get<double>();
}

}  // namespace

std::vector<PreferencePair> load_preference_jsonl(const std::string& path, bool read_margins) {
  const std::string expected =
      "\"chosen\" and \"rejected\" strings or lists of messages, and the \"prompt\" they follow (preference pairs: "
      "objective: dpo and reward read them)";
  std::vector<PreferencePair> pairs;
  std::string with_margin, without_margin;  // the first rows that have one, and that lack one
  read_jsonl_lines(path, "data file", expected,
                   [&](const std::string& line, const nlohmann::json& row, const std::string& where) {
    auto listed = [&](const char* key) { return row.contains(key) && row[key].is_array(); };
    if (listed("prompt") || listed("chosen") || listed("rejected")) {
      pairs.push_back(conversational_pair(line, where));
    } else {
      for (const char* field : {"chosen", "rejected"})
        FT_CHECK(row.contains(field), where, ": row lacks \"", field, "\": expected ", expected, ", got ",
                 key_list(row));
      pairs.push_back({row.contains("prompt") ? string_field(row, "prompt", where) : "",
                       string_field(row, "chosen", where), string_field(row, "rejected", where)});
      if (!row.contains("prompt")) extract_text_prompt(pairs.back(), where);
    }
    if (!read_margins) return;
    pairs.back().margin = margin_field(row, where);
    std::string& first = pairs.back().margin ? with_margin : without_margin;
    if (first.empty()) first = where;
  });
  FT_CHECK(with_margin.empty() || without_margin.empty(), without_margin, ": no \"margin\", which line ",
           with_margin.substr(with_margin.rfind(':') + 1), " gives: trl's RewardTrainer needs the column on every row "
           "or on none");
  return pairs;
}

Example chosen_example(const PreferencePair& pair) {
  if (pair.conversation.is_null()) return {pair.prompt, pair.chosen};
  Example example;
  example.conversation = side_conversation(pair.conversation, "chosen");
  for (const nlohmann::ordered_json& m : example.conversation["messages"])
    example.messages.push_back({m["role"].get<std::string>(), message_text(m)});
  return example;
}

TokenizedPairs tokenize_pairs(const std::vector<PreferencePair>& pairs, const std::string& path,
                              const Tokenizer& tokenizer, int64_t seq_len, int32_t eos_id, const ChatTemplate* chat,
                              bool drop_too_long) {
  TokenizedPairs out;
  for (const PreferencePair& pair : pairs) {
    bool chosen_cut = false, rejected_cut = false;
    // trl's DPOTrainer: both completions start where the shorter of the two shared prefixes ends.
    std::vector<int32_t> prompt, whole_chosen, whole_rejected;
    if (pair.conversation.is_null()) {
      prompt = text_tokens(tokenizer, pair.prompt);
      whole_chosen = text_tokens(tokenizer, pair.prompt + pair.chosen);
      whole_rejected = text_tokens(tokenizer, pair.prompt + pair.rejected);
    } else {  // the template writes the end markers: no eos is added
      FT_CHECK(chat, path, ": conversational pairs need a chat template");
      const nlohmann::ordered_json& c = pair.conversation;
      prompt = tokenizer.encode(reply_prompt(*chat, c["prompt"], c["tools"], path));
      auto side = [&](const char* name) {
        return tokenizer.encode(render_chat_text(*chat, side_conversation(c, name)["messages"], c["tools"], false, path));
      };
      whole_chosen = side("chosen");
      whole_rejected = side("rejected");
    }
    const int32_t pair_eos_id = pair.conversation.is_null() ? eos_id : -1;
    const size_t prompt_tokens =
        std::min(common_prefix_length(prompt, whole_chosen), common_prefix_length(prompt, whole_rejected));
    TokenSequence chosen = completion_sequence(std::move(whole_chosen), prompt_tokens, pair_eos_id, seq_len, chosen_cut);
    TokenSequence rejected =
        completion_sequence(std::move(whole_rejected), prompt_tokens, pair_eos_id, seq_len, rejected_cut);
    if (drop_too_long && (chosen_cut || rejected_cut)) {
      out.too_long_count++;
      continue;
    }
    out.truncated_count += chosen_cut + rejected_cut;
    if (loss_token_count(chosen) == 0 || loss_token_count(rejected) == 0) {
      out.dropped_count++;
      continue;
    }
    out.chosen.push_back(std::move(chosen));
    out.rejected.push_back(std::move(rejected));
    if (pair.margin) out.margins.push_back(*pair.margin);
  }
  FT_CHECK(!out.chosen.empty(), path, ": no pair has a completion token on both sides within seq_len = ", seq_len,
           " (", out.dropped_count, " prompts fill the window, ", out.too_long_count, " pairs are longer)");
  return out;
}

TokenizedPairs packed_pairs(const TokenizedPairs& pairs, int64_t seq_len) {
  std::vector<int64_t> slots;
  for (size_t i = 0; i < pairs.chosen.size(); ++i)
    slots.push_back(std::max(input_slots(pairs.chosen[i]), input_slots(pairs.rejected[i])));
  const std::vector<std::vector<size_t>> groups = best_fit_decreasing(slots, seq_len);
  return {join_examples(pairs.chosen, groups), join_examples(pairs.rejected, groups), {}, pairs.truncated_count,
          pairs.dropped_count};
}

PreferenceLoader::PreferenceLoader(const TokenizedPairs& pairs, int64_t pairs_per_batch, int64_t seq_len,
                                   int32_t pad_id, uint64_t seed, Allocator& host_allocator)
    : chosen_(pairs.chosen, pairs_per_batch, seq_len, pad_id, seed, host_allocator),
      rejected_(pairs.rejected, pairs_per_batch, seq_len, pad_id, seed, host_allocator),
      margins_(pairs.margins),
      pairs_per_batch_(pairs_per_batch),
      allocator_(host_allocator) {
  FT_CHECK(margins_.empty() || margins_.size() == pairs.chosen.size(), "PreferenceLoader: ", margins_.size(),
           " margins for ", pairs.chosen.size(), " pairs");
}

Batch PreferenceLoader::next() {
  const std::vector<int64_t> rows = margins_.empty() ? std::vector<int64_t>{} : chosen_.next_rows();
  Batch chosen = chosen_.next();
  Batch batch = stacked(chosen, rejected_.next());
  batch.margins = batch_margins(rows);
  return batch;
}

Batch PreferenceLoader::batch_in_order(int64_t index) const {
  Batch batch = stacked(chosen_.batch_in_order(index), rejected_.batch_in_order(index));
  std::vector<int64_t> rows;
  for (int64_t row = index * pairs_per_batch_; row < std::min(row_count(), (index + 1) * pairs_per_batch_); ++row)
    rows.push_back(row);
  batch.margins = batch_margins(rows);
  return batch;
}

// The margins of a micro-batch of those rows, 0 for an epoch's padding pairs; none when the pairs have none.
std::vector<double> PreferenceLoader::batch_margins(const std::vector<int64_t>& rows) const {
  if (margins_.empty()) return {};
  std::vector<double> margins(size_t(pairs_per_batch_), 0.0);
  for (size_t b = 0; b < rows.size(); ++b) margins[b] = margins_[size_t(rows[b])];
  return margins;
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
