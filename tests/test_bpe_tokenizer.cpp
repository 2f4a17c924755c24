// The tokenizer.json reader against the `tokenizers` library's ids
// (tests/fixtures/bpe_tokenizer/, from scripts/make_fixtures.py --only bpe_tokenizer: a tiny
// byte-level BPE configured like GPT-NeoX-20B's tokenizer.json).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/error.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/load_tokenizer.h"
#include "tokenizer/sentencepiece_tokenizer.h"
#include "tokenizer/unicode.h"

using namespace ft;
using nlohmann::json;

static const std::string kDir = std::string(FT_FIXTURES_DIR) + "/bpe_tokenizer";
static const std::string kPath = kDir + "/tokenizer.json";

static json read_json(const std::string& path) {
  std::ifstream file(path);
  REQUIRE(file);
  return json::parse(file);
}

static const json& reference() {
  static const json r = read_json(kDir + "/encode_reference.json");
  return r;
}

static void check_cases(const BpeTokenizer& tokenizer, const json& cases) {
  REQUIRE(!cases.empty());
  for (const json& c : cases) {
    const std::string text = c["text"];
    CAPTURE(text);
    std::vector<int32_t> ids = tokenizer.encode(text);
    CHECK(ids == c["ids"].get<std::vector<int32_t>>());
    CHECK(tokenizer.decode(ids) == c["decoded"].get<std::string>());
  }
}

// The fixture's tokenizer.json with `edit` applied, for configurations the file lacks.
static BpeTokenizer edited(const std::function<void(json&)>& edit) {
  json config = read_json(kPath);
  edit(config);
  return BpeTokenizer(config, "edited tokenizer.json");
}

TEST_CASE("encodings match the tokenizers library and decode back") {
  BpeTokenizer tokenizer(kPath);
  REQUIRE(reference()["cases"].size() >= 30);
  check_cases(tokenizer, reference()["cases"]);
}

TEST_CASE("the GPT-2 split (PCRE2) matches tokenizers' ByteLevel pre-tokenizer") {
  REQUIRE(reference()["split"].size() >= 40);
  PreTokenizer byte_level({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}, "test",
                          "pre_tokenizer");
  const auto to_byte_level = [](const std::string& bytes) {
    std::string out;
    for (char b : bytes) unicode::append_utf8(out, unicode::byte_level_chars()[uint8_t(b)]);
    return out;
  };
  for (const json& c : reference()["split"]) {
    const std::string text = c["text"];
    CAPTURE(text);
    std::vector<Piece> pieces{{text, true}};
    byte_level.apply(pieces);
    std::vector<std::string> got, expected;
    for (const Piece& p : pieces) got.push_back(p.text);
    for (const std::string& p : c["pieces"].get<std::vector<std::string>>()) expected.push_back(to_byte_level(p));
    CHECK(got == expected);
  }
}

TEST_CASE("decode(encode(text)) is the NFC form of text without special tokens") {
  BpeTokenizer tokenizer(kPath);
  for (std::string text : {"Hello world", "don't  stop\n\n", "crème brûlée 🙂 中文", "  a\tb  "})
    CHECK(tokenizer.decode(tokenizer.encode(text)) == text);
  CHECK(tokenizer.decode(tokenizer.encode("cafe\u0301")) == "caf\u00e9");
}

TEST_CASE("pre-tokenizer options: add_prefix_space and use_regex") {
  check_cases(edited([](json& c) { c["pre_tokenizer"]["add_prefix_space"] = true; }), reference()["add_prefix_space"]);
  check_cases(edited([](json& c) { c["pre_tokenizer"]["use_regex"] = false; }), reference()["no_regex"]);
}

TEST_CASE("merges as [left, right] pairs give the same ids as \"left right\" strings") {
  BpeTokenizer tokenizer = edited([](json& c) {
    for (json& merge : c["model"]["merges"]) {
      std::string s = merge;
      merge = json::array({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
    }
  });
  check_cases(tokenizer, reference()["cases"]);
}

TEST_CASE("decode of partial UTF-8, special and unknown ids matches the tokenizers library") {
  BpeTokenizer tokenizer(kPath);
  for (const json& c : reference()["decode"]) {
    auto ids = c["ids"].get<std::vector<int32_t>>();
    CAPTURE(c["ids"].dump());
    CHECK(tokenizer.decode(ids) == c["decoded"].get<std::string>());
  }
  CHECK_THROWS_WITH_AS(tokenizer.decode({-1}), doctest::Contains("cannot decode negative id -1"), Error);
}

TEST_CASE("special ids: GPT-NeoX's <|endoftext|> is eos, <|padding|> pad, no bos") {
  BpeTokenizer tokenizer(kPath);
  CHECK(tokenizer.eos_id() == 0);
  CHECK(tokenizer.pad_id() == 1);
  CHECK(tokenizer.bos_id() == -1);
  CHECK(tokenizer.unk_id() == -1);
  CHECK(tokenizer.vocab_size() == 519);  // 512 BPE tokens + runs of 2..8 spaces
  CHECK(tokenizer.token_id("<|endoftext|>") == 0);
  CHECK(tokenizer.token_id("    ") == 514);
  CHECK(tokenizer.encode("<|endoftext|><|padding|>") == std::vector<int32_t>{0, 1});
  CHECK(tokenizer.decode({0, 1}).empty());
  CHECK(tokenizer.file_name() == "tokenizer.json");
  CHECK(edited([](json& c) { c["padding"] = {{"pad_id", 7}}; }).pad_id() == 7);
}

TEST_CASE("special tokens that only special_tokens_map.json names are read from it, as transformers reads them") {
  // transformers reads special_tokens_map.json over a tokenizer_config.json without added_tokens_decoder.
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "ft_special_tokens_map";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(std::string(FT_FIXTURES_DIR) + "/llama3_tiny/tokenizer.json", dir / "tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
  std::ofstream(dir / "tokenizer_config.json") << R"({"add_bos_token": true, "eos_token": "<|end_of_text|>"})";
  std::ofstream(dir / "special_tokens_map.json") << R"({"bos_token": {"content": "<|begin_of_text|>"},
                                                       "eos_token": "<|eot_id|>"})";
  const BpeTokenizer legacy((dir / "tokenizer.json").string());
  CHECK(legacy.bos_id() == 0);
  CHECK(legacy.eos_id() == 4);  // the map's, over the config's
  std::ofstream(dir / "tokenizer_config.json") << R"({"added_tokens_decoder": {}, "eos_token": "<|end_of_text|>"})";
  CHECK(BpeTokenizer((dir / "tokenizer.json").string()).eos_id() == 1);  // a newer save: the map is not read
  std::filesystem::remove_all(dir);
}

TEST_CASE("the model's vocab_size may pad the tokenizer's ids but not cut them") {
  CHECK(BpeTokenizer(kPath, 519).vocab_size() == 519);
  CHECK(BpeTokenizer(kPath, 640).vocab_size() == 519);
  CHECK_THROWS_WITH_AS(BpeTokenizer(kPath, 512),
                       doctest::Contains("tokenizer ids go up to 518 (added_tokens entry \"        \") but the model's "
                                         "vocab_size is 512"),
                       Error);
}

TEST_CASE("load_tokenizer picks the reader by extension, then by content") {
  auto bpe = load_tokenizer(kPath, 519);
  CHECK(bpe->file_name() == "tokenizer.json");
  CHECK(bpe->encode("Hello world") == reference()["cases"][0]["ids"].get<std::vector<int32_t>>());
  auto sp = load_tokenizer(std::string(FT_FIXTURES_DIR) + "/tokenizer/tokenizer.model", 320);
  CHECK(sp->file_name() == "tokenizer.model");
  CHECK(sp->eos_id() == 2);

  auto copy = std::filesystem::temp_directory_path() / "ft_test_bpe_tokenizer_no_extension";
  std::filesystem::copy_file(kPath, copy, std::filesystem::copy_options::overwrite_existing);
  CHECK(load_tokenizer(copy.string(), 0)->file_name() == "tokenizer.json");
  std::filesystem::remove(copy);
}

TEST_CASE("default_tokenizer_path prefers tokenizer.model, then tokenizer.json") {
  CHECK(default_tokenizer_path(kDir) == kDir + "/tokenizer.json");
  std::string sp_dir = std::string(FT_FIXTURES_DIR) + "/tokenizer";
  CHECK(default_tokenizer_path(sp_dir) == sp_dir + "/tokenizer.model");
  CHECK(default_tokenizer_path("/nonexistent") == "/nonexistent/tokenizer.model");
  // Both files: tokenizer.model, unless the tokenizer.json adds tokens past its vocabulary (ChatML on a
  // SentencePiece model), which transformers then tokenizes with.
  const std::filesystem::path both = std::filesystem::temp_directory_path() / "test_bpe_tokenizer_both";
  std::filesystem::create_directories(both);
  std::filesystem::copy_file(sp_dir + "/tokenizer.model", both / "tokenizer.model",
                             std::filesystem::copy_options::overwrite_existing);
  nlohmann::json json = nlohmann::json::parse(std::ifstream(std::string(FT_FIXTURES_DIR) + "/tokenizers/mistral/tokenizer.json"));
  std::ofstream(both / "tokenizer.json") << json.dump();
  CHECK(default_tokenizer_path(both.string()) == (both / "tokenizer.model").string());
  json["added_tokens"].push_back({{"id", json["model"]["vocab"].size()}, {"content", "<|im_start|>"}, {"special", true}});
  std::ofstream(both / "tokenizer.json") << json.dump();
  CHECK(default_tokenizer_path(both.string()) == (both / "tokenizer.json").string());
  std::filesystem::remove_all(both);
}

TEST_CASE("invalid UTF-8 input is an error") {
  BpeTokenizer tokenizer(kPath);
  CHECK_THROWS_WITH_AS(tokenizer.encode("ab\xff"), doctest::Contains("invalid UTF-8 at byte 2"), Error);
  CHECK_THROWS_WITH_AS(tokenizer.encode("\xe0\x80\x80"), doctest::Contains("invalid UTF-8 at byte 0"), Error);  // overlong
  CHECK_THROWS_WITH_AS(tokenizer.encode("x\xed\xa0\x80"), doctest::Contains("invalid UTF-8 at byte 1"), Error);  // surrogate
  CHECK_THROWS_WITH_AS(tokenizer.encode("\xf4\x90\x80\x80"), doctest::Contains("invalid UTF-8"), Error);  // > U+10FFFF
}

TEST_CASE("unsupported or malformed tokenizer.json: errors name the file, the field and what is supported") {
  const auto refused = [](const std::function<void(json&)>& edit, const std::string& message) {
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(edited(edit), doctest::Contains(message.c_str()), Error);
    CHECK_THROWS_WITH_AS(edited(edit), doctest::Contains("edited tokenizer.json: "), Error);
  };
  refused([](json& c) { c["model"]["type"] = "Unigram"; }, "model.type is \"Unigram\"; only \"BPE\" is supported");
  refused([](json& c) { c["model"]["type"] = "WordPiece"; }, "model.type is \"WordPiece\"");
  refused([](json& c) { c["normalizer"] = {{"type", "BertNormalizer"}}; },
          "normalizer.type is \"BertNormalizer\"; supported: \"NFC\" \"NFD\" \"NFKC\"");
  refused([](json& c) { c["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "Precompiled"}}}}}; },
          "normalizer.normalizers[0].type is \"Precompiled\"");
  refused([](json& c) { c["pre_tokenizer"] = {{"type", "BertPreTokenizer"}}; },
          "pre_tokenizer.type is \"BertPreTokenizer\"; supported: \"ByteLevel\" \"Split\"");
  refused([](json& c) { c["pre_tokenizer"] = {{"type", "Metaspace"}}; }, "pre_tokenizer.replacement is missing");
  refused([](json& c) { c["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "a("}}}, {"behavior", "Isolated"}}; },
          "pre_tokenizer.pattern: cannot compile regex \"a(\"");
  refused([](json& c) { c["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", "a"}}}, {"behavior", "Drop"}}; },
          "pre_tokenizer.behavior is \"Drop\"; expected \"Removed\"");
  refused([](json& c) { c["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "ab"}}; },
          "pre_tokenizer.replacement is \"ab\"; expected a single character");
  refused([](json& c) { c["post_processor"] = {{"type", "TemplateProcessing"}}; }, "post_processor.single is missing");
  refused(
      [](json& c) {
        c["post_processor"] = {{"type", "TemplateProcessing"},
                               {"single", {{{"SpecialToken", {{"id", "<s>"}}}}, {{"Sequence", {{"id", "A"}}}}}},
                               {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1, 0}}}}}}};
      },
      "post_processor puts 2 tokens before and 0 after a text; at most one each (BOS, EOS) is supported");
  refused([](json& c) { c["post_processor"] = {{"type", "RobertaProcessing"}, {"cls", {"<s>", 700}}, {"sep", {"</s>", 0}}}; },
          "post_processor.cls[1] is 700, an id no token has");
  refused([](json& c) { c["decoder"] = {{"type", "WordPiece"}}; }, "decoder.type is \"WordPiece\"");
  refused([](json& c) { c["decoder"] = {{"type", "Strip"}, {"content", " "}, {"start", -1}}; },
          "decoder.start is -1; expected an integer from 0");
  refused([](json& c) { c["model"]["dropout"] = "high"; }, "model.dropout is \"high\"; expected null or a number");
  refused([](json& c) { c["model"]["continuing_subword_prefix"] = "##"; },
          "model.continuing_subword_prefix is \"##\"; only null is supported");
  refused([](json& c) { c["model"]["end_of_word_suffix"] = "</w>"; }, "model.end_of_word_suffix is \"</w>\"");
  refused([](json& c) { c["added_tokens"][0]["lstrip"] = true; }, "added_tokens[0].lstrip is true; only false");
  refused([](json& c) { c["model"].erase("merges"); }, "model.merges is missing");
  refused([](json& c) { c.erase("model"); }, "not a Hugging Face tokenizer.json (no \"model\" section): give the");
  // A model's config.json given as the tokenizer: said so.
  refused([](json& c) { c = {{"model_type", "llama"}, {"vocab_size", 32000}}; },
          "(no \"model\" section; it looks like a model's config.json): give the checkpoint's tokenizer.json");
  refused([](json& c) { c["model"]["merges"][3] = "a b c"; },
          "model.merges[3] is \"a b c\"; expected \"left right\" (one space) or [\"left\", \"right\"]");
  refused([](json& c) { c["model"]["merges"][0] = json::array({"zzz", "q"}); },
          "model.merges[0] is [\"zzz\",\"q\"]; expected both tokens and their concatenation in model.vocab");
  refused([](json& c) { c["model"]["vocab"]["Hello"] = -4; }, "model.vocab[\"Hello\"] is -4");
  refused([](json& c) { c["model"]["vocab"]["Hello"] = 4294967296LL; }, "model.vocab[\"Hello\"] is 4294967296");
  refused([](json& c) { c["model"]["unk_token"] = "<unk>"; }, "model.unk_token is \"<unk>\"");
}

TEST_CASE("a missing or non-JSON tokenizer file is an error naming it") {
  CHECK_THROWS_WITH_AS(BpeTokenizer("/nonexistent/tokenizer.json"),
                       doctest::Contains("/nonexistent/tokenizer.json: cannot open tokenizer file"), Error);
  std::string model = std::string(FT_FIXTURES_DIR) + "/tokenizer/tokenizer.model";
  CHECK_THROWS_WITH_AS(BpeTokenizer{model}, doctest::Contains((model + ": not valid JSON").c_str()), Error);
  CHECK_THROWS_WITH_AS(load_tokenizer("/nonexistent/tokenizer.json", 0), doctest::Contains("/nonexistent/tokenizer.json"),
                       Error);
}
