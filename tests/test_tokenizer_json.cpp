// tokenizer.json pipelines against the `tokenizers` library (tests/fixtures/tokenizers/, from
// scripts/make_tokenizer_fixtures.py): for each fixture tokenizer, built with a model family's
// pipeline or with the pipeline elements the families leave out, the ids of encode without and
// with special tokens and the text of decode must be exactly the library's.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/error.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/load_tokenizer.h"

using namespace ft;
using nlohmann::json;

static const std::string kDir = std::string(FT_FIXTURES_DIR) + "/tokenizers";

static json read_json(const std::string& path) {
  std::ifstream file(path);
  REQUIRE(file);
  return json::parse(file);
}

// Every case's ids without and with special tokens and its decoded text.
static void check_cases(const BpeTokenizer& tokenizer, const json& cases) {
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

static void check_fixture(const std::string& name) {
  CAPTURE(name);
  const json cases = read_json(kDir + "/" + name + "/cases.json")["cases"];
  REQUIRE(cases.size() >= 200);
  check_cases(BpeTokenizer(kDir + "/" + name + "/tokenizer.json"), cases);
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

TEST_CASE("a merge given twice keeps its last rank, as the tokenizers library's merge map") {
  check_fixture("duplicate_merges");
}

static json fixture_json(const std::string& name) { return read_json(kDir + "/" + name + "/tokenizer.json"); }

TEST_CASE("bos comes from the post-processor's template, eos and pad from tokenizer_config.json") {
  json llama3 = fixture_json("llama3");
  BpeTokenizer bare(llama3, "llama3 tokenizer.json");
  CHECK(bare.bos_id() == bare.token_id("<|begin_of_text|>"));
  CHECK(bare.eos_id() == -1);  // no tokenizer_config.json and no usual end-of-text name
  CHECK_FALSE(bare.appends_eos());
  json config = {{"bos_token", "<|begin_of_text|>"}, {"eos_token", {{"content", "<|eot_id|>"}}}, {"pad_token", "<|end_of_text|>"}};
  BpeTokenizer configured(llama3, "llama3 tokenizer.json", 0, config, "tokenizer_config.json");
  CHECK(configured.bos_id() == bare.token_id("<|begin_of_text|>"));
  CHECK(configured.eos_id() == bare.token_id("<|eot_id|>"));
  CHECK(configured.pad_id() == bare.token_id("<|end_of_text|>"));

  // Llama-2 style: add_bos_token / add_eos_token rebuild what is put around the text.
  json llama2 = fixture_json("llama2");
  json flags = {{"add_bos_token", true}, {"add_eos_token", true}, {"bos_token", "<s>"}, {"eos_token", "</s>"}};
  BpeTokenizer both(llama2, "llama2 tokenizer.json", 0, flags, "tokenizer_config.json");
  std::vector<int32_t> body = both.encode("Hello world");
  std::vector<int32_t> expected = {both.token_id("<s>")};
  expected.insert(expected.end(), body.begin(), body.end());
  expected.push_back(both.token_id("</s>"));
  CHECK(both.encode_with_special_tokens("Hello world") == expected);
  CHECK(both.appends_eos());
  CHECK(both.eos_id() == both.token_id("</s>"));
  flags["add_bos_token"] = false;
  flags["add_eos_token"] = false;
  BpeTokenizer neither(llama2, "llama2 tokenizer.json", 0, flags, "tokenizer_config.json");
  CHECK(neither.bos_id() == -1);
  CHECK(neither.encode_with_special_tokens("Hello world") == body);

  CHECK_THROWS_WITH_AS(BpeTokenizer(llama2, "llama2 tokenizer.json", 0, {{"eos_token", "<|im_end|>"}}, "cfg.json"),
                       doctest::Contains("cfg.json: eos_token is \"<|im_end|>\"; expected a token of llama2 tokenizer.json"),
                       Error);
  json roberta = fixture_json("metaspace_split");  // RobertaProcessing: <s> $A </s>
  CHECK(BpeTokenizer(roberta, "roberta").appends_eos());
  CHECK_THROWS_WITH_AS(BpeTokenizer(roberta, "roberta", 0, {{"eos_token", "<unk>"}}, "cfg.json"),
                       doctest::Contains("roberta: post_processor puts id 2 after a text but the eos token is id 0"),
                       Error);
  CHECK_THROWS_WITH_AS(BpeTokenizer(llama2, "llama2 tokenizer.json", 0, {{"add_bos_token", "yes"}}, "cfg.json"),
                       doctest::Contains("cfg.json: add_bos_token is \"yes\"; expected true or false"), Error);
}

TEST_CASE("tokenizer_config.json beside tokenizer.json is read") {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / "ft_test_tokenizer_json_config";
  fs::create_directories(dir);
  fs::copy_file(kDir + "/llama3/tokenizer.json", dir / "tokenizer.json", fs::copy_options::overwrite_existing);
  std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "<|eot_id|>", "bos_token": "<|begin_of_text|>"})";
  auto tokenizer = load_tokenizer((dir / "tokenizer.json").string(), 0);
  CHECK(tokenizer->eos_id() == dynamic_cast<BpeTokenizer&>(*tokenizer).token_id("<|eot_id|>"));
  std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "<nope>"})";
  const std::string message = (dir / "tokenizer_config.json").string() + ": eos_token is \"<nope>\"";
  CHECK_THROWS_WITH_AS(load_tokenizer((dir / "tokenizer.json").string(), 0), doctest::Contains(message.c_str()), Error);
  fs::remove_all(dir);
}

// transformers 5 rebuilds the stages of the LlamaTokenizer, GPT2Tokenizer,
// GPTNeoXTokenizer and Qwen2Tokenizer classes from the class, whatever the
// file says: a Llama-2 file under LlamaTokenizer adds no \u2581 after a
// special token inside the text ("<s>[INST]"), where its own Prepend
// normalizer adds one; add_prefix_space is the config's.
TEST_CASE("tokenizer classes that transformers 5 rebuilds run the file's vocabulary under the class's stages") {
  namespace fs = std::filesystem;
  const json fixture = read_json(kDir + "/classes/cases.json");
  REQUIRE(fixture["variants"].size() == 9);
  for (const json& variant : fixture["variants"]) {
    CAPTURE(variant["tokenizer_config"].dump());
    REQUIRE(variant["cases"].size() >= 60);
    check_cases(BpeTokenizer(fixture_json(variant["tokenizer_json"]), "tokenizer.json", 0, variant["tokenizer_config"],
                             "tokenizer_config.json"),
                variant["cases"]);
  }
  const json file = fixture_json("llama2");
  // The file's own stages differ there: the fixture is not what the file alone gives.
  const json& turn = fixture["variants"][0]["cases"][0];
  REQUIRE(fixture["variants"][0]["tokenizer_json"] == "llama2");
  CHECK(turn["text"] == "<s>[INST] Hi there [/INST] Hello</s><s>[INST] more [/INST]");
  CHECK(BpeTokenizer(file, "tokenizer.json").encode(turn["text"]) != turn["ids"].get<std::vector<int32_t>>());
  // A folder with both files: the class reads tokenizer.json, as transformers 5 does; other folders keep the model.
  const fs::path dir = fs::temp_directory_path() / "ft_test_tokenizer_json_class";
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.model") << "model";
  std::ofstream(dir / "tokenizer.json") << file.dump();
  std::ofstream(dir / "tokenizer_config.json") << R"({"tokenizer_class": "PreTrainedTokenizerFast"})";
  CHECK(default_tokenizer_path(dir.string()) == (dir / "tokenizer.model").string());
  std::ofstream(dir / "tokenizer_config.json") << R"({"tokenizer_class": "LlamaTokenizer"})";
  CHECK(default_tokenizer_path(dir.string()) == (dir / "tokenizer.json").string());
  fs::remove_all(dir);
}

TEST_CASE("T5's Unigram tokenizer.json gives way to the spiece.model beside it (google/flan-t5-base ships both)") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "ft_test_tokenizer_json_t5";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "spiece.model") << "model";
  std::ofstream(dir / "tokenizer.json") << R"({"model": {"type": "Unigram", "unk_id": 2, "vocab": [["<pad>", 0.0]]}})";
  CHECK(default_tokenizer_path(dir.string()) == (dir / "spiece.model").string());
  // A BPE tokenizer.json is still the folder's tokenizer; alone, a Unigram one is named (and refused on loading).
  std::ofstream(dir / "tokenizer.json") << fixture_json("llama2").dump();
  CHECK(default_tokenizer_path(dir.string()) == (dir / "tokenizer.json").string());
  std::ofstream(dir / "tokenizer.json") << R"({"model": {"type": "Unigram", "unk_id": 2, "vocab": [["<pad>", 0.0]]}})";
  fs::remove(dir / "spiece.model");
  CHECK(default_tokenizer_path(dir.string()) == (dir / "tokenizer.json").string());
  CHECK_THROWS_WITH_AS(load_tokenizer(default_tokenizer_path(dir.string()), 0),
                       doctest::Contains("model.type is \"Unigram\"; only \"BPE\" is supported"), Error);
  fs::remove_all(dir);
}

TEST_CASE("huge, negative or sparse ids are refused before anything is sized by them") {
  const auto refused = [](const std::function<void(json&)>& edit, const std::string& message) {
    json config = fixture_json("qwen2");
    edit(config);
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(BpeTokenizer(config, "qwen2 tokenizer.json"), doctest::Contains(message.c_str()), Error);
  };
  refused([](json& c) { c["model"]["vocab"]["zz_far"] = 2147483647; },
          "qwen2 tokenizer.json: model.vocab[\"zz_far\"] has id 2147483647 but the file has only 704 tokens; ids this "
          "sparse are refused");
  refused([](json& c) { c["added_tokens"][0]["id"] = 5000000; },
          "added_tokens entry \"<|endoftext|>\" has id 5000000 but the file has only 703 tokens");
  refused([](json& c) { c["added_tokens"][1]["id"] = -1; }, "added_tokens[1].id is -1; expected a non-negative");
  refused([](json& c) { c["model"]["vocab"]["a"] = 2147483648LL; }, "model.vocab[\"a\"] is 2147483648");
  // A vocabulary within bounds but beyond the model's embedding names the token.
  json config = fixture_json("qwen2");
  CHECK_THROWS_WITH_AS(BpeTokenizer(config, "qwen2 tokenizer.json", 600),
                       doctest::Contains("tokenizer ids go up to 699 (model.vocab["), Error);
}

TEST_CASE("BPE details: byte_fallback tokens, fuse_unk and ignore_merges") {
  json llama2 = fixture_json("llama2");
  BpeTokenizer tokenizer(llama2, "llama2 tokenizer.json");
  // A character outside the trained alphabet becomes its UTF-8 bytes' <0xXX> tokens.
  const std::string private_use = "\xEE\x80\x80\xEE\x80\x81";  // U+E000 U+E001, in no training text
  std::vector<int32_t> ids = tokenizer.encode(private_use);
  std::vector<int32_t> expected = {tokenizer.token_id("\u2581")};
  for (const char* byte : {"<0xEE>", "<0x80>", "<0x80>", "<0xEE>", "<0x80>", "<0x81>"})
    expected.push_back(tokenizer.token_id(byte));
  CHECK(ids == expected);
  CHECK(tokenizer.decode(ids) == private_use);
  // Without the byte tokens, unknown characters become one fused <unk>.
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    llama2["model"]["vocab"].erase(name);
  }
  BpeTokenizer no_bytes(llama2, "llama2 tokenizer.json");
  CHECK(no_bytes.encode(private_use) == std::vector<int32_t>{tokenizer.token_id("\u2581"), no_bytes.unk_id()});
  llama2["model"]["fuse_unk"] = false;
  CHECK(BpeTokenizer(llama2, "llama2 tokenizer.json").encode(private_use) ==
        std::vector<int32_t>{tokenizer.token_id("\u2581"), no_bytes.unk_id(), no_bytes.unk_id()});
  // ignore_merges: a word that is a vocabulary token is that token, whatever the merges say.
  json llama3 = fixture_json("llama3");
  llama3["model"]["vocab"]["zzq"] = 700;  // a token no merge produces
  llama3["model"]["ignore_merges"] = true;
  CHECK(BpeTokenizer(llama3, "llama3").encode("zzq") == std::vector<int32_t>{700});
  llama3["model"]["ignore_merges"] = false;
  CHECK(BpeTokenizer(llama3, "llama3").encode("zzq") != std::vector<int32_t>{700});
}
