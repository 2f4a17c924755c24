// tokenizer.json pipelines against the `tokenizers` library (tests/fixtures/tokenizers/, from
// scripts/make_tokenizer_fixtures.py): for each fixture tokenizer, built with a model family's
// pipeline or with the pipeline elements the families leave out, the ids of encode without and
// with special tokens and the text of decode must be exactly the library's.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/error.h"
#include "tokenizer/bpe_tokenizer.h"

using namespace ft;
using nlohmann::json;

static const std::string kDir = std::string(FT_FIXTURES_DIR) + "/tokenizers";

static json read_json(const std::string& path) {
  std::ifstream file(path);
  REQUIRE(file);
  return json::parse(file);
}

static void check_fixture(const std::string& name) {
  CAPTURE(name);
  BpeTokenizer tokenizer(kDir + "/" + name + "/tokenizer.json");
  const json cases = read_json(kDir + "/" + name + "/cases.json")["cases"];
  REQUIRE(cases.size() >= 200);
  size_t mismatches = 0;
  for (const json& c : cases) {
    const std::string text = c["text"];
    CAPTURE(text);
    std::vector<int32_t> ids = tokenizer.encode(text);
    bool ok = ids == c["ids"].get<std::vector<int32_t>>() &&
              tokenizer.encode_with_special_tokens(text) == c["ids_with_special"].get<std::vector<int32_t>>() &&
              tokenizer.decode(ids) == c["decoded"].get<std::string>();
    if (!ok && ++mismatches <= 3) {  // the first few mismatches in full
      CHECK(ids == c["ids"].get<std::vector<int32_t>>());
      CHECK(tokenizer.encode_with_special_tokens(text) == c["ids_with_special"].get<std::vector<int32_t>>());
      CHECK(tokenizer.decode(ids) == c["decoded"].get<std::string>());
    }
  }
  CHECK(mismatches == 0);
}

TEST_CASE("model families: Llama-3, Qwen2, GPT-NeoX, StarCoder / SmolLM, Llama-2 and Mistral") {
  for (const char* name : {"llama3", "qwen2", "gpt_neox", "starcoder", "llama2", "mistral"}) check_fixture(name);
}

TEST_CASE("pipeline elements: Metaspace schemes, NFKC, Lowercase, Whitespace, Punctuation, Strip, Replace") {
  for (const char* name : {"metaspace_split", "metaspace_never", "words_lowercase", "whitespace_split_punctuation"})
    check_fixture(name);
}

TEST_CASE("Split behaviours and invert") {
  for (const char* name : {"split_removed", "split_isolated", "split_merged_with_previous", "split_merged_with_next",
                           "split_contiguous", "split_invert"})
    check_fixture(name);
}
