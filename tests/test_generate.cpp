// Token sampling and batched generation.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "model/causal_lm.h"
#include "model/safetensors.h"
#include "trainer/generate.h"

using namespace ft;

TEST_CASE("greedy takes the argmax; a tiny top_p keeps only the most likely token") {
  const float logits[5] = {0.1f, 2.0f, -1.0f, 1.9f, 0.0f};
  SamplerRng rng{1};
  SamplingOptions greedy;
  CHECK(sample_token(logits, 5, greedy, rng) == 1);
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
  auto model = make_causal_lm(ModelConfig::from_json_file(dir + "/config.json"), backend, ModelOptions{});
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
