// A SentencePiece tokenizer (tokenizer.model / spiece.model) with the special
// token ids the model file defines. Like transformers' LlamaTokenizer, encode
// first splits the text on the special pieces' strings (<s>, </s>, <unk>):
// each becomes its id, and the text between them is encoded piece by piece
// (each with SentencePiece's dummy prefix, as the legacy tokenizer does), so
// rendered chat templates get single ids for their bos and eos. A
// tokenizer_config.json beside the model can say that no bos is added
// (add_bos_token: false) or that eos is (add_eos_token: true), as
// transformers reads them.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace ft {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  // Loads path; if expected_vocab_size > 0 the tokenizer's vocabulary must
  // have exactly that many pieces (the model's vocab_size): a mismatch is an
  // Error naming both sizes.
  explicit SentencePieceTokenizer(const std::string& path, int64_t expected_vocab_size = 0);
  ~SentencePieceTokenizer() override;

  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override;
  std::string token_text(int32_t id) const override;
  int32_t bos_id() const override;  // -1 when the model defines none, or add_bos_token is false
  bool appends_eos() const override { return appends_eos_; }  // add_eos_token
  int32_t eos_id() const override;
  int32_t pad_id() const override;
  std::string file_name() const override { return "tokenizer.model"; }
  int32_t unk_id() const;

  // SentencePiece's kinds of pieces (ModelProto.SentencePiece.Type) that the
  // library reports; user-defined pieces count as normal.
  enum class PieceType { normal, unknown, control, unused, byte };
  // The model's score of a piece (its log-probability for a unigram model,
  // minus its merge rank for BPE) and its kind; id must be a piece.
  float piece_score(int32_t id) const;
  PieceType piece_type(int32_t id) const;

 private:
  void encode_plain(const std::string& text, std::vector<int32_t>& ids) const;

  std::string path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
  std::vector<std::pair<std::string, int32_t>> special_pieces_;  // control and unknown pieces, longest first
  bool adds_bos_ = true, appends_eos_ = false;  // tokenizer_config.json's add_bos_token / add_eos_token
};

}  // namespace ft
