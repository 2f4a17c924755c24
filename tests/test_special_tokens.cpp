// The EOS of training examples and the stop tokens of generation, from a
// checkpoint's config.json / generation_config.json / tokenizer_config.json
// and the data.add_eos / generate.stop keys.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/error.h"
#include "model/causal_lm.h"
#include "model/families.h"
#include "model/safetensors.h"
#include "tokenizer/load_tokenizer.h"
#include "tokenizer/sentencepiece_tokenizer.h"
#include "trainer/data/data.h"
#include "trainer/data/special_tokens.h"
#include "trainer/evaluate.h"
#include "trainer/generate.h"
#include "trainer/train_config.h"

using namespace ft;
namespace fs = std::filesystem;

namespace {

const std::string kTokenizers = std::string(FT_FIXTURES_DIR) + "/tokenizers";
// The qwen2 and llama3 fixture tokenizers: 703 ids (700 + their special tokens).
constexpr int64_t kVocab = 703;

// A checkpoint folder holding `files` (name -> text) and the fixture tokenizer `tokenizer`.
fs::path checkpoint(const std::string& name, const std::string& tokenizer,
                    const std::vector<std::pair<std::string, std::string>>& files) {
  fs::path dir = fs::path(FT_BINARY_DIR) / "test_special_tokens_tmp" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(kTokenizers + "/" + tokenizer + "/tokenizer.json", dir / "tokenizer.json");
  for (const auto& [file, text] : files) std::ofstream(dir / file) << text;
  return dir;
}

TrainConfig config_for(const fs::path& dir, const std::vector<std::string>& overrides = {}) {
  return parse_train_config("model: " + dir.string() + "\ndata: {train: t.jsonl}\n", "x.yaml", overrides);
}

struct Resolved {
  std::unique_ptr<Tokenizer> tokenizer;
  SpecialTokens tokens;
};

Resolved resolve(const fs::path& dir, const std::vector<std::string>& overrides = {}) {
  TrainConfig config = config_for(dir, overrides);
  Resolved out{load_tokenizer(config.tokenizer, kVocab), {}};
  out.tokens = resolve_special_tokens(config, *out.tokenizer, kVocab);
  return out;
}

int32_t id_of(const Tokenizer& tokenizer, const std::string& token) {
  std::vector<int32_t> ids = tokenizer.encode(token);
  REQUIRE(ids.size() == 1);
  return ids[0];
}

std::string error_of(const fs::path& dir, const std::vector<std::string>& overrides = {}) {
  try {
    resolve(dir, overrides);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("config.json's eos_token_id, not the tokenizer's <|endoftext|>, ends every example") {
  // A Qwen2-style tokenizer with no tokenizer_config.json: its eos guess is
  // <|endoftext|>, while the model was trained to stop at <|im_end|>.
  fs::path dir = checkpoint("qwen2", "qwen2", {{"config.json", R"({"bos_token_id": null, "eos_token_id": 2})"}});
  Resolved r = resolve(dir);
  const int32_t endoftext = id_of(*r.tokenizer, "<|endoftext|>"), im_end = id_of(*r.tokenizer, "<|im_end|>");
  REQUIRE(r.tokenizer->eos_id() == endoftext);
  REQUIRE(im_end == 2);
  CHECK(r.tokens.example_eos_id == im_end);
  CHECK(r.tokens.stop_ids == std::vector<int32_t>{im_end});

  Dataset data{"mem", DataFormat::prompt_completion, {{"Hello", " world"}, {"", "abc"}}};
  TokenizedDataset tokens = tokenize_dataset(data, *r.tokenizer, 32, r.tokens.example_eos_id);
  for (const TokenSequence& example : tokens.examples) {
    CHECK(example.tokens.back() == im_end);
    CHECK(example.loss_mask.back() == 1);
    CHECK(std::count(example.tokens.begin(), example.tokens.end(), endoftext) == 0);
  }

  // generation_config.json wins for generation, as in transformers; the
  // tokenizer's eos is then one of the stop ids, so examples end with it.
  dir = checkpoint("qwen2_generation", "qwen2",
                   {{"config.json", R"({"eos_token_id": 2})"}, {"generation_config.json", R"({"eos_token_id": [2, 0]})"}});
  r = resolve(dir);
  CHECK(r.tokens.stop_ids == std::vector<int32_t>{im_end, endoftext});
  CHECK(r.tokens.example_eos_id == endoftext);
}

TEST_CASE("a list of EOS ids as Llama-3-Instruct has: tokenizer_config.json's eos_token ends examples") {
  // [<|end_of_text|>, <|end_header_id|>, <|eot_id|>] stand for [128001, 128008, 128009].
  const std::string ids = R"({"bos_token_id": 0, "eos_token_id": [1, 3, 4]})";
  fs::path dir = checkpoint("llama3", "llama3",
                            {{"config.json", ids},
                             {"generation_config.json", ids},
                             {"tokenizer_config.json", R"({"eos_token": "<|eot_id|>"})"}});
  Resolved r = resolve(dir);
  CHECK(r.tokens.example_eos_id == id_of(*r.tokenizer, "<|eot_id|>"));
  CHECK(r.tokens.stop_ids == std::vector<int32_t>{1, 3, 4});
  Dataset data{"mem", DataFormat::prompt_completion, {{"Hi", " there"}}};
  TokenizedDataset tokens = tokenize_dataset(data, *r.tokenizer, 32, r.tokens.example_eos_id);
  CHECK(tokens.examples[0].tokens.front() == id_of(*r.tokenizer, "<|begin_of_text|>"));
  CHECK(tokens.examples[0].tokens.back() == 4);

  // A tokenizer eos the checkpoint does not stop at gives way to its first EOS id.
  std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "<|start_header_id|>"})";
  r = resolve(dir);
  CHECK(r.tokens.example_eos_id == 1);
  CHECK(r.tokens.stop_ids == std::vector<int32_t>{1, 3, 4});
}

TEST_CASE("data.add_eos and generate.stop override the checkpoint") {
  fs::path dir = checkpoint("overrides", "qwen2", {{"config.json", R"({"eos_token_id": 2})"}});
  CHECK(resolve(dir, {"data.add_eos=false"}).tokens.example_eos_id == -1);
  CHECK(resolve(dir, {"data.add_eos=true"}).tokens.example_eos_id == 2);
  Resolved r = resolve(dir, {"data.add_eos=<|endoftext|>"});
  CHECK(r.tokens.example_eos_id == 0);
  CHECK(r.tokens.stop_ids == std::vector<int32_t>{2, 0});  // a model trained to end with it stops at it
  CHECK(resolve(dir, {"data.add_eos=1"}).tokens.example_eos_id == 1);

  r = resolve(dir, {"generate.stop=[\"<|im_start|>\", 7, \"\\n\\n\", \"Human:\"]"});
  CHECK(r.tokens.stop_ids == std::vector<int32_t>{2, 1, 7});  // special tokens by text become ids
  CHECK(r.tokens.stop_strings == std::vector<std::string>{"\n\n", "Human:"});
  CHECK(r.tokenizer->token_text(1) == "<|im_start|>");
  const std::string eos = "2 \"" + r.tokenizer->token_text(2) + "\"";
  CHECK(describe(r.tokens, *r.tokenizer) == "examples end with " + eos + "; generation stops at [" + eos +
                                                ", 1 \"<|im_start|>\", 7 \"" + r.tokenizer->token_text(7) +
                                                "\"] and text \"\n\n\" and text \"Human:\"");
  CHECK(r.tokenizer->token_text(int32_t(r.tokenizer->vocab_size())).empty());

  CHECK(error_of(dir, {"data.add_eos=703"}) ==
        "x.yaml: data.add_eos: token id 703 is outside the vocabulary [0, 703) of " + dir.string());
  CHECK(error_of(dir, {"data.add_eos=Hello world"})
            .starts_with("x.yaml: data.add_eos: \"Hello world\" is not one token of " + (dir / "tokenizer.json").string() +
                         " (it encodes to "));
  CHECK(error_of(dir, {"generate.stop=[5000]"}) ==
        "x.yaml: generate.stop: token id 5000 is outside the vocabulary [0, 703) of " + dir.string());
  CHECK_THROWS_WITH_AS(config_for(dir, {"data.add_eos=-3"}),
                       "x.yaml (--set data.add_eos=-3): data.add_eos: expected a token id in [0, 2147483647] or a "
                       "token's text, got \"-3\"",
                       Error);
  CHECK_THROWS_WITH_AS(config_for(dir, {"generate.stop=[[1]]"}),
                       "x.yaml (--set generate.stop=[[1]]): generate.stop: expected a token id or a token's text, "
                       "got a list",
                       Error);
}

TEST_CASE("bad eos_token_id / bos_token_id: one error naming the file and the key") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"config.json", R"({"eos_token_id": 703})"},
      {"config.json", R"({"eos_token_id": "2"})"},
      {"config.json", R"({"eos_token_id": [2, 1.5]})"},
      {"config.json", R"({"bos_token_id": -1, "eos_token_id": 2})"},
      {"generation_config.json", R"({"eos_token_id": [2, 9999]})"},
      {"generation_config.json", R"({"eos_token_id": {"id": 2}})"},
      {"generation_config.json", R"({"bos_token_id": true})"},
  };
  const std::vector<std::string> expected = {
      "config.json: \"eos_token_id\" holds id 703, outside the vocabulary [0, 703)",
      "config.json: \"eos_token_id\" must be a token id (an integer) or a list of them, got \"2\"",
      "config.json: \"eos_token_id\" must be a token id (an integer) or a list of them, got 1.5",
      "config.json: \"bos_token_id\" holds id -1, outside the vocabulary [0, 703)",
      "generation_config.json: \"eos_token_id\" holds id 9999, outside the vocabulary [0, 703)",
      "generation_config.json: \"eos_token_id\" must be a token id (an integer) or a list of them, got {\"id\":2}",
      "generation_config.json: \"bos_token_id\" must be a token id (an integer) or a list of them, got true",
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    CAPTURE(cases[i].second);
    std::vector<std::pair<std::string, std::string>> files = {cases[i]};
    if (cases[i].first != "config.json") files.push_back({"config.json", R"({"eos_token_id": 2})"});
    fs::path dir = checkpoint("bad", "qwen2", files);
    CHECK(error_of(dir) == (dir / expected[i]).string());
  }
}

TEST_CASE("generation stops at any of the stop ids, and at a stop string") {
  const std::string dir = std::string(FT_FIXTURES_DIR) + "/llama_gqa";
  HostAllocator host;
  CpuBackend backend(host);
  auto model = make_causal_lm(read_model_config(dir + "/config.json"), backend, ModelOptions{});
  model->load(Checkpoint(dir));
  SamplingOptions greedy;
  greedy.max_new_tokens = 8;
  const std::vector<int32_t> prompt = {1, 17, 99, 250};
  const std::vector<int32_t> free_run = generate(*model, {prompt}, greedy, StopCondition{})[0];
  REQUIRE(free_run.size() == 8);
  // The first token that did not come before it, stopped on as the third of three EOS ids.
  size_t k = 1;
  while (k < free_run.size() && std::count(free_run.begin(), free_run.begin() + long(k), free_run[k])) ++k;
  REQUIRE(k < free_run.size());
  std::vector<int32_t> unused;
  for (int32_t id = 0; unused.size() < 2; ++id)
    if (std::count(free_run.begin(), free_run.end(), id) == 0) unused.push_back(id);
  StopCondition stop{{unused[0], unused[1], free_run[k]}, {}, nullptr};
  CHECK(generate(*model, {prompt}, greedy, stop)[0] == std::vector<int32_t>(free_run.begin(), free_run.begin() + long(k)));

  SentencePieceTokenizer tokenizer(std::string(FT_FIXTURES_DIR) + "/tokenizer/tokenizer.model");
  std::string text = tokenizer.decode(free_run);
  REQUIRE(text.size() >= 3);
  StopCondition by_text{{}, {text.substr(1, 2)}, &tokenizer};
  std::vector<int32_t> stopped = generate(*model, {prompt}, greedy, by_text)[0];
  REQUIRE(!stopped.empty());
  CHECK(std::vector<int32_t>(free_run.begin(), free_run.begin() + long(stopped.size())) == stopped);
  CHECK(find_stop_string(tokenizer.decode(stopped), by_text.strings) != std::string::npos);
  stopped.pop_back();
  CHECK(find_stop_string(tokenizer.decode(stopped), by_text.strings) == std::string::npos);

  // Completions are cut before the stop string.
  const std::string free_text =
      complete_prompts(*model, tokenizer, {"Hello"}, greedy, StopCondition{}, 1, PromptForm::text)[0];
  REQUIRE(free_text.size() >= 4);
  const std::string stop_text = free_text.substr(2, 2);
  CHECK(complete_prompts(*model, tokenizer, {"Hello"}, greedy, StopCondition{{}, {stop_text}, nullptr}, 1,
                         PromptForm::text)[0] ==
        free_text.substr(0, free_text.find(stop_text)));
}
