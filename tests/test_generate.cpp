// Token sampling, batched generation, and generation with the key/value
// cache against rerunning the whole batch every step (the same tokens, greedy
// and sampled, on every fixture architecture; the CPU attention_cached gives
// bit-identical attention rows, so only the GEMMs' row counts differ).
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/cpu/cpu_backend.h"
#include "model/causal_lm.h"
#include "model/families.h"
#include "model/peft_adapter.h"
#include "model/safetensors.h"
#include "trainer/generate.h"

using namespace ft;

TEST_CASE("greedy takes the argmax; a tiny top_p keeps only the most likely token") {
  const float logits[5] = {0.1f, 2.0f, -1.0f, 1.9f, 0.0f};
  SamplerRng rng{1};
  SamplingOptions greedy;
  CHECK(sample_token(logits, 5, greedy, rng) == 1);
  CHECK(rng.draws == 0);  // greedy draws nothing
  SamplingOptions nucleus;
  nucleus.temperature = 1.0;
  nucleus.top_p = 1e-6;
  for (int i = 0; i < 50; ++i) CHECK(sample_token(logits, 5, nucleus, rng) == 1);
}

TEST_CASE("temperature sampling follows the softmax; top_p cuts the tail") {
  const float logits[3] = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  SamplingOptions options;
  options.temperature = 1.0;
  options.top_p = 1.0;
  SamplerRng rng{42};
  int counts[3] = {0, 0, 0};
  const int draws = 20000;
  for (int i = 0; i < draws; ++i) counts[sample_token(logits, 3, options, rng)]++;
  // Binomial standard deviation at 20k draws is about 0.0035; allow 5 of them.
  CHECK(double(counts[0]) / draws == doctest::Approx(0.5).epsilon(0.035));
  CHECK(double(counts[1]) / draws == doctest::Approx(0.3).epsilon(0.06));
  CHECK(double(counts[2]) / draws == doctest::Approx(0.2).epsilon(0.09));
  // top_p 0.7: the nucleus is {0.5, 0.3}; the 0.2 token is never drawn.
  options.top_p = 0.7;
  for (int i = 0; i < 2000; ++i) CHECK(sample_token(logits, 3, options, rng) != 2);
}

TEST_CASE("batched generation equals generating each prompt alone") {
  const std::string dir = std::string(FT_FIXTURES_DIR) + "/llama_gqa";
  HostAllocator host;
  CpuBackend backend(host);
  auto model = make_causal_lm(read_model_config(dir + "/config.json"), backend, ModelOptions{});
  model->load(Checkpoint(dir));
  const std::vector<std::vector<int32_t>> prompts = {{1, 17, 99, 250}, {1, 5}, {1, 300, 12, 8, 77, 6, 40}};
  SamplingOptions greedy;
  greedy.max_new_tokens = 6;
  auto together = generate(*model, prompts, greedy, StopCondition{{2}, {}, nullptr});
  REQUIRE(together.size() == 3);
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto alone = generate(*model, {prompts[i]}, greedy, StopCondition{{2}, {}, nullptr});
    CHECK(alone[0] == together[i]);
    CHECK(together[i].size() <= 6);
  }
}

TEST_CASE("top_k keeps the k most likely tokens; the repetition penalty follows transformers") {
  const float logits[5] = {0.1f, 2.0f, -1.0f, 1.9f, 0.0f};
  SamplingOptions top2;
  top2.temperature = 1.0;
  top2.top_k = 2;
  SamplerRng rng{3};
  int counts[5] = {};
  for (int i = 0; i < 4000; ++i) counts[sample_token(logits, 5, top2, rng)]++;
  CHECK(counts[0] + counts[2] + counts[4] == 0);
  // exp(2.0) : exp(1.9) = 0.525 : 0.475 between the two kept tokens.
  CHECK(double(counts[1]) / 4000 == doctest::Approx(0.525).epsilon(0.06));
  // Penalty 2: token 1's logit 2.0 -> 1.0 (divided), token 2's -1.0 -> -2.0
  // (multiplied), so greedy picks token 3 (1.9).
  SamplingOptions greedy;
  greedy.repetition_penalty = 2.0;
  const std::vector<int32_t> context = {1, 2, 1};
  CHECK(sample_token(logits, 5, greedy, rng, context) == 3);
  greedy.repetition_penalty = 1.0;
  CHECK(sample_token(logits, 5, greedy, rng, context) == 1);
}

namespace {

// A fixture model on the CPU, with its PEFT adapter when adapter is non-empty.
std::unique_ptr<CausalLM> fixture_model(Backend& backend, const std::string& fixture, bool with_adapter) {
  const std::string dir = std::string(FT_FIXTURES_DIR) + "/" + fixture;
  ModelOptions options;
  if (with_adapter) options.lora = read_peft_adapter_config(dir + "/adapter").lora;
  auto model = make_causal_lm(read_model_config(dir + "/config.json"), backend, options);
  model->load(Checkpoint(dir));
  if (with_adapter) load_peft_adapter(dir + "/adapter", *model);
  return model;
}

}  // namespace

TEST_CASE("the key/value cache generates the same tokens as rerunning the batch") {
  HostAllocator host;
  CpuBackend backend(host);
  struct Fixture {
    std::string name;
    bool adapter;
  };
  // GQA, tied embeddings, q/k/v biases + LoRA, a sliding window of 4 + LoRA,
  // GPT-NeoX both residual forms, dynamic rope (up to its 8 positions).
  const Fixture fixtures[] = {{"llama_gqa", false},         {"llama_tied", false},
                              {"qwen2", true},              {"mistral", true},
                              {"gpt_neox_parallel", false}, {"gpt_neox_sequential", false},
                              {"llama_dynamic_rope", true}};
  for (const Fixture& fixture : fixtures) {
    CAPTURE(fixture.name);
    auto model = fixture_model(backend, fixture.name, fixture.adapter);
    const int32_t V = int32_t(model->config().vocab_size);
    const int64_t cap = model->config().max_position_embeddings;
    // Ragged prompts; the longest reaches the position cap before 40 new tokens.
    std::vector<std::vector<int32_t>> prompts = {{1, 17 % V, 59 % V, 25 % V}, {1, 5}, {1}};
    for (int32_t i = 0; i < std::min<int32_t>(26, int32_t(cap) - 3); ++i) prompts[2].push_back((7 * i + 3) % V);
    // Dynamic NTK rope runs past the positions, where the cache keeps keys
    // rotated with the base of the length they were made at (as transformers'
    // cache does) and a rerun rotates them all anew: the two agree up to
    // max_position_embeddings, so that fixture generates up to it.
    const bool dynamic = model->config().rope_scaling.type == "dynamic";
    const int64_t new_tokens = dynamic ? cap - int64_t(prompts[2].size()) : 40;
    for (double temperature : {0.0, 0.8}) {
      CAPTURE(temperature);
      SamplingOptions options;
      options.max_new_tokens = new_tokens;
      options.temperature = temperature;
      options.top_k = 20;
      options.top_p = 0.95;
      options.repetition_penalty = 1.1;
      options.seed = 7;
      options.kv_cache = false;
      const auto uncached = generate(*model, prompts, options, StopCondition{});
      options.kv_cache = true;
      std::vector<std::vector<int32_t>> streamed(prompts.size());
      const auto cached = generate(*model, prompts, options, StopCondition{},
                                   [&](size_t row, int32_t token) { streamed[row].push_back(token); });
      CHECK(cached == uncached);
      CHECK(streamed == cached);
      for (size_t i = 0; i < prompts.size(); ++i)
        CHECK(int64_t(cached[i].size()) == std::min<int64_t>(new_tokens, cap - int64_t(prompts[i].size())));
    }
  }
}

// Three prompts of different lengths, for the stopping cases.
const std::vector<std::vector<int32_t>> kStopPrompts = {{1, 17, 99, 250}, {1, 5}, {1, 300, 12, 8, 77, 6, 40}};

TEST_CASE("a row that stops early idles in the cached batch without disturbing the others") {
  HostAllocator host;
  CpuBackend backend(host);
  auto model = fixture_model(backend, "llama_gqa", false);
  SamplingOptions greedy;
  greedy.max_new_tokens = 12;
  const auto free_run = generate(*model, kStopPrompts, greedy, StopCondition{});
  // Stop row 1 at its third token: rows 0 and 2 must continue unchanged.
  const StopCondition stop{{free_run[1][2]}, {}, nullptr};
  const auto stopped = generate(*model, kStopPrompts, greedy, stop);
  greedy.kv_cache = false;
  CHECK(stopped == generate(*model, kStopPrompts, greedy, stop));
  for (size_t row : {size_t(0), size_t(2)}) {
    const auto& want = free_run[row];
    const auto cut = std::find(want.begin(), want.end(), free_run[1][2]);
    CHECK(stopped[row] == std::vector<int32_t>(want.begin(), cut));
  }
  CHECK(stopped[1] == std::vector<int32_t>(free_run[1].begin(), free_run[1].begin() + 2));
}

TEST_CASE("keep_stop_id returns the stop id that ended a row as its last token, cached and uncached") {
  SamplingOptions sampled;
  sampled.temperature = 1.0;
  sampled.seed = 7;
  sampled.max_new_tokens = 12;
  HostAllocator host;
  CpuBackend backend(host);
  auto model = fixture_model(backend, "llama_gqa", false);
  const auto free_run = generate(*model, kStopPrompts, sampled, StopCondition{});
  // Row 1's fourth token stops it (and any other row that samples it).
  const int32_t stop_id = free_run[1][3];
  const StopCondition stop{{stop_id}, {}, nullptr};
  const auto dropped = generate(*model, kStopPrompts, sampled, stop);
  sampled.keep_stop_id = true;
  const auto kept = generate(*model, kStopPrompts, sampled, stop);
  sampled.kv_cache = false;
  CHECK(generate(*model, kStopPrompts, sampled, stop) == kept);
  for (size_t row = 0; row < kStopPrompts.size(); ++row) {
    CAPTURE(row);
    const bool stopped = int64_t(dropped[row].size()) < sampled.max_new_tokens;
    std::vector<int32_t> want = dropped[row];
    if (stopped) want.push_back(stop_id);
    CHECK(kept[row] == want);  // the same draws; only the stop id is added
  }
  CHECK(kept[1] == std::vector<int32_t>(free_run[1].begin(), free_run[1].begin() + 4));
}

TEST_CASE("a prompt longer than the model's positions continues its last tokens; the rest of its batch is untouched") {
  HostAllocator host;
  CpuBackend backend(host);
  auto model = fixture_model(backend, "llama_gqa", false);
  const int32_t V = int32_t(model->config().vocab_size);
  const int64_t limit = prompt_token_limit(*model);
  CHECK(limit == model->config().max_position_embeddings - 1);
  std::vector<int32_t> long_prompt;
  for (int64_t i = 0; i < limit + 9; ++i) long_prompt.push_back(int32_t((5 * i + 2) % V));
  const std::vector<int32_t> tail(long_prompt.end() - limit, long_prompt.end());
  const std::vector<int32_t> short_prompt = {1, 17, 42};
  for (bool kv_cache : {true, false}) {
    CAPTURE(kv_cache);
    SamplingOptions greedy;
    greedy.max_new_tokens = 4;
    greedy.kv_cache = kv_cache;
    const auto together = generate(*model, {long_prompt, short_prompt}, greedy, StopCondition{});
    CHECK(together[0].size() == 1);  // one position left after the kept tokens
    CHECK(together[0] == generate(*model, {tail}, greedy, StopCondition{})[0]);
    CHECK(together[1].size() == 4);
    CHECK(together[1] == generate(*model, {short_prompt}, greedy, StopCondition{})[0]);
  }
}

TEST_CASE("dynamic NTK rope continues prompts past max_position_embeddings as transformers does") {
  // tests/fixtures/llama_dynamic_rope/generate.json
  // (scripts/make_dynamic_rope_generate_fixture.py): transformers' greedy
  // tokens for prompts of 11 and 13 tokens on a model of 8 positions, with
  // and without the cache.
  std::ifstream file(std::string(FT_FIXTURES_DIR) + "/llama_dynamic_rope/generate.json");
  const nlohmann::json reference = nlohmann::json::parse(file);
  HostAllocator host;
  CpuBackend backend(host);
  auto model = fixture_model(backend, "llama_dynamic_rope", false);
  REQUIRE(model->config().max_position_embeddings == 8);
  for (const nlohmann::json& c : reference["cases"]) {
    const std::vector<int32_t> prompt = c["prompt"];
    CAPTURE(prompt.size());
    SamplingOptions greedy;
    greedy.max_new_tokens = int64_t(c["new_tokens"].size());
    greedy.kv_cache = c["kv_cache"];
    CAPTURE(greedy.kv_cache);
    CHECK(prompt_token_limit(*model) > int64_t(prompt.size()));
    CHECK(generate(*model, {prompt}, greedy, StopCondition{})[0] == c["new_tokens"].get<std::vector<int32_t>>());
  }
}
