// The GPT-NeoX decoder against transformers and PEFT: fixtures written by
// scripts/make_fixtures.py (tiny random GPTNeoXForCausalLM checkpoints with
// rotary_pct 0.25, parallel and sequential residual, and a PEFT LoRA adapter
// on query_key_value), plus the INT8 base and the config forms we read.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <string>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/error.h"
#include "model/families.h"
#include "model/gpt_neox.h"
#include "model/peft_adapter.h"
#include "model/safetensors.h"
#include "tests/parity.h"

using namespace ft;
using parity::relative_error;
using parity::shifted_targets;

namespace {

const std::string kParallelFolder = std::string(FT_FIXTURES_DIR) + "/gpt_neox_parallel";
const std::string kLoraFolder = std::string(FT_FIXTURES_DIR) + "/gpt_neox_lora";

// The fixtures' own f32 vs f64 check gives ~4e-7 for logits and ~8e-7 for
// gradients; these leave room for summation order, not for a wrong formula.
constexpr double kLogitsTolerance = 1e-4;
constexpr double kGradientTolerance = 1e-4;

void check_against_transformers(const std::string& fixture, bool parallel) {
  const std::string dir = std::string(FT_FIXTURES_DIR) + "/" + fixture;
  ModelConfig config = read_model_config(dir + "/config.json");
  REQUIRE(config.use_parallel_residual == parallel);
  REQUIRE(config.rotary_dim() == 4);  // int(16 * 0.25)
  Checkpoint checkpoint(dir);
  Checkpoint reference(dir + "/reference.safetensors");
  HostAllocator host;
  TrackingAllocator tracker(host);
  CpuBackend backend(tracker);
  std::unique_ptr<CausalLM> model = make_causal_lm(config, backend, {});
  REQUIRE(dynamic_cast<GptNeoxModel*>(model.get()) != nullptr);
  model->load(checkpoint);
  // Every weight byte is accounted for: the checkpoint's bytes, no more, no less.
  CHECK(tracker.stats().current(MemCategory::weights) == checkpoint.total_bytes());

  Tensor input_ids = reference.view("input_ids");
  Tensor targets = shifted_targets(reference.view("labels"), host);
  float loss = model->forward(input_ids, targets);
  const double logits_error = relative_error(model->last_logits(), reference.view("logits"));
  MESSAGE(fixture, " logits relative error ", logits_error);
  CHECK(logits_error <= kLogitsTolerance);
  const float want_loss = reference.view("loss").ptr<float>()[0];
  MESSAGE(fixture, " loss relative error ", std::abs(loss - want_loss) / std::abs(want_loss));
  CHECK(loss == doctest::Approx(want_loss).epsilon(1e-5));

  model->set_trainable([&](const std::string& name) { return reference.contains("grad." + name); });
  const size_t activations_before = tracker.stats().current(MemCategory::activations);
  float train_loss = model->forward_backward(input_ids, targets);
  CHECK(train_loss == doctest::Approx(want_loss).epsilon(1e-5));
  // Nothing of the step outlives it.
  CHECK(tracker.stats().current(MemCategory::activations) == activations_before);
  int checked = 0;
  double worst = 0.0;
  for (Parameter& p : model->parameters()) {
    if (!p.trainable()) continue;
    CAPTURE(p.name);
    const double error = relative_error(p.grad, reference.view("grad." + p.name));
    worst = std::max(worst, error);
    CHECK(error <= kGradientTolerance);
    ++checked;
  }
  MESSAGE(fixture, " worst gradient relative error ", worst, " over ", checked, " tensors");
  // Per layer: query_key_value weight and bias, post_attention_layernorm
  // weight and bias, dense_4h_to_h bias; then the final norm and embed_in.
  CHECK(checked == 5 * config.num_hidden_layers + 3);
}

ModelOptions lora_on_query_key_value() {
  ModelOptions options;
  options.lora = read_peft_adapter_config(kLoraFolder + "/adapter").lora;
  return options;
}

}  // namespace

TEST_CASE("gpt_neox with parallel residual matches transformers: logits, loss, gradients") {
  check_against_transformers("gpt_neox_parallel", true);
}

TEST_CASE("gpt_neox with sequential residual matches transformers: logits, loss, gradients") {
  check_against_transformers("gpt_neox_sequential", false);
}

TEST_CASE("gpt_neox + PEFT LoRA on query_key_value matches peft: logits, loss, adapter gradients") {
  const std::string key_prefix = "base_model.model.";
  Checkpoint reference(kLoraFolder + "/reference.safetensors");
  HostAllocator host;
  CpuBackend backend(host);
  GptNeoxModel model(read_model_config(kParallelFolder + "/config.json"), backend,
                     lora_on_query_key_value());
  model.load(Checkpoint(kParallelFolder));
  load_peft_adapter(kLoraFolder + "/adapter", model);
  REQUIRE(model.adapters().size() == 4);  // 2 layers x (lora_A, lora_B)

  Tensor input_ids = reference.view("input_ids");
  Tensor targets = shifted_targets(reference.view("labels"), host);
  float loss = model.forward(input_ids, targets);
  const double logits_error = relative_error(model.last_logits(), reference.view("logits"));
  MESSAGE("gpt_neox_lora logits relative error ", logits_error);
  CHECK(logits_error <= kLogitsTolerance);
  const float want_loss = reference.view("loss").ptr<float>()[0];
  MESSAGE("gpt_neox_lora loss relative error ", std::abs(loss - want_loss) / std::abs(want_loss));
  CHECK(std::abs(loss - want_loss) <= kLogitsTolerance * std::abs(want_loss));

  model.set_trainable([](const std::string& name) { return name.find(".lora_") != std::string::npos; });
  model.forward_backward(input_ids, targets);
  for (Parameter& p : model.parameters()) CHECK(!p.trainable());
  ft::parity::check_adapter_gradients(model, reference, key_prefix, kGradientTolerance);
}

TEST_CASE("gpt_neox over an INT8 base: quantised query_key_value keeps its f32 bias, LoRA trains on top") {
  Checkpoint reference(kParallelFolder + "/reference.safetensors");
  HostAllocator host;
  CpuBackend backend(host);
  ModelOptions options = lora_on_query_key_value();
  options.quantized_base = QuantizedBase::int8;
  GptNeoxModel model(read_model_config(kParallelFolder + "/config.json"), backend, options);
  model.load(Checkpoint(kParallelFolder));
  const std::string qkv = "gpt_neox.layers.0.attention.query_key_value";
  CHECK(model.parameter(qkv + ".weight").value.dtype == DType::i8);
  CHECK(model.parameter(qkv + ".bias").value.dtype == DType::f32);
  CHECK(model.parameter(qkv + ".bias").value.shape == Shape{192});
  CHECK(model.parameter("embed_out.weight").value.dtype == DType::f32);  // the head stays 16/32-bit

  // The adapters start as PEFT's init (B = 0), so the model is the int8 base:
  // close to the f32 logits within int8 rounding (measured 2.3e-2: about 0.4%
  // per weight and activation through two layers); a lost bias or a wrong
  // qkv layout gives errors of order 1.
  model.init_adapters(7);
  Tensor input_ids = reference.view("input_ids");
  Tensor targets = shifted_targets(reference.view("labels"), host);
  model.forward(input_ids, targets);
  const double int8_error = relative_error(model.last_logits(), reference.view("logits"));
  MESSAGE("int8 base logits relative error vs f32 transformers ", int8_error);
  CHECK(int8_error <= 5e-2);

  model.set_trainable([](const std::string& name) { return name.find(".lora_") != std::string::npos; });
  model.forward_backward(input_ids, targets);
  // B = 0, so only B gets a gradient on the first step.
  CHECK(backend.sum_squares(model.parameter(qkv + ".lora_B.weight").grad) > 0.0);
}

TEST_CASE("gpt_neox: LoRA targets that match nothing list the NeoX module names") {
  HostAllocator host;
  CpuBackend backend(host);
  ModelOptions options;
  options.lora = LoraOptions{.r = 4, .target_modules = {"q_proj", "v_proj"}};
  CHECK_THROWS_WITH_AS(
      GptNeoxModel(read_model_config(kParallelFolder + "/config.json"), backend, options),
      doctest::Contains("lora.target_modules [q_proj, v_proj] leaves no module of this gpt_neox model to adapt (its "
                        "linear modules are query_key_value, dense, dense_h_to_4h, dense_4h_to_h)"),
      Error);
}

TEST_CASE("gpt_neox config: transformers 4 fields, transformers 5 rope_parameters, defaults, errors") {
  // GPT-NeoX-20B's own config.json (transformers 4 era) in brief.
  const std::string neox_20b = R"({"model_type": "gpt_neox", "hidden_size": 6144, "intermediate_size": 24576,
      "num_hidden_layers": 44, "num_attention_heads": 64, "vocab_size": 50432, "rotary_pct": 0.25,
      "rotary_emb_base": 10000, "max_position_embeddings": 2048, "layer_norm_eps": 1e-05,
      "use_parallel_residual": true, "hidden_act": "gelu_fast", "tie_word_embeddings": false})";
  ModelConfig config = parse_model_config(neox_20b, "20b.json");
  CHECK(config.head_dim == 96);
  CHECK(config.rotary_dim() == 24);
  CHECK(config.rope_theta == 10000.0f);
  CHECK(config.use_parallel_residual);
  CHECK(config.attention_bias);  // GPTNeoXConfig's default
  CHECK(config.hidden_act == "gelu_fast");

  ModelConfig fixture = read_model_config(kParallelFolder + "/config.json");
  CHECK(fixture.rotary_pct == 0.25);
  CHECK(fixture.layer_norm_eps == 1e-5f);
  CHECK(fixture.num_key_value_heads == 4);

  const std::string minimal = R"({"model_type": "gpt_neox", "hidden_size": 64, "intermediate_size": 176,
      "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 320)";
  ModelConfig defaults = parse_model_config(minimal + "}", "min.json");
  CHECK(defaults.rotary_pct == 0.25);
  CHECK(defaults.rope_theta == 10000.0f);
  CHECK(defaults.hidden_act == "gelu");
  CHECK(defaults.use_parallel_residual);
  ModelConfig overridden = parse_model_config(
      minimal + R"(, "rotary_pct": 0.5, "rope_parameters": {"rope_theta": 500.0, "partial_rotary_factor": 1.0}})",
      "new.json");
  CHECK(overridden.rotary_pct == 1.0);  // rope_parameters wins, as in transformers
  CHECK(overridden.rope_theta == 500.0f);

  CHECK_THROWS_WITH_AS(parse_model_config(minimal + R"(, "hidden_act": "relu"})", "act.json"),
                       doctest::Contains("act.json: hidden_act \"relu\" is not supported for gpt_neox"), Error);
  CHECK_THROWS_WITH_AS(parse_model_config(minimal + R"(, "rotary_pct": 0.1})", "odd.json"),
                       doctest::Contains("odd.json: rotary_pct 0.1 must give an even"), Error);
  CHECK_THROWS_WITH_AS(parse_model_config(minimal + R"(, "use_parallel_residual": 1})", "bool.json"),
                       doctest::Contains("bool.json: field \"use_parallel_residual\" has the wrong type"), Error);
}
