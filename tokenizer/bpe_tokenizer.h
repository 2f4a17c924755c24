// A Hugging Face tokenizer.json with a byte-level BPE model (GPT-2, GPT-NeoX, Pythia), giving
// the ids of the `tokenizers` library (AutoTokenizer's fast tokenizer) for the supported subset:
//
//   model           type "BPE"; merges as "a b" strings or [a, b] pairs; unk_token, fuse_unk,
//                   ignore_merges. dropout, continuing_subword_prefix, end_of_word_suffix and
//                   byte_fallback must be unset.
//   added_tokens    matched before pre-tokenization, leftmost then longest: those with
//                   normalized false in the raw text, the others in the normalized text.
//                   single_word, lstrip and rstrip must be false.
//   normalizer      null or NFC.
//   pre_tokenizer   ByteLevel (add_prefix_space, use_regex: the GPT-2 split pattern).
//   post_processor  null or ByteLevel (it only trims offsets: no ids added).
//   decoder         ByteLevel.
//   truncation, padding  ignored (the trainer truncates and pads); padding.pad_id is pad_id.
//
// Anything else is an Error naming the file, the field and what is supported.
// Special ids: bos -1 (the supported post-processors add none, as AutoTokenizer does for
// GPT-NeoX); eos the special added token "<|endoftext|>", "</s>" or "<eos>"; pad padding.pad_id
// if set, else the special added token "<|padding|>", "<pad>" or "[PAD]"; -1 when absent.
#pragma once
#include <array>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace ft {

// The pieces of UTF-8 `text` under the GPT-2 split pattern: what tokenizers' ByteLevel
// pre-tokenizer (use_regex) cuts before mapping bytes to characters. Public for tests.
std::vector<std::string> gpt2_split(std::string_view text);

class BpeTokenizer final : public Tokenizer {
 public:
  // Reads path; if expected_vocab_size > 0 every id must be below it (see load_tokenizer).
  explicit BpeTokenizer(const std::string& path, int64_t expected_vocab_size = 0);
  // From an already parsed tokenizer.json; `source` names it in errors.
  BpeTokenizer(const nlohmann::json& config, const std::string& source, int64_t expected_vocab_size = 0);

  std::vector<int32_t> encode(const std::string& text) const override;
  // Skips special added tokens and ids with no token (as tokenizers' decode with
  // skip_special_tokens); invalid UTF-8 in the bytes becomes U+FFFD.
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return int64_t(id_to_token_.size()); }
  int32_t bos_id() const override { return -1; }
  int32_t eos_id() const override { return eos_id_; }
  int32_t pad_id() const override { return pad_id_; }
  std::string file_name() const override { return "tokenizer.json"; }
  int32_t unk_id() const { return unk_id_; }
  // The id of a vocabulary or added token, -1 if there is none.
  int32_t token_id(const std::string& token) const;

 private:
  struct AddedToken {
    std::string content;  // NFC-normalized when `normalized` and the normalizer is NFC
    int32_t id;
    bool special;
    bool normalized;
  };
  // A piece of input text, or an added token found in it (id >= 0).
  struct Segment {
    std::string_view text;
    int32_t id;
  };
  // Indices into added_ by first byte, longest first: the candidates at a position of the text.
  using AddedIndex = std::array<std::vector<size_t>, 256>;

  void read_model(const nlohmann::json& model);
  void read_added_tokens(const nlohmann::json& tokens);
  void read_pipeline(const nlohmann::json& config);
  void choose_special_ids(const nlohmann::json& config);
  void index_added_tokens();
  void check_fits(int64_t expected_vocab_size) const;

  std::vector<Segment> split_on_added(std::string_view text, const AddedIndex& index) const;
  void pre_tokenize_and_encode(std::string_view text, std::vector<int32_t>& ids) const;
  void encode_word(std::string_view word, std::vector<int32_t>& ids) const;
  std::string normalize(std::string_view text) const;

  std::string source_;
  bool nfc_ = false;
  bool add_prefix_space_ = true;
  bool use_regex_ = true;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  int32_t unk_id_ = -1, eos_id_ = -1, pad_id_ = -1;

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;   // "" for ids no token has
  std::vector<bool> special_;              // by id: special added tokens, skipped by decode
  std::array<int32_t, 256> byte_ids_{};    // vocabulary id of each byte's character, -1 if none
  // (left id << 32 | right id) -> (rank, merged id).
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  std::vector<AddedToken> added_;
  AddedIndex raw_added_, normalized_added_;
};

}  // namespace ft
