// The RL losses (trainer/rl/) against trl's own code in float64
// (tests/fixtures/rl, scripts/make_rl_fixture.py): RewardTrainer's pairwise
// loss (trl 1.16.0), GRPOTrainer's advantages and loss for several loss
// types and betas (trl 1.16.0), and the classic PPOTrainer's rewards, GAE,
// mini-batch losses, step stats and KL controllers (trl 0.11.4). Every loss,
// gradient and logged figure must agree within 1e-5 relative; bad shapes and
// configs are refused with one clear error each.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/error.h"
#include "trainer/rl/grpo.h"
#include "trainer/rl/ppo.h"
#include "trainer/rl/reward_loss.h"

using namespace ft;
using nlohmann::json;

namespace {

// f64 against torch float64; trl computes a few logged fractions in float32
// (`.float()`), which differ from exact by ~1e-8.
constexpr double kTolerance = 1e-5;

json load(const std::string& name) {
  std::ifstream file(std::string(FT_FIXTURES_DIR) + "/rl/" + name);
  REQUIRE_MESSAGE(file.good(), "missing fixture tests/fixtures/rl/", name, " (scripts/make_rl_fixture.py)");
  return json::parse(file);
}

std::vector<double> doubles(const json& j) { return j.get<std::vector<double>>(); }
std::vector<uint8_t> bytes(const json& j) { return j.get<std::vector<uint8_t>>(); }

bool close(double got, double want) { return std::abs(got - want) <= kTolerance * std::abs(want) + 1e-12; }

void check_value(double got, double want, const std::string& what) {
  CHECK_MESSAGE(close(got, want), what, ": got ", got, ", trl ", want);
}

void check_values(const std::vector<double>& got, const json& want, const std::string& what) {
  REQUIRE_MESSAGE(got.size() == want.size(), what, ": ", got.size(), " values, trl ", want.size());
  int wrong = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!close(got[i], want[i].get<double>()) && wrong++ < 3)
      FAIL_CHECK(what, "[", i, "]: got ", got[i], ", trl ", want[i].get<double>());
}

// The same names both ways, each value within tolerance.
void check_metrics(const json& got, const json& want, const std::string& what) {
  for (const auto& [name, value] : want.items()) {
    if (!got.contains(name)) {
      FAIL_CHECK(what, ": ", name, " missing");
      continue;
    }
    check_value(got[name].get<double>(), value.get<double>(), what + " " + name);
  }
  for (const auto& [name, value] : got.items())
    CHECK_MESSAGE(want.contains(name), what, ": ", name, " is not one of trl's figures");
}

GrpoConfig grpo_config(const json& j) {
  GrpoConfig config;
  config.loss_type = *enum_value(j["loss_type"].get<std::string>(), enum_names(GrpoLossType{}));
  config.beta = j["beta"];
  config.epsilon = j["epsilon"];
  if (!j["epsilon_high"].is_null()) config.epsilon_high = j["epsilon_high"].get<double>();
  if (!j["delta"].is_null()) config.delta = j["delta"].get<double>();
  config.max_completion_length = j["max_completion_length"];
  config.use_bias_correction_kl = j["use_bias_correction_kl"];
  return config;
}

PpoConfig ppo_config(const json& j) {
  PpoConfig config;
  config.adap_kl_ctrl = j["adap_kl_ctrl"];
  config.init_kl_coef = j["init_kl_coef"];
  config.kl_penalty = *enum_value(j["kl_penalty"].get<std::string>(), enum_names(KlPenalty{}));
  config.target = j["target"];
  config.horizon = j["horizon"];
  config.gamma = j["gamma"];
  config.lam = j["lam"];
  config.cliprange = j["cliprange"];
  config.cliprange_value = j["cliprange_value"];
  config.vf_coef = j["vf_coef"];
  config.batch_size = j["batch_size"];
  config.mini_batch_size = j["mini_batch_size"];
  config.ppo_epochs = j["ppo_epochs"];
  config.ratio_threshold = j["ratio_threshold"];
  config.whiten_rewards = j["whiten_rewards"];
  if (!j["score_clip"].is_null()) config.score_clip = j["score_clip"].get<double>();
  return config;
}

// Rows `indices` of a flat [rows x T] array.
template <class V>
V gather_rows(const V& values, const std::vector<int64_t>& indices, int64_t T) {
  V out;
  for (int64_t row : indices) out.insert(out.end(), values.begin() + row * T, values.begin() + (row + 1) * T);
  return out;
}

GrpoTokens grpo_tokens(const json& c) {
  GrpoTokens tokens;
  tokens.rows = c["rows"];
  tokens.completion_tokens = c["completion_tokens"];
  tokens.logps = doubles(c["logps"]);
  tokens.old_logps = doubles(c["old_logps"]);
  tokens.ref_logps = doubles(c["ref_logps"]);
  tokens.mask = bytes(c["mask"]);
  tokens.advantages = doubles(c["advantages"]);
  tokens.num_items_in_batch = c["num_items_in_batch"];
  return tokens;
}

PpoRollout ppo_rollout(const json& step, const PpoConfig& config) {
  PpoRollout rollout;
  rollout.rows = step["rows"];
  rollout.response_tokens = step["response_tokens"];
  rollout.scores = clip_scores(config, doubles(step["scores"]));
  rollout.logprobs = doubles(step["logprobs"]);
  rollout.ref_logprobs = doubles(step["ref_logprobs"]);
  rollout.values = doubles(step["values"]);
  rollout.mask = bytes(step["mask"]);
  return rollout;
}

}  // namespace

TEST_CASE("reward loss: trl's RewardTrainer loss, its gradients in both scores and its metrics") {
  const json fixture = load("reward.json");
  for (const json& c : fixture["cases"]) {
    const std::string name = c["name"];
    const RewardBatchLoss got = reward_batch_loss(doubles(c["chosen"]), doubles(c["rejected"]), doubles(c["margins"]),
                                                  c["center_rewards_coefficient"]);
    check_value(got.loss, c["loss"], name + " loss");
    check_values(got.dchosen, c["dchosen"], name + " dchosen");
    check_values(got.drejected, c["drejected"], name + " drejected");
    check_metrics(got.metrics, c["metrics"], name);
  }
}

TEST_CASE("grpo advantages: trl's group mean and unbiased std + 1e-4, for scale_rewards group, batch and none") {
  const json fixture = load("grpo.json");
  for (const json& c : fixture["advantages"]) {
    const std::string scale = c["scale_rewards"];
    const std::vector<double> got = grpo_advantages(doubles(c["rewards"]), c["group_size"],
                                                    *enum_value(scale, enum_names(GrpoScaleRewards{})));
    check_values(got, c["advantages"], "scale_rewards " + scale);
  }
}

TEST_CASE("grpo loss: trl's GRPOTrainer loss, d(loss)/d(logps) and clip metrics for each loss_type and beta") {
  const json fixture = load("grpo.json");
  for (const json& c : fixture["loss_cases"]) {
    const std::string name = c["name"];
    const GrpoTokens tokens = grpo_tokens(c);
    const GrpoLoss got = grpo_loss(grpo_config(c["config"]), tokens);
    check_value(got.loss, c["loss"], name + " loss");
    check_values(got.dlogps, c["dlogps"], name + " dlogps");
    for (size_t n = 0; n < tokens.mask.size(); ++n)
      if (!tokens.mask[n]) CHECK_MESSAGE(got.dlogps[n] == 0.0, name, ": masked token ", n, " has a gradient");
    check_metrics(got.metrics, c["metrics"], name);
  }
}

TEST_CASE("grpo: trl 1.16.0's defaults") {
  const GrpoConfig config;
  CHECK(config.num_generations == 8);
  CHECK(config.num_iterations == 1);
  CHECK(config.beta == 0.0);
  CHECK(config.epsilon == 0.2);
  CHECK(!config.epsilon_high);
  CHECK(config.loss_type == GrpoLossType::dapo);
  CHECK(config.scale_rewards == GrpoScaleRewards::group);
  CHECK(config.max_completion_length == 512);
  CHECK(config.use_bias_correction_kl);
}

TEST_CASE("ppo: trl 0.11.4's rewards, GAE, mini-batch losses and gradients, step stats and KL update") {
  const json fixture = load("ppo.json");
  for (const json& step : fixture["steps"]) {
    const std::string name = step["name"];
    const PpoConfig config = ppo_config(step["config"]);
    const PpoRollout rollout = ppo_rollout(step, config);
    const int64_t T = rollout.response_tokens, vocab = step["vocab"];
    check_values(rollout.scores, step["scores_clipped"], name + " clipped scores");
    KlController controller = make_kl_controller(config);
    check_value(controller.value, step["kl_coef"], name + " kl_coef");

    const PpoRewards rewards = ppo_rewards(config, controller.value, rollout);
    check_values(rewards.rewards, step["rewards"], name + " rewards");
    check_values(rewards.non_score_reward, step["non_score_reward"], name + " non_score_reward");
    check_values(rewards.kls, step["kls"], name + " kls");
    const PpoAdvantages advantages = ppo_advantages(config, rollout, rewards.rewards);
    check_values(advantages.values, step["values_masked"], name + " masked values");
    check_values(advantages.advantages, step["advantages"], name + " advantages");
    check_values(advantages.returns, step["returns"], name + " returns");

    std::vector<json> mini_stats;
    for (size_t k = 0; k < step["mini_batches"].size(); ++k) {
      const json& mb = step["mini_batches"][k];
      const std::string what = name + " mini-batch " + std::to_string(k);
      const std::vector<int64_t> rows = mb["indices"].get<std::vector<int64_t>>();
      PpoMiniBatch batch;
      batch.rows = int64_t(rows.size());
      batch.response_tokens = T;
      batch.old_logprobs = gather_rows(rollout.logprobs, rows, T);
      batch.values = gather_rows(advantages.values, rows, T);
      batch.advantages = gather_rows(advantages.advantages, rows, T);
      batch.returns = gather_rows(advantages.returns, rows, T);
      batch.mask = gather_rows(rollout.mask, rows, T);
      batch.logprobs = doubles(mb["logprobs"]);
      batch.vpreds = doubles(mb["vpreds"]);
      const std::vector<double> logits = doubles(mb["logits"]);
      for (size_t n = 0; n < batch.logprobs.size(); ++n)
        batch.entropy.push_back(entropy_from_logits(logits.data() + n * size_t(vocab), vocab));
      check_values(batch.entropy, mb["entropy_check"], what + " entropy_from_logits");

      const PpoLoss loss = ppo_loss(config, batch);
      CHECK_MESSAGE(loss.skipped == (name.find("ratio_threshold") != std::string::npos && k == 2), what,
                    ": skipped ", loss.skipped);
      check_values(loss.dlogprobs, mb["dlogprobs"], what + " dlogprobs");
      check_values(loss.dvpreds, mb["dvpreds"], what + " dvpreds");
      check_value(loss.loss, mb["stats"]["loss/total"], what + " loss");
      check_metrics(loss.stats, mb["stats"], what);
      mini_stats.push_back(loss.stats);
    }
    const json stats = ppo_step_stats(controller.value, rollout, rewards, mini_stats);
    check_metrics(stats, step["stats"], name + " step stats");
    controller.update(stats["objective/kl"].get<double>(), config.batch_size);
    check_value(controller.value, step["kl_coef_after"], name + " kl_coef after the step");
  }
}

TEST_CASE("ppo: the KL controllers' updates and early stopping as trl 0.11.4's; the state resumes exactly") {
  const json fixture = load("ppo.json");
  for (const json& c : fixture["kl_controllers"]) {
    PpoConfig config;
    config.adap_kl_ctrl = c["adaptive"];
    config.init_kl_coef = c["init_kl_coef"];
    config.target = c["target"];
    config.horizon = c["horizon"];
    KlController controller = make_kl_controller(config);
    std::vector<double> values;
    for (const json& update : c["updates"]) {
      // Each update resumes from the serialised state of the one before.
      controller = KlController::from_json(json::parse(controller.to_json().dump()));
      controller.update(update[0].get<double>(), update[1].get<int64_t>());
      values.push_back(controller.value);
    }
    check_values(values, c["values"], c["adaptive"].get<bool>() ? "adaptive controller" : "fixed controller");
  }
  KlController controller{true, 0.1 + 0.2, 6.0, 10000.0};  // a value with no short decimal form
  controller.update(7.3, 3);
  CHECK(KlController::from_json(json::parse(controller.to_json().dump())).value == controller.value);
  for (const json& c : fixture["early_stop"]) {
    PpoConfig config;
    config.early_stopping = c["early_stopping"];
    config.target_kl = c["target_kl"];
    CHECK(ppo_early_stop(config, c["policykl"]) == c["stop"].get<bool>());
  }
}

TEST_CASE("ppo: trl 0.11.4's PPOConfig defaults") {
  const PpoConfig config;
  CHECK(config.adap_kl_ctrl);
  CHECK(config.init_kl_coef == 0.2);
  CHECK(config.kl_penalty == KlPenalty::kl);
  CHECK(config.target == 6.0);
  CHECK(config.horizon == 10000.0);
  CHECK(config.gamma == 1.0);
  CHECK(config.lam == 0.95);
  CHECK(config.cliprange == 0.2);
  CHECK(config.cliprange_value == 0.2);
  CHECK(config.vf_coef == 0.1);
  CHECK(config.batch_size == 128);
  CHECK(config.mini_batch_size == 128);
  CHECK(config.ppo_epochs == 4);
  CHECK(config.ratio_threshold == 10.0);
  CHECK(!config.whiten_rewards);
  CHECK(!config.early_stopping);
  CHECK(config.target_kl == 1.0);
}

TEST_CASE("rl math: bad input is refused with one clear error") {
  const json grpo = load("grpo.json");
  const std::vector<double> rewards = doubles(grpo["advantages"][0]["rewards"]);  // 12 rewards
  CHECK_THROWS_WITH_AS(grpo_advantages(rewards, 1, GrpoScaleRewards::group),
                       doctest::Contains("num_generations must be at least 2"), Error);
  CHECK_THROWS_WITH_AS(grpo_advantages(rewards, 5, GrpoScaleRewards::group),
                       doctest::Contains("12 rewards are not whole groups of num_generations = 5"), Error);
  GrpoConfig one;
  one.num_generations = 1;
  CHECK_THROWS_WITH_AS(validate(one), doctest::Contains("grpo.num_generations: expected at least 2"), Error);

  const json& c = grpo["loss_cases"][0];
  GrpoTokens tokens = grpo_tokens(c);
  tokens.logps.pop_back();
  CHECK_THROWS_WITH_AS(grpo_loss(grpo_config(c["config"]), tokens), doctest::Contains("logps holds 55 values"), Error);
  tokens = grpo_tokens(c);
  tokens.advantages.pop_back();
  CHECK_THROWS_WITH_AS(grpo_loss(grpo_config(c["config"]), tokens), doctest::Contains("7 advantages for 8 rows"),
                       Error);

  CHECK_THROWS_WITH_AS(reward_batch_loss({1, 2}, {0}, {}, 0), doctest::Contains("2 chosen scores but 1 rejected"),
                       Error);

  const json ppo = load("ppo.json");
  const json& step = ppo["steps"][0];
  PpoConfig config = ppo_config(step["config"]);
  PpoRollout rollout = ppo_rollout(step, config);
  rollout.mask.pop_back();
  CHECK_THROWS_WITH_AS(ppo_rewards(config, 0.2, rollout), doctest::Contains("rows x response_tokens = 28"), Error);
  rollout = ppo_rollout(step, config);
  std::fill(rollout.mask.begin(), rollout.mask.begin() + rollout.response_tokens, uint8_t(0));
  CHECK_THROWS_WITH_AS(ppo_rewards(config, 0.2, rollout), doctest::Contains("rollout 0 has no response token"),
                       Error);
  config.kl_penalty = KlPenalty::full;
  CHECK_THROWS_WITH_AS(validate(config), doctest::Contains("ppo.kl_penalty: full"), Error);
  config = ppo_config(step["config"]);
  config.mini_batch_size = 3;
  CHECK_THROWS_WITH_AS(validate(config), doctest::Contains("ppo.batch_size: 4 is not a multiple"), Error);
  CHECK_THROWS_WITH_AS(KlController::from_json(json{{"value", 0.2}}), doctest::Contains("expected {adaptive"), Error);
}
