#include "tokenizer/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include "kernels/error.h"

namespace ft {

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& path, int64_t expected_vocab_size)
    : path_(path), processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  auto status = processor_->Load(path);
  FT_CHECK(status.ok(), path, ": cannot load SentencePiece model: ", status.ToString());
  FT_CHECK(expected_vocab_size <= 0 || vocab_size() == expected_vocab_size, path, ": tokenizer vocabulary has ",
           vocab_size(), " pieces but the model's vocab_size is ", expected_vocab_size);
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int32_t> SentencePieceTokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  auto status = processor_->Encode(text, &ids);
  FT_CHECK(status.ok(), path_, ": encode failed: ", status.ToString());
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  auto status = processor_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  FT_CHECK(status.ok(), path_, ": decode failed: ", status.ToString());
  return text;
}

int64_t SentencePieceTokenizer::vocab_size() const { return processor_->GetPieceSize(); }
int32_t SentencePieceTokenizer::bos_id() const { return processor_->bos_id(); }
int32_t SentencePieceTokenizer::eos_id() const { return processor_->eos_id(); }
int32_t SentencePieceTokenizer::pad_id() const { return processor_->pad_id(); }
int32_t SentencePieceTokenizer::unk_id() const { return processor_->unk_id(); }

}  // namespace ft
