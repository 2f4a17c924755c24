// The Llama-family variants against transformers + PEFT: fixtures written by
// scripts/make_fixtures.py (tests/fixtures/README.md, "Model families"), each
// a tiny checkpoint saved by transformers 5 with a PEFT adapter (nonzero B):
//   llama3_rope         rope_type llama3 (all three bands), attention_bias and
//                       mlp_bias, head_dim 10 with 3 heads over hidden 36,
//                       LoRA on all seven linears (so on biased ones)
//   llama_linear_rope   rope_type linear, factor 2.5
//   llama_dynamic_rope  rope_type dynamic, an 11-token batch past
//                       max_position_embeddings 8 (the NTK base grows)
//   qwen2               q/k/v biases, o_proj without, tied embeddings
//   mistral             sliding window 4 < 11 tokens, head_dim 12 x 4 heads over hidden 32
// Each is checked for transformers' rotary frequencies, the base logits, and
// with PEFT's adapter the logits, loss, adapter gradients, one AdamW step and
// the loss after it.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/error.h"
#include "model/causal_lm.h"
#include "model/families.h"
#include "model/peft_adapter.h"
#include "model/rope.h"
#include "model/safetensors.h"
#include "tests/parity.h"

using namespace ft;
using ft::parity::relative_error;
using ft::parity::shifted_targets;

namespace {

// As in test_peft.cpp: the fixtures' own f32 vs f64 checks give <= 1.1e-6.
constexpr double kTolerance = 1e-4;
const std::string kKeyPrefix = "base_model.model.";

std::unique_ptr<CausalLM> make_model(Backend& backend, const std::string& dir, const std::string& adapter) {
  ModelOptions options;
  options.weight_dtype = DType::f32;
  options.quantized_base = QuantizedBase::none;
  if (!adapter.empty()) options.lora = read_peft_adapter_config(adapter).lora;
  std::unique_ptr<CausalLM> model = make_causal_lm(read_model_config(dir + "/config.json"), backend, options);
  model->load(Checkpoint(dir));
  if (!adapter.empty()) load_peft_adapter(adapter, *model);
  return model;
}

void check_loss(float got, const Tensor& want_tensor, const std::string& what) {
  const float want = want_tensor.ptr<float>()[0];
  MESSAGE(what, " relative error ", std::abs(got - want) / std::abs(want));
  CHECK(std::abs(got - want) <= kTolerance * std::abs(want));
}

void check_family(const std::string& fixture, size_t adapters) {
  CAPTURE(fixture);
  const std::string dir = std::string(FT_FIXTURES_DIR) + "/" + fixture, adapter = dir + "/adapter";
  Checkpoint reference(dir + "/reference.safetensors");
  HostAllocator host;
  CpuBackend backend(host);
  Tensor input_ids = reference.view("input_ids");
  Tensor targets = shifted_targets(reference.view("labels"), host);

  // transformers' inverse frequencies for this batch's length, to f32 rounding.
  const ModelConfig config = read_model_config(dir + "/config.json");
  std::vector<float> inv_freq = rope_inv_freq(config, input_ids.dim(1));
  const Tensor want_inv_freq = reference.view("inv_freq");
  REQUIRE(int64_t(inv_freq.size()) == want_inv_freq.numel());
  CHECK(relative_error(Tensor::view_of(inv_freq.data(), want_inv_freq.shape, DType::f32), want_inv_freq) <= 1e-6);

  std::unique_ptr<CausalLM> base = make_model(backend, dir, "");
  base->forward(input_ids, targets);
  const double base_error = relative_error(base->last_logits(), reference.view("base_logits"));
  MESSAGE("base logits relative error ", base_error);
  CHECK(base_error <= kTolerance);

  std::unique_ptr<CausalLM> model = make_model(backend, dir, adapter);
  REQUIRE(model->adapters().size() == adapters);
  check_loss(model->forward(input_ids, targets), reference.view("loss"), "loss");
  const double logits_error = relative_error(model->last_logits(), reference.view("logits"));
  MESSAGE("logits relative error ", logits_error);
  CHECK(logits_error <= kTolerance);

  model->set_trainable([](const std::string& name) { return name.find("lora_") != std::string::npos; });
  model->forward_backward(input_ids, targets);
  std::vector<Parameter*> trainable;
  for (Parameter& p : model->adapters()) {
    CAPTURE(p.name);
    CHECK(relative_error(p.grad, reference.view("grad." + kKeyPrefix + p.name)) <= kTolerance);
    trainable.push_back(&p);
  }
  parity::fixture_adamw_step(backend, trainable);
  for (Parameter* p : trainable) {
    CAPTURE(p->name);
    CHECK(relative_error(p->value, reference.view("after_step." + kKeyPrefix + p->name)) <= kTolerance);
  }
  check_loss(model->forward(input_ids, targets), reference.view("loss_after_step"), "loss after step");
}

}  // namespace

TEST_CASE("llama with rope llama3, attention and mlp biases and head_dim != hidden / heads matches transformers") {
  check_family("llama3_rope", 2 * 7 * 2);
}

TEST_CASE("llama with rope linear matches transformers") { check_family("llama_linear_rope", 2 * 2 * 2); }

TEST_CASE("llama with rope dynamic past max_position_embeddings matches transformers") {
  check_family("llama_dynamic_rope", 2 * 2 * 2);
}

TEST_CASE("qwen2 (q/k/v biases, tied embeddings) matches transformers") { check_family("qwen2", 2 * 2 * 2); }

TEST_CASE("mistral with a sliding window shorter than the batch matches transformers") {
  check_family("mistral", 2 * 2 * 2);
}

TEST_CASE("dynamic rope equals the default rope up to max_position_embeddings") {
  ModelConfig config = read_model_config(std::string(FT_FIXTURES_DIR) + "/llama_dynamic_rope/config.json");
  const std::vector<float> plain = default_rope_inv_freq(config.rope_theta, config.rotary_dim());
  CHECK(rope_inv_freq(config, config.max_position_embeddings) == plain);
  CHECK(rope_inv_freq(config, config.max_position_embeddings + 1) != plain);
}

TEST_CASE("an unsupported model_type is refused with the supported list") {
  nlohmann::json config = nlohmann::json::parse(R"({"model_type": "llama", "hidden_size": 32,
      "intermediate_size": 40, "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 96})");
  ModelConfig parsed = parse_model_config(config.dump(), "config.json");
  parsed.model_type = "phi3";
  HostAllocator host;
  CpuBackend backend(host);
  CHECK_THROWS_WITH_AS(make_causal_lm(parsed, backend, {}),
                       "model_type \"phi3\" is not supported (supported model_type values: \"llama\", \"qwen2\", "
                       "\"mistral\", \"gpt_neox\")",
                       Error);
}
