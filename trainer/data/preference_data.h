// Preference data for objective: dpo: JSONL rows {"prompt", "chosen",
// "rejected"} -> token pairs (each completion tokenized as an SFT example:
// prompt masked, loss on the completion and eos) -> micro-batches of pairs.
// A micro-batch of P pairs is one [2P, seq_len] batch, trl's layout: rows
// [0, P) the chosen completions, rows [P, 2P) the rejected ones, pair i in
// rows i and P + i. With padding-free packing a micro-batch holds P pairs of
// packed rows instead: row i holds several pairs' chosen completions and
// row P + i the same pairs' rejected ones, in the same order.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trainer/data/data.h"

namespace ft {

struct PreferencePair {
  std::string prompt, chosen, rejected;
  // trl's conversational pair, kept as written: {"prompt", "chosen",
  // "rejected"} lists of messages and "tools" (null when none); null for a
  // pair of strings.
  nlohmann::ordered_json conversation = nullptr;
  // trl's RewardTrainer "margin" column, read for objective: reward.
  std::optional<double> margin = std::nullopt;
};

// Every row must hold "prompt", "chosen" and "rejected" strings, or, as trl's
// conversational pairs, lists of messages. The prompt may be left out, as
// trl's extract_prompt takes it: the messages chosen and rejected share, or
// for strings the text they share up to the first character where they
// differ, less a space just before it. With read_margins (objective:
// reward) a "margin" number is read, on every row or none, as trl's
// RewardTrainer needs it; other fields are ignored. Errors name the file,
// the line and the field.
std::vector<PreferencePair> load_preference_jsonl(const std::string& path, bool read_margins = false);

// The pair's prompt and chosen completion as one example (a chat example of
// its conversation for a conversational pair), for samples.
Example chosen_example(const PreferencePair& pair);

struct TokenizedPairs {
  std::vector<TokenSequence> chosen, rejected;  // pair i: chosen[i], rejected[i]
  std::vector<double> margins;                  // pair i's margin; empty when the pairs have none
  int64_t truncated_count = 0;  // completions cut to seq_len + 1 tokens
  int64_t dropped_count = 0;    // pairs where a completion kept no loss token
  int64_t too_long_count = 0;   // with drop_too_long: pairs with a side over seq_len + 1 tokens
};

// Each side as tokenize_example makes it (a conversational pair's as
// tokenize_chat_completion, which `chat` renders), both completions starting
// where the shorter of the two prompt prefixes ends (trl's DPOTrainer); a
// pair is dropped when either side has no loss token left, an error if none
// is left. drop_too_long (a reward model's pairs): a pair with a side longer
// than seq_len + 1 tokens is dropped rather than cut, as trl's RewardTrainer
// filters pairs over max_length (a score read at a cut token is not what
// the model will score).
TokenizedPairs tokenize_pairs(const std::vector<PreferencePair>& pairs, const std::string& path,
                              const Tokenizer& tokenizer, int64_t seq_len, int32_t eos_id,
                              const ChatTemplate* chat = nullptr, bool drop_too_long = false);

// Padding-free packing of pairs: the pairs grouped by best-fit decreasing on
// their longer side's inputs, group i's chosen completions joined into
// chosen row i and its rejected ones, in the same order, into rejected row i.
// Margins are left out (objective: reward, which reads them, packs nothing).
TokenizedPairs packed_pairs(const TokenizedPairs& pairs, int64_t seq_len);

// Two DataLoaders over the chosen and the rejected rows (one pair each, or
// packed_pairs') with the same seed, so they shuffle alike and stay in step:
// pairs are never split. Each batch carries its pairs' margins (Batch::margins)
// when the pairs have them.
class PreferenceLoader {
 public:
  PreferenceLoader(const TokenizedPairs& pairs, int64_t pairs_per_batch, int64_t seq_len, int32_t pad_id,
                   uint64_t seed, Allocator& host_allocator);
  int64_t batches_per_epoch() const { return chosen_.batches_per_epoch(); }
  int64_t row_count() const { return chosen_.row_count(); }
  Batch next();
  Batch batch_in_order(int64_t index) const;
  DataPosition position() const { return chosen_.position(); }
  void set_position(DataPosition position);

 private:
  Batch stacked(const Batch& chosen, const Batch& rejected) const;
  std::vector<double> batch_margins(const std::vector<int64_t>& rows) const;

  DataLoader chosen_, rejected_;
  std::vector<double> margins_;
  int64_t pairs_per_batch_;
  Allocator& allocator_;
};

}  // namespace ft
