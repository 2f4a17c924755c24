#include "tokenizer/load_tokenizer.h"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "kernels/error.h"
#include "kernels/input_file.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/sentencepiece_tokenizer.h"

namespace ft {
namespace {

// A tokenizer.json is a JSON object; a SentencePiece model is a binary protobuf, which never
// starts with '{' (its first byte is a field tag, 0x0A for the pieces).
bool looks_like_json(const std::string& path) {
  std::ifstream file = open_input_file(path, "tokenizer file", std::ios::binary);
  char c;
  while (file.get(c))
    if (!std::isspace(static_cast<unsigned char>(c))) return c == '{';
  return false;
}

// A tokenizer.json beside a tokenizer.model that adds tokens past its
// model's vocabulary (a ChatML fine-tune's <|im_start|> at 32000): what
// transformers tokenizes with, where the SentencePiece model alone would
// spell those tokens out piece by piece.
bool extends_its_vocabulary(const std::string& path) {
  const nlohmann::json file = json_fields::read_json_file(path);
  const nlohmann::json vocab = file.contains("model") && file["model"].is_object()
                                   ? file["model"].value("vocab", nlohmann::json())
                                   : nlohmann::json();
  const nlohmann::json added = file.value("added_tokens", nlohmann::json::array());
  if (!vocab.is_object() || !added.is_array()) return false;
  for (const nlohmann::json& token : added)
    if (token.is_object() && token.value("id", nlohmann::json()).is_number_integer() &&
        token["id"].get<int64_t>() >= int64_t(vocab.size()))
      return true;
  return false;
}

// Whether a tokenizer.json holds a BPE model, the kind load_tokenizer reads
// (T5's holds a Unigram one).
bool holds_bpe(const std::string& path) {
  const nlohmann::json file = json_fields::read_json_file(path);
  const nlohmann::json model = file.is_object() ? file.value("model", nlohmann::json()) : nullptr;
  return !model.is_object() || model.value("type", nlohmann::json("BPE")) == "BPE";
}

}  // namespace

bool is_tokenizer_json(const std::string& path) {
  const std::string extension = std::filesystem::path(path).extension().string();
  return extension == ".json" || (extension != ".model" && looks_like_json(path));
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path, int64_t model_vocab_size) {
  if (is_tokenizer_json(path)) return std::make_unique<BpeTokenizer>(path, model_vocab_size);
  return std::make_unique<SentencePieceTokenizer>(path, model_vocab_size);
}

std::string default_tokenizer_path(const std::string& model_dir) {
  namespace fs = std::filesystem;
  fs::path sentencepiece = fs::path(model_dir) / "tokenizer.model";
  fs::path json = fs::path(model_dir) / "tokenizer.json";
  fs::path t5_sentencepiece = fs::path(model_dir) / "spiece.model";  // T5's name for its SentencePiece model
  // The error_code overloads: a path the OS cannot even look up (a name past
  // NAME_MAX, a folder without search permission) is not found here, and the
  // tokenizer's loader then names it in its own error instead of a
  // std::filesystem exception that names no field.
  std::error_code error;
  if (fs::exists(sentencepiece, error) &&
      !(fs::is_regular_file(json, error) &&
        (names_llama_class(json_fields::read_tokenizer_config(model_dir)) || extends_its_vocabulary(json.string()))))
    return sentencepiece.string();
  // T5's Unigram tokenizer.json beside its spiece.model (google/flan-t5-base
  // ships both): the SentencePiece model, which holds the same pieces.
  if (fs::exists(json, error) && !(fs::exists(t5_sentencepiece, error) && !holds_bpe(json.string())))
    return json.string();
  if (fs::exists(t5_sentencepiece, error)) return t5_sentencepiece.string();
  return sentencepiece.string();
}

std::string command_tokenizer_path(const std::string& given, const std::string& model_dir) {
  if (!given.empty()) return given;
  const std::string own = default_tokenizer_path(model_dir);
  std::error_code error;
  FT_CHECK(std::filesystem::exists(own, error), model_dir,
           ": the model folder has no tokenizer.model, tokenizer.json or spiece.model: give --tokenizer");
  return own;
}

}  // namespace ft
