#include "tokenizer/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <filesystem>

#include "kernels/error.h"
#include "kernels/input_file.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/sentencepiece_model_check.h"

namespace ft {

// The model's bytes are read once, checked, and the same bytes loaded: the
// file cannot change between the check and the load.
SentencePieceTokenizer::SentencePieceTokenizer(const std::string& path, int64_t expected_vocab_size)
    : path_(path), processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  std::ifstream file = open_input_file(path, "a SentencePiece model (tokenizer.model)", std::ios::binary);
  // protobuf parses at most 2 GiB; the bound also ends a read of an endless file (a device, a FIFO).
  constexpr size_t kMaxModelBytes = size_t(1) << 31;
  std::string model;
  std::vector<char> chunk(1 << 16);
  while (file.read(chunk.data(), std::streamsize(chunk.size())) || file.gcount() > 0) {
    model.append(chunk.data(), size_t(file.gcount()));
    FT_CHECK(model.size() < kMaxModelBytes, path, ": a SentencePiece model (a protobuf message) must be under 2 GiB");
  }
  FT_CHECK(!file.bad(), path, ": cannot read SentencePiece model");
  check_sentencepiece_model(model, path);
  auto status = processor_->LoadFromSerializedProto(model);
  FT_CHECK(status.ok(), path, ": cannot load SentencePiece model: ", status.ToString());
  // An embedding padded past the pieces (vocab_size rounded up, as many
  // checkpoints are) is fine: those rows are never a token's.
  FT_CHECK(expected_vocab_size <= 0 || vocab_size() <= expected_vocab_size, path, ": tokenizer vocabulary has ",
           vocab_size(), " pieces but the model's vocab_size is ", expected_vocab_size,
           " (the embedding needs a row for every piece)");
  for (int id = 0; id < processor_->GetPieceSize(); id++)
    if (processor_->IsControl(id) || processor_->IsUnknown(id))
      special_pieces_.push_back({processor_->IdToPiece(id), int32_t(id)});
  std::stable_sort(special_pieces_.begin(), special_pieces_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  // transformers' LlamaTokenizer over a SentencePiece model: tokenizer_config.json beside it says
  // whether encode adds bos (default) and appends eos.
  const std::string folder = std::filesystem::path(path).parent_path().string();
  const nlohmann::json config = json_fields::read_tokenizer_config(folder);
  const std::string config_path = (std::filesystem::path(folder) / "tokenizer_config.json").string();
  if (config.is_object()) {
    adds_bos_ = json_fields::flag(config, "add_bos_token", true, config_path, "add_bos_token");
    appends_eos_ = json_fields::flag(config, "add_eos_token", false, config_path, "add_eos_token");
  }
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

void SentencePieceTokenizer::encode_plain(const std::string& text, std::vector<int32_t>& ids) const {
  if (text.empty()) return;
  std::vector<int> piece_ids;
  auto status = processor_->Encode(text, &piece_ids);
  FT_CHECK(status.ok(), path_, ": encode failed: ", status.ToString());
  ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
}

std::vector<int32_t> SentencePieceTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  size_t done = 0;  // text before it is encoded
  for (size_t at = 0; at < text.size(); at++) {
    for (const auto& [piece, id] : special_pieces_) {
      if (piece.empty() || text.compare(at, piece.size(), piece) != 0) continue;
      encode_plain(text.substr(done, at - done), ids);
      ids.push_back(id);
      done = at + piece.size();
      at = done - 1;
      break;
    }
  }
  encode_plain(text.substr(done), ids);
  return ids;
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  // An id past the pieces (a padded embedding's row) decodes to nothing, as
  // transformers' fast tokenizers skip it.
  std::vector<int> pieces;
  for (int32_t id : ids) {
    FT_CHECK(id >= 0, path_, ": cannot decode negative id ", id);
    if (id < processor_->GetPieceSize()) pieces.push_back(id);
  }
  std::string text;
  auto status = processor_->Decode(pieces, &text);
  FT_CHECK(status.ok(), path_, ": decode failed: ", status.ToString());
  return text;
}

int64_t SentencePieceTokenizer::vocab_size() const { return processor_->GetPieceSize(); }
int32_t SentencePieceTokenizer::bos_id() const { return adds_bos_ ? processor_->bos_id() : -1; }
int32_t SentencePieceTokenizer::eos_id() const { return processor_->eos_id(); }
int32_t SentencePieceTokenizer::pad_id() const { return processor_->pad_id(); }
int32_t SentencePieceTokenizer::unk_id() const { return processor_->unk_id(); }

std::string SentencePieceTokenizer::token_text(int32_t id) const {
  return id >= 0 && id < processor_->GetPieceSize() ? processor_->IdToPiece(id) : "";
}

float SentencePieceTokenizer::piece_score(int32_t id) const { return processor_->GetScore(id); }

SentencePieceTokenizer::PieceType SentencePieceTokenizer::piece_type(int32_t id) const {
  if (processor_->IsUnknown(id)) return PieceType::unknown;
  if (processor_->IsControl(id)) return PieceType::control;
  if (processor_->IsUnused(id)) return PieceType::unused;
  if (processor_->IsByte(id)) return PieceType::byte;
  return PieceType::normal;
}

}  // namespace ft
