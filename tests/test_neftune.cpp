// NEFTune (neftune_noise_alpha): the noise's bound against the one
// transformers' hook draws between (tests/fixtures/neftune/hook.json, written
// by scripts/make_neftune_fixture.py), and the model's training step against
// a noise-free model whose embedding rows hold the same noise, bit for bit.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/error.h"
#include "model/causal_lm.h"
#include "model/families.h"
#include "model/safetensors.h"
#include "model/t5.h"
#include "trainer/generate.h"

using namespace ft;

namespace {

const std::string kFixtures = FT_FIXTURES_DIR;

nlohmann::json hook_fixture() {
  std::ifstream in(kFixtures + "/neftune/hook.json");
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

HostAllocator host;
CpuBackend backend(host);

// B rows of T inputs, every position a different token id, so each
// embedding row is read at one position only.
constexpr int64_t B = 2, T = 9;
constexpr double kAlpha = 5.0;
constexpr uint64_t kSeed = 77;

Tensor host_i32(const std::vector<int32_t>& values) {
  Tensor t = Tensor::empty({B, T}, DType::i32, host, MemCategory::activations);
  std::copy(values.begin(), values.end(), t.ptr<int32_t>());
  return t;
}

int32_t token_at(int64_t n) { return int32_t(4 + n); }

Tensor input_ids() {
  std::vector<int32_t> ids;
  for (int64_t n = 0; n < B * T; ++n) ids.push_back(token_at(n));
  return host_i32(ids);
}

Tensor targets() {
  std::vector<int32_t> values;
  for (int64_t n = 0; n < B * T; ++n) values.push_back(n % T == 0 ? -100 : int32_t(100 + (n * 7) % 200));
  return host_i32(values);
}

// llama_gqa (untied embeddings: editing a row changes the input only) with
// the final norm trainable, so a step runs its backward.
std::unique_ptr<LanguageModel> llama(double alpha) {
  const std::string dir = kFixtures + "/llama_gqa";
  ModelOptions options;
  options.neftune_noise_alpha = alpha;
  auto model = make_causal_lm(read_model_config(dir + "/config.json"), backend, options);
  model->load(Checkpoint(dir));
  model->set_trainable([](const std::string& name) { return name == "model.norm.weight"; });
  model->set_dropout_seed(kSeed);
  return model;
}

Parameter& parameter(LanguageModel& model, const std::string& name) {
  for (Parameter& p : model.parameters())
    if (p.name == name) return p;
  FAIL("no parameter " << name);
  throw;
}

std::vector<float> values(const Tensor& t) {
  std::vector<float> out(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[size_t(i)] = load_as_f32(t.data, t.dtype, i);
  return out;
}

}  // namespace

TEST_CASE("neftune_noise_magnitude is the bound transformers' hook draws between") {
  const nlohmann::json fixture = hook_fixture();
  REQUIRE(fixture["llama_train"].size() == 5);
  for (const nlohmann::json& c : fixture["llama_train"]) {
    CAPTURE(c.dump());
    CHECK(neftune_noise_magnitude(c["alpha"].get<double>(), c["length"].get<int64_t>(),
                                  c["hidden_size"].get<int64_t>()) == c["magnitude"].get<float>());
  }
  // What the model relies on: no noise in eval mode, and none at all on a
  // T5, whose hooked `shared` module its forward never calls.
  CHECK(fixture["llama_eval_draws"] == 0);
  CHECK(fixture["t5_train_draws"] == 0);
}

TEST_CASE("a T5 refuses neftune_noise_alpha (transformers adds it no noise)") {
  const std::string dir = kFixtures + "/t5_v1_1";
  ModelOptions options;
  options.neftune_noise_alpha = kAlpha;
  CHECK_THROWS_WITH_AS(T5Model(read_model_config(dir + "/config.json"), backend, options),
                       doctest::Contains("t5: neftune_noise_alpha applies to decoder-only models"), Error);
}

// The training step embeds, then adds noise drawn from the micro-batch's seed
// with the bound of L = T + 1: a noise-free model whose embedding row for
// each position's token holds that noise gives the same loss and gradient.
TEST_CASE("neftune: a training step's embeddings get uniform noise of bound alpha / sqrt((T + 1) d)") {
  auto noisy = llama(kAlpha), plain = llama(0.0), baked = llama(0.0);
  const int64_t C = noisy->config().hidden_size;
  const float m = neftune_noise_magnitude(kAlpha, T + 1, C);

  // The noise transformers would add to these rows: each token's row of the
  // table, plus the draw of its position.
  Parameter& table = parameter(*baked, "model.embed_tokens.weight");
  Tensor rows = backend.empty({B * T, C}, DType::f32, MemCategory::activations);
  for (int64_t n = 0; n < B * T; ++n) {
    Tensor row = rows.slice_rows(n, 1);
    backend.copy(row, table.value.slice_rows(token_at(n), 1));
  }
  const std::vector<float> before = values(rows);
  backend.add_uniform_noise(rows, m, embedding_noise_seed(kSeed));
  const std::vector<float> after = values(rows);
  double max_delta = 0.0;
  for (size_t i = 0; i < before.size(); ++i) max_delta = std::max(max_delta, double(std::abs(after[i] - before[i])));
  CHECK(max_delta <= m * (1 + 1e-5));  // f32 rounding of row + noise
  CHECK(max_delta >= 0.99 * m);        // 1152 draws: P(all inside 0.99 m) = 0.99^1152 < 1e-5
  for (int64_t n = 0; n < B * T; ++n) {
    Tensor row = table.value.slice_rows(token_at(n), 1);
    backend.copy(row, rows.slice_rows(n, 1));
  }

  const float noisy_loss = noisy->forward_backward(input_ids(), targets());
  const float plain_loss = plain->forward_backward(input_ids(), targets());
  const float baked_loss = baked->forward_backward(input_ids(), targets());
  CHECK(noisy_loss != plain_loss);
  CHECK(noisy_loss == baked_loss);
  const std::string norm = "model.norm.weight";
  CHECK(values(parameter(*noisy, norm).grad) == values(parameter(*baked, norm).grad));
  CHECK(values(parameter(*noisy, norm).grad) != values(parameter(*plain, norm).grad));

  // Another micro-batch's seed draws other noise; the same seed the same.
  noisy->zero_grads();
  noisy->set_dropout_seed(kSeed + 1);
  CHECK(noisy->forward_backward(input_ids(), targets()) != noisy_loss);
  noisy->set_dropout_seed(kSeed);
  CHECK(noisy->forward_backward(input_ids(), targets()) == noisy_loss);
}

TEST_CASE("neftune: evaluation and generation add no noise") {
  auto noisy = llama(kAlpha), plain = llama(0.0);
  CHECK(noisy->forward(input_ids(), targets()) == plain->forward(input_ids(), targets()));
  // After a training step too: eval mode is the forward's, not a leftover state.
  noisy->forward_backward(input_ids(), targets());
  CHECK(noisy->forward(input_ids(), targets()) == plain->forward(input_ids(), targets()));
  const std::vector<std::vector<int32_t>> prompts = {{1, 40, 41, 42}, {1, 50, 51}};
  for (bool kv_cache : {true, false}) {
    CAPTURE(kv_cache);
    SamplingOptions sampling;
    sampling.max_new_tokens = 6;
    sampling.temperature = 0.8;
    sampling.seed = 3;
    sampling.kv_cache = kv_cache;
    CHECK(generate(*noisy->as_causal_lm(), prompts, sampling, StopCondition{}) ==
          generate(*plain->as_causal_lm(), prompts, sampling, StopCondition{}));
  }
}
