// DoRA (PEFT's use_dora) against PEFT: tests/fixtures/dora/{llama,neox}
// (scripts/make_dora_fixture.py) hold PEFT's initial magnitudes, an adapter
// with noisy B and magnitude, and its logits, loss, every adapter tensor's
// gradient, one AdamW step and merge_and_unload()'s weights, on llama_gqa
// (every linear adapted) and gpt_neox_parallel (biased linears: the
// magnitude scales x W^T, not the bias). Over NF4 and INT8 bases the same
// math must hold on the dequantised weights: a dense model holding them
// gives the same initial magnitudes and gradients (the weight norms come from
// each format's own column tiles, the backward's recomputed forward from its
// own kernels).
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/error.h"
#include "model/families.h"
#include "model/peft_adapter.h"
#include "model/quant/formats.h"
#include "model/quantized_format.h"
#include "model/safetensors.h"
#include "tests/host_tensors.h"
#include "tests/parity.h"

using namespace ft;
using ft::parity::relative_error;
using ft::parity::shifted_targets;
namespace fs = std::filesystem;

namespace {

const std::string kFixtures = FT_FIXTURES_DIR;
const std::string kKeyPrefix = "base_model.model.";

// f32 against f32 PyTorch: the fixture's own f32 vs f64 check gives ~6e-7
// for logits and ~1.2e-6 for gradients (as test_peft's LoRA).
constexpr double kTolerance = 1e-4;

struct Case {
  std::string base, folder;
};
const Case kLlama{kFixtures + "/llama_gqa", kFixtures + "/dora/llama"};
const Case kNeox{kFixtures + "/gpt_neox_parallel", kFixtures + "/dora/neox"};

std::unique_ptr<CausalLM> dora_model(Backend& backend, const std::string& base, const std::string& adapter,
                                     QuantizedBase quantized = QuantizedBase::none) {
  ModelOptions options;
  options.weight_dtype = DType::f32;
  options.quantized_base = quantized;
  // A threshold below every nonzero input makes every input column an
  // outlier: LLM.int8()'s product runs in f32 through the dequantised weight
  // (the activations are not quantised), the dense product of those values.
  options.int8_threshold = 1e-30f;
  options.lora = read_peft_adapter_config(adapter).lora;
  auto model = make_causal_lm(read_model_config(base + "/config.json"), backend, options);
  model->load(Checkpoint(base));
  return model;
}

void train_adapters(CausalLM& model) {
  model.set_trainable([](const std::string& name) { return name.find(".lora_") != std::string::npos; });
}

void check_parity(const Case& c) {
  const Checkpoint reference(c.folder + "/reference.safetensors");
  HostAllocator host;
  CpuBackend backend(host);
  auto model = dora_model(backend, c.base, c.folder + "/adapter");

  // PEFT's init: the magnitude is each base weight row's norm.
  model->init_adapters(7);
  int64_t magnitudes = 0;
  for (Parameter& adapter : model->adapters()) {
    if (!adapter.name.ends_with(".lora_magnitude_vector")) continue;
    CAPTURE(adapter.name);
    const std::string module = adapter.name.substr(0, adapter.name.rfind('.'));
    CHECK(relative_error(adapter.value, reference.view("init_magnitude." + module)) <= 1e-6);
    ++magnitudes;
  }
  CHECK(magnitudes * 3 == int64_t(model->adapters().size()));

  load_peft_adapter(c.folder + "/adapter", *model);
  const Tensor input_ids = reference.view("input_ids");
  const Tensor targets = shifted_targets(reference.view("labels"), host);
  const float loss = model->forward(input_ids, targets);
  CHECK(relative_error(model->last_logits(), reference.view("logits")) <= kTolerance);
  const float want_loss = reference.view("loss").ptr<float>()[0];
  CHECK(std::abs(loss - want_loss) <= kTolerance * std::abs(want_loss));

  train_adapters(*model);
  model->forward_backward(input_ids, targets);
  parity::fixture_adamw_step(backend, parity::check_adapter_gradients(*model, reference, kKeyPrefix, kTolerance));
  for (Parameter& adapter : model->adapters()) {
    CAPTURE(adapter.name);
    CHECK(relative_error(adapter.value, reference.view("after_step." + kKeyPrefix + adapter.name)) <= kTolerance);
  }
  const float loss_after = model->forward(input_ids, targets);
  const float want_after = reference.view("loss_after_step").ptr<float>()[0];
  CHECK(std::abs(loss_after - want_after) <= kTolerance * std::abs(want_after));
}

}  // namespace

TEST_CASE("DoRA on llama matches PEFT: initial magnitudes, logits, loss, gradients, one AdamW step") {
  check_parity(kLlama);
}

TEST_CASE("DoRA on GPT-NeoX's biased linears matches PEFT") { check_parity(kNeox); }

TEST_CASE("a DoRA adapter saves PEFT's keys and config and loads back to the same logits") {
  const Checkpoint reference(kLlama.folder + "/reference.safetensors");
  HostAllocator host;
  CpuBackend backend(host);
  const std::string adapter = kLlama.folder + "/adapter";
  auto model = dora_model(backend, kLlama.base, adapter);
  load_peft_adapter(adapter, *model);
  const Tensor input_ids = reference.view("input_ids");
  const Tensor targets = shifted_targets(reference.view("labels"), host);
  model->forward(input_ids, targets);

  const std::string folder = parity::check_save_and_reload(
      *model, adapter, [&](const std::string& saved) { return dora_model(backend, kLlama.base, saved); },
      "test_dora_saved", input_ids, targets);
  CHECK(parity::read_json(folder + "/adapter_config.json")["use_dora"] == true);

  // Into a model built without DoRA: refused naming the field.
  ModelOptions plain;
  plain.weight_dtype = DType::f32;
  plain.lora = read_peft_adapter_config(adapter).lora;
  plain.lora->use_dora = false;
  auto lora_only = make_causal_lm(read_model_config(kLlama.base + "/config.json"), backend, plain);
  CHECK_THROWS_WITH(load_peft_adapter(folder, *lora_only), doctest::Contains("field \"use_dora\" is true but the model's adapters have use_dora = false"));
}

TEST_CASE("finetune merge of a DoRA adapter gives PEFT's merge_and_unload weights") {
  for (const Case& c : {kLlama, kNeox}) {
    CAPTURE(c.folder);
    const Checkpoint reference(c.folder + "/reference.safetensors");
    int64_t checked = 0;
    parity::check_merged_weights(c.base, c.folder + "/adapter", reference, "test_dora_merged", &checked);
    CHECK(checked == (c.folder == kLlama.folder ? 14 : 8));
  }
}

namespace {

// The model's quantised weights dequantised into dense's same-named f32 weights.
void copy_dequantised(CausalLM& quantized, CausalLM& dense, QuantizedBase format) {
  for (Parameter& p : quantized.parameters()) {
    Parameter& target = dense.parameter(p.name);
    if (!p.is_quantized()) {
      dense.backend().copy(target.value, p.value);
      continue;
    }
    quantized_format(format).dequantize(quantized.backend(), p, target.value);
  }
}

}  // namespace

TEST_CASE("DoRA over NF4 and INT8 bases: the math of a dense model holding the dequantised weights") {
  const Checkpoint reference(kLlama.folder + "/reference.safetensors");
  const std::string adapter = kLlama.folder + "/adapter";
  for (QuantizedBase format : {QuantizedBase::nf4, QuantizedBase::int8}) {
    CAPTURE(int(format));
    HostAllocator host;
    CpuBackend backend(host);
    auto quantized = dora_model(backend, kLlama.base, adapter, format);
    auto dense = dora_model(backend, kLlama.base, adapter);
    copy_dequantised(*quantized, *dense, format);
    // Fresh adapters: the magnitudes are the dequantised weights' row norms.
    quantized->init_adapters(11);
    dense->init_adapters(11);
    for (size_t i = 0; i < dense->adapters().size(); ++i) {
      CAPTURE(dense->adapters()[i].name);
      CHECK(relative_error(quantized->adapters()[i].value, dense->adapters()[i].value) <= 1e-6);
    }
    load_peft_adapter(adapter, *quantized);
    load_peft_adapter(adapter, *dense);
    train_adapters(*quantized);
    train_adapters(*dense);
    const Tensor input_ids = reference.view("input_ids");
    const Tensor targets = shifted_targets(reference.view("labels"), host);
    quantized->forward_backward(input_ids, targets);
    dense->forward_backward(input_ids, targets);
    // The same products of the same values; only the summation order may differ.
    const double tolerance = 1e-5;
    for (size_t i = 0; i < dense->adapters().size(); ++i) {
      CAPTURE(dense->adapters()[i].name);
      const double error = relative_error(quantized->adapters()[i].grad, dense->adapters()[i].grad);
      MESSAGE("gradient relative error ", error, " ", dense->adapters()[i].name);
      CHECK(error <= tolerance);
    }
  }
}

TEST_CASE("DoRA's refusals: dropout while training, a magnitude the adapter config does not ask for") {
  // A magnitude beside a plain LoRA adapter, or missing from a DoRA one, is refused naming the tensor.
  const std::string adapter = kLlama.folder + "/adapter";
  const SafetensorsFile file(adapter + "/adapter_model.safetensors");
  PeftAdapterConfig config = read_peft_adapter_config(adapter);
  CHECK(config.lora.use_dora);
  CHECK(read_lora_pairs(file, config).begin()->second.magnitude != nullptr);
  config.lora.use_dora = false;
  CHECK_THROWS_WITH(read_lora_pairs(file, config), doctest::Contains("is DoRA's magnitude but adapter_config.json"));

  HostAllocator host;
  CpuBackend backend(host);
  ModelOptions options;
  options.weight_dtype = DType::f32;
  options.lora = read_peft_adapter_config(adapter).lora;
  options.lora->lora_dropout = 0.1;
  auto with_dropout = make_causal_lm(read_model_config(kLlama.base + "/config.json"), backend, options);
  with_dropout->load(Checkpoint(kLlama.base));
  with_dropout->init_adapters(3);
  const Checkpoint reference(kLlama.folder + "/reference.safetensors");
  const Tensor input_ids = reference.view("input_ids");
  const Tensor targets = shifted_targets(reference.view("labels"), host);
  train_adapters(*with_dropout);
  CHECK_THROWS_WITH(with_dropout->forward_backward(input_ids, targets),
                    doctest::Contains("lora.use_dora: true trains with lora.lora_dropout: 0 only"));
  // Outside training the dropout is off, so a DoRA adapter trained with dropout (by PEFT) still generates.
  CHECK(std::isfinite(with_dropout->forward(input_ids, targets)));
}
