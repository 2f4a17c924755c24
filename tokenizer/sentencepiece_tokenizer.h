// A SentencePiece tokenizer (tokenizer.model / spiece.model) with the special
// token ids the model file defines.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
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
  int32_t bos_id() const override;  // -1 when the model defines none
  int32_t eos_id() const override;
  int32_t pad_id() const override;
  std::string file_name() const override { return "tokenizer.model"; }
  int32_t unk_id() const;

 private:
  std::string path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
};

}  // namespace ft
