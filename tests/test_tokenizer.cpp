// The SentencePiece wrapper against Python sentencepiece's encodings
// (tests/fixtures/tokenizer/encode_reference.json, from scripts/make_fixtures.py).
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/error.h"
#include "tokenizer/sentencepiece_tokenizer.h"

using namespace ft;

static const std::string kTokenizerPath = std::string(FT_FIXTURES_DIR) + "/tokenizer/tokenizer.model";

TEST_CASE("encodings match Python sentencepiece and decode back") {
  SentencePieceTokenizer tokenizer(kTokenizerPath, 320);
  CHECK(tokenizer.vocab_size() == 320);
  CHECK(tokenizer.unk_id() == 0);
  CHECK(tokenizer.bos_id() == 1);
  CHECK(tokenizer.eos_id() == 2);
  CHECK(tokenizer.pad_id() == 3);
  std::ifstream file(std::string(FT_FIXTURES_DIR) + "/tokenizer/encode_reference.json");
  nlohmann::json cases = nlohmann::json::parse(file);
  REQUIRE(cases.size() >= 8);
  for (const auto& reference : cases) {
    const std::string text = reference["text"];
    CAPTURE(text);
    std::vector<int32_t> ids = tokenizer.encode(text);
    CHECK(ids == reference["ids"].get<std::vector<int32_t>>());
    if (reference.contains("decoded")) CHECK(tokenizer.decode(ids) == reference["decoded"].get<std::string>());
  }
}

TEST_CASE("special pieces' strings in the text become their ids, the text between them encoded on its own") {
  SentencePieceTokenizer tokenizer(kTokenizerPath);
  auto concat = [](std::vector<std::vector<int32_t>> parts) {
    std::vector<int32_t> ids;
    for (const auto& part : parts) ids.insert(ids.end(), part.begin(), part.end());
    return ids;
  };
  CHECK(tokenizer.encode("<s>[INST] Hi there [/INST] ok </s>") ==
        concat({{1}, tokenizer.encode("[INST] Hi there [/INST] ok "), {2}}));
  CHECK(tokenizer.encode("a</s><s>b<unk>") == concat({tokenizer.encode("a"), {2, 1}, tokenizer.encode("b"), {0}}));
  std::vector<int32_t> partial = tokenizer.encode("</s");  // a partial string stays text
  CHECK(std::find(partial.begin(), partial.end(), 2) == partial.end());
  CHECK(partial.size() > 1);
}

TEST_CASE("tokenizer_config.json beside the model says whether bos is added and eos appended, as transformers reads it") {
  const std::filesystem::path folder = std::filesystem::temp_directory_path() / "test_tokenizer_config_flags";
  std::filesystem::remove_all(folder);
  std::filesystem::create_directories(folder);
  std::filesystem::copy_file(kTokenizerPath, folder / "tokenizer.model");
  const std::string path = (folder / "tokenizer.model").string();
  CHECK(SentencePieceTokenizer(path).bos_id() == 1);  // no tokenizer_config.json: LlamaTokenizer's defaults
  CHECK(!SentencePieceTokenizer(path).appends_eos());
  std::ofstream(folder / "tokenizer_config.json") << R"({"add_bos_token": false, "add_eos_token": true})";
  CHECK(SentencePieceTokenizer(path).bos_id() == -1);
  CHECK(SentencePieceTokenizer(path).appends_eos());
  std::ofstream(folder / "tokenizer_config.json") << R"({"add_bos_token": "yes"})";
  CHECK_THROWS_WITH_AS(SentencePieceTokenizer{path}, doctest::Contains("add_bos_token"), ft::Error);
  std::filesystem::remove_all(folder);
}

TEST_CASE("a tokenizer with more pieces than the model's vocab_size is refused; a padded embedding is fine") {
  CHECK_THROWS_WITH_AS(SentencePieceTokenizer(kTokenizerPath, 300),
                       doctest::Contains("tokenizer vocabulary has 320 pieces but the model's vocab_size is 300"),
                       Error);
  // vocab_size rounded up past the pieces: the extra rows decode to nothing.
  const SentencePieceTokenizer padded(kTokenizerPath, 384);
  const std::vector<int32_t> ids = padded.encode("Hello world");
  std::vector<int32_t> with_padding = ids;
  with_padding.insert(with_padding.begin() + 1, {320, 383});
  CHECK(padded.decode(with_padding) == padded.decode(ids));
  CHECK_THROWS_WITH_AS(padded.decode({-1}), doctest::Contains("cannot decode negative id -1"), Error);
}

TEST_CASE("a missing or corrupt tokenizer file is an error naming it") {
  CHECK_THROWS_WITH_AS(SentencePieceTokenizer("/nonexistent/tokenizer.model"),
                       doctest::Contains("/nonexistent/tokenizer.model"), Error);
  CHECK_THROWS_WITH_AS(SentencePieceTokenizer(std::string(FT_FIXTURES_DIR) + "/llama_gqa/config.json"),
                       doctest::Contains("cannot load SentencePiece model"), Error);
}

TEST_CASE("models with their own character map, byte fallback, a denormalizer and a user-defined piece match "
          "Python sentencepiece") {
  // tests/fixtures/sentencepiece/, from scripts/make_sentencepiece_fixtures.py: the model check
  // must accept what the trainer writes beyond nmt_nfkc's map.
  std::ifstream file(std::string(FT_FIXTURES_DIR) + "/sentencepiece/encode_reference.json");
  const nlohmann::json models = nlohmann::json::parse(file);
  REQUIRE(models.size() == 2);
  for (const auto& model : models.items()) {
    // A named copy, not a structured binding: clang's OpenMP mode cannot capture one in CAPTURE's lambda.
    const std::string name = model.key();
    const nlohmann::json& cases = model.value();
    SentencePieceTokenizer tokenizer(std::string(FT_FIXTURES_DIR) + "/sentencepiece/" + name + "/tokenizer.model");
    for (const auto& reference : cases) {
      const std::string text = reference["text"];
      CAPTURE(name);
      CAPTURE(text);
      const std::vector<int32_t> ids = tokenizer.encode(text);
      CHECK(ids == reference["ids"].get<std::vector<int32_t>>());
      CHECK(tokenizer.decode(ids) == reference["decoded"].get<std::string>());
    }
  }
}
