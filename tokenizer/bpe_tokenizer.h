// A Hugging Face tokenizer.json with a BPE model, giving the ids of the `tokenizers` library
// (AutoTokenizer's fast tokenizer): GPT-2 / GPT-NeoX, Llama-3, Qwen2, SmolLM / StarCoder
// (byte-level), Llama-2 / Mistral converted from SentencePiece (Metaspace or Prepend + Replace,
// byte_fallback).
//
//   model           type "BPE"; merges as "a b" strings or [a, b] pairs; unk_token, fuse_unk,
//                   byte_fallback (<0xXX> tokens), ignore_merges; dropout (in [0, 1]) is ignored
//                   (no sampling); continuing_subword_prefix and end_of_word_suffix must be unset.
//   added_tokens    matched before pre-tokenization, leftmost then longest: those with
//                   normalized false in the raw text, the others in the normalized text.
//                   single_word, lstrip and rstrip must be false.
//   normalizer, pre_tokenizer, decoder   see tokenizer/pipeline.h.
//   post_processor  TemplateProcessing (the single-sequence template), RobertaProcessing,
//                   BertProcessing, ByteLevel (adds nothing), Sequence: the special tokens
//                   put around a text; at most one before it (the BOS) and one after.
//   truncation, padding  ignored (the trainer truncates and pads); padding.pad_id is pad_id.
//
// tokenizer_config.json beside the file (when read from a path) is read as transformers does:
// tokenizer_class LlamaTokenizer, GPT2Tokenizer, GPTNeoXTokenizer or Qwen2Tokenizer (or its
// Fast name) replaces the file's normalizer, pre-tokenizer and decoder by the class's, as
// transformers 5 rebuilds them (Llama: no normalizer, Metaspace "first", "always" when legacy,
// "never" without add_prefix_space; the others byte-level with the config's add_prefix_space);
// add_bos_token / add_eos_token, when present, replace what the template puts before / after
// the text by bos_token / eos_token; eos_token, bos_token and pad_token name the special ids.
// Without it: eos is the template's token after the text, else the special added token
// "<|endoftext|>", "</s>" or "<eos>"; pad is padding.pad_id, else "<|padding|>", "<pad>" or
// "[PAD]"; -1 when absent.
//
// Token ids must be non-negative, below the model's vocab_size when given, and dense enough
// (the largest below twice the number of tokens plus 1024): a file with a huge or negative id
// is refused before anything is allocated for it. Every error names the file and the field.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/pipeline.h"
#include "tokenizer/tokenizer.h"

namespace ft {

// Whether tokenizer_config.json names LlamaTokenizer or LlamaTokenizerFast,
// whose folder transformers 5 tokenizes with its tokenizer.json under the
// class's own stages (above).
bool names_llama_class(const nlohmann::json& tokenizer_config);


class BpeTokenizer final : public Tokenizer {
 public:
  // Reads path and the tokenizer_config.json beside it, if any; if expected_vocab_size > 0
  // every id must be below it (see load_tokenizer).
  explicit BpeTokenizer(const std::string& path, int64_t expected_vocab_size = 0);
  // From an already parsed tokenizer.json (`source` names it in errors) and, if not null, a
  // parsed tokenizer_config.json (`config_source`).
  BpeTokenizer(const nlohmann::json& config, const std::string& source, int64_t expected_vocab_size = 0,
               const nlohmann::json& tokenizer_config = nullptr, const std::string& config_source = "");
  ~BpeTokenizer() override;

  std::vector<int32_t> encode(const std::string& text) const override;
  // encode with the post-processor's special tokens around the text: tokenizers'
  // encode(text, add_special_tokens=True).
  std::vector<int32_t> encode_with_special_tokens(const std::string& text) const;
  // Skips special added tokens and ids with no token (as tokenizers' decode with
  // skip_special_tokens), then runs the decoder.
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return int64_t(id_to_token_.size()); }
  std::string token_text(int32_t id) const override { return id >= 0 && id < vocab_size() ? id_to_token_[size_t(id)] : ""; }
  int32_t bos_id() const override { return prefix_ids_.empty() ? -1 : prefix_ids_[0]; }
  int32_t eos_id() const override { return eos_id_; }
  int32_t pad_id() const override { return pad_id_; }
  bool appends_eos() const override { return !suffix_ids_.empty(); }
  std::string file_name() const override { return "tokenizer.json"; }
  int32_t unk_id() const { return unk_id_; }
  // The id of a vocabulary or added token, -1 if there is none.
  int32_t token_id(const std::string& token) const;
  // Whether id is one of added_tokens, and whether a special one (decode skips those).
  bool is_added(int32_t id) const;
  bool is_special(int32_t id) const { return id >= 0 && size_t(id) < special_.size() && special_[size_t(id)]; }
  // model.merges in rank order, as pairs of token texts (a pair given twice counts once, at
  // its last rank, as the tokenizers library builds its merge map).
  std::vector<std::pair<std::string, std::string>> merges() const;

 private:
  struct AddedToken {
    std::string content;     // as in the file
    std::string normalized;  // content through the normalizer when `normalized`, else content
    int32_t id;
    bool special;
    bool normalized_match;
  };
  // A stretch of input text, or an added token found in it (id >= 0).
  struct Segment {
    std::string_view text;
    int32_t id;
    bool at_start;
  };
  // Indices into added_ by first byte, longest first: the candidates at a position of the text.
  using AddedIndex = std::array<std::vector<size_t>, 256>;

  void read_model(const nlohmann::json& model);
  void read_added_tokens(const nlohmann::json& tokens);
  void check_ids(int64_t expected_vocab_size) const;
  void index_tokens();
  // A token id of the post-processor, which must be a token of the file.
  int32_t known_id(const nlohmann::json& value, const std::string& field) const;
  void read_template(const nlohmann::json& stage, const std::string& field, std::vector<int32_t>& prefix,
                     std::vector<int32_t>& suffix) const;
  void read_post_processor(const nlohmann::json& stage, const std::string& field);
  void read_special_ids(const nlohmann::json& config, const nlohmann::json& tokenizer_config,
                        const std::string& config_source);

  std::vector<Segment> split_on_added(std::string_view text, bool at_start, const AddedIndex& index) const;
  void encode_word(const std::string& word, std::vector<int32_t>& ids) const;

  std::string source_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<Decoder> decoder_;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  int32_t unk_id_ = -1, eos_id_ = -1, pad_id_ = -1;
  std::vector<int32_t> prefix_ids_, suffix_ids_;  // the post-processor's tokens around a text

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;  // "" for ids no token has
  std::vector<bool> special_;             // by id: special added tokens, skipped by decode
  std::array<int32_t, 256> byte_fallback_ids_{};  // the id of each byte's <0xXX> token, -1 if none
  // (left id << 32 | right id) -> (rank, merged id).
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  std::vector<AddedToken> added_;
  AddedIndex raw_added_, normalized_added_;
};

}  // namespace ft
