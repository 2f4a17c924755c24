// Reward models against transformers + PEFT (tests/fixtures/reward,
// scripts/make_reward_fixture.py): the llama_gqa base saved as transformers'
// LlamaForSequenceClassification (score head, no lm_head) loads as a reward
// model, and with the llama_lora adapter on top our scores at the last
// non-padding token, trl's RewardTrainer loss and figures, and the gradients
// of every LoRA tensor and of score.weight equal the fixture's; rows are
// scored where transformers scores them, also when eos is the pad token.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/error.h"
#include "model/families.h"
#include "model/llama.h"
#include "model/peft_adapter.h"
#include "model/safetensors.h"
#include "tests/parity.h"
#include "trainer/rl/reward.h"

using namespace ft;
using ft::parity::relative_error;
using ft::parity::shifted_targets;

namespace {

const std::string kFixtures = FT_FIXTURES_DIR;
constexpr int32_t kPad = 3;
// f32 against f32 PyTorch, whose own f32 vs f64 gap is 2.7e-6 on these
// gradients (the fixture script prints it).
constexpr double kTolerance = 1e-4;

std::unique_ptr<LlamaModel> make_reward_model(Backend& backend, const std::string& checkpoint) {
  ModelOptions options;
  options.lora = read_peft_adapter_config(kFixtures + "/llama_lora/adapter").lora;
  options.output_head = OutputHead::score;
  auto model = std::make_unique<LlamaModel>(read_model_config(checkpoint + "/config.json"), backend, options);
  model->load(Checkpoint(checkpoint));
  model->init_output_head(1);
  load_peft_adapter(kFixtures + "/llama_lora/adapter", *model);
  model->set_trainable([](const std::string& name) { return name.find("lora_") != std::string::npos || name == "score.weight"; });
  return model;
}

Tensor host_ints(HostAllocator& host, const Shape& shape, const std::vector<int32_t>& values) {
  Tensor t = Tensor::empty(shape, DType::i32, host, MemCategory::activations);
  std::copy(values.begin(), values.end(), t.ptr<int32_t>());
  return t;
}

// The fixture's reward model (transformers' LlamaForSequenceClassification with the LoRA adapter)
// and its batch of pairs.
struct RewardFixture {
  Checkpoint reference{kFixtures + "/reward/reference.safetensors"};
  HostAllocator host;
  CpuBackend backend{host};
  std::unique_ptr<LlamaModel> model = make_reward_model(backend, kFixtures + "/reward/model");
  Batch batch{reference.view("input_ids"), shifted_targets(reference.view("labels"), host), 0};
  int64_t pairs = batch.input_ids.dim(0) / 2;
};

}  // namespace

TEST_CASE("reward model: scores, trl's loss and figures, LoRA and score gradients equal transformers + PEFT") {
  RewardFixture f;

  HostAllocator rows_host;
  const std::vector<double> scores = sequence_scores(*f.model, scored_rows(f.batch, kPad, rows_host));
  const Tensor want_scores = f.reference.view("scores");
  REQUIRE(int64_t(scores.size()) == want_scores.numel());
  for (size_t r = 0; r < scores.size(); ++r) {
    CAPTURE(r);
    CHECK(std::abs(scores[r] - want_scores.ptr<float>()[r]) <= kTolerance * std::max(1.0, std::abs(scores[r])));
  }

  const RewardFigures figures = reward_micro_batch(*f.model, f.batch, kPad, true, 1.0 / double(f.pairs));
  CHECK(figures.pairs == f.pairs);
  const nlohmann::json means = figures.means();
  for (const char* name : {"loss", "accuracy", "margin"}) {
    CAPTURE(name);
    const double want = f.reference.view(name).ptr<float>()[0], got = means[name].get<double>();
    CHECK(std::abs(got - want) <= kTolerance * std::max(std::abs(want), 1.0));
  }
  for (Parameter& adapter : f.model->adapters()) {
    CAPTURE(adapter.name);
    CHECK(relative_error(adapter.grad, f.reference.view("grad." + adapter.name)) <= kTolerance);
  }
  CHECK(relative_error(f.model->output_head().weight->grad, f.reference.view("grad.score.weight")) <= kTolerance);
}

TEST_CASE("reward model: trl's margin column is subtracted from each pair's score difference") {
  RewardFixture f;
  const float* scores = f.reference.view("scores").ptr<float>();
  double want_loss = 0.0;
  for (int64_t i = 0; i < f.pairs; ++i) {
    f.batch.margins.push_back(0.75 * double(i) - 0.5);
    // RewardTrainer.compute_loss: -logsigmoid(chosen - rejected - margin), the mean over pairs.
    const double z = double(scores[i]) - double(scores[f.pairs + i]) - f.batch.margins.back();
    want_loss += std::log1p(std::exp(-z)) / double(f.pairs);
  }
  const nlohmann::json means = reward_micro_batch(*f.model, f.batch, kPad, false, 0.0).means();
  CHECK(std::abs(means["loss"].get<double>() - want_loss) <= kTolerance * std::max(want_loss, 1.0));
  // trl's logged margin stays the mean score difference, the margin column not subtracted.
  CHECK(std::abs(means["margin"].get<double>() - f.reference.view("margin").ptr<float>()[0]) <= kTolerance);
}

TEST_CASE("reward model: the score is read at the last token that is not the pad token, as transformers reads it") {
  HostAllocator host;
  // Row 0: prompt 5 6, completion 7 then eos 2; row 1: completion ends in
  // the pad token (eos as pad): transformers scores the token before it;
  // row 2 carries no loss (an epoch's padding).
  Tensor ids = host_ints(host, {3, 4}, {5, 6, 7, 3, 5, 6, 9, 3, 3, 3, 3, 3});
  Tensor targets = host_ints(host, {3, 4}, {-100, 7, 2, -100, -100, 9, 3, -100, -100, -100, -100, -100});
  const ScoredRows rows = scored_rows(Batch{ids, targets, 0}, kPad, host);
  CHECK(rows.ids.dim(1) == 5);
  CHECK(std::vector<int32_t>(rows.ids.ptr<int32_t>(), rows.ids.ptr<int32_t>() + 5) ==
        std::vector<int32_t>{5, 6, 7, 2, 3});
  CHECK(rows.score_positions == std::vector<int64_t>{3, 2, -1});
}

TEST_CASE("reward model: a causal LM checkpoint gets a new score head; packed rows are refused") {
  HostAllocator host;
  CpuBackend backend(host);
  std::unique_ptr<LlamaModel> model = make_reward_model(backend, kFixtures + "/llama_gqa");
  const Tensor& weight = model->output_head().weight->value;
  double sum_squares = 0.0;
  for (int64_t i = 0; i < weight.numel(); ++i) sum_squares += double(weight.ptr<float>()[i]) * weight.ptr<float>()[i];
  // normal(0, initializer_range 0.02) over 64 values: the std within a factor of 2.
  const double std = std::sqrt(sum_squares / double(weight.numel()));
  CHECK(std > 0.01);
  CHECK(std < 0.04);

  Tensor ids = host_ints(host, {1, 4}, {5, 6, 7, 8});
  Tensor targets = host_ints(host, {1, 4}, {6, 7, 8, -100});
  Tensor positions = host_ints(host, {1, 4}, {0, 1, 0, 1});
  Batch packed{ids, targets, 3, positions};
  CHECK_THROWS_WITH_AS(scored_rows(packed, kPad, host), doctest::Contains("data.packing: false"), Error);
}
