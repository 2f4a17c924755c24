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
#include "kernels/dropout_hash.h"
#include "kernels/error.h"
#include "model/families.h"
#include "model/lora_linear.h"
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

// With dropout > 0 the adapter (PEFT's, saved with 0) trains with that LoRA dropout.
std::unique_ptr<CausalLM> dora_model(Backend& backend, const std::string& base, const std::string& adapter,
                                     QuantizedBase quantized = QuantizedBase::none, double dropout = 0.0) {
  ModelOptions options;
  options.weight_dtype = DType::f32;
  options.quantized_base = quantized;
  // A threshold below every nonzero input makes every input column an
  // outlier: LLM.int8()'s product runs in f32 through the dequantised weight
  // (the activations are not quantised), the dense product of those values.
  options.int8_threshold = 1e-30f;
  options.lora = read_peft_adapter_config(adapter).lora;
  options.lora->lora_dropout = dropout;
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
  parity::check_reference_forward(*model, reference, input_ids, targets, kTolerance);

  train_adapters(*model);
  model->forward_backward(input_ids, targets);
  parity::fixture_adamw_step(backend, parity::check_adapter_gradients(*model, reference, kKeyPrefix, kTolerance));
  parity::check_adapters_after_step(*model, reference, kKeyPrefix, kTolerance);
  const float loss_after = model->forward(input_ids, targets);
  const float want_after = reference.view("loss_after_step").ptr<float>()[0];
  CHECK(std::abs(loss_after - want_after) <= kTolerance * std::abs(want_after));
}

}  // namespace

TEST_CASE("DoRA on llama matches PEFT: initial magnitudes, logits, loss, gradients, one AdamW step") {
  check_parity(kLlama);
}

TEST_CASE("DoRA on GPT-NeoX's biased linears matches PEFT") { check_parity(kNeox); }

// PEFT's DoRA under LoRA dropout (train mode) runs F.linear(dropout(x), W)
// beside the base: the fixture replaced PEFT's masks by ours (seed 0, which
// every layer has until a run seeds them), so the two see the same dropped
// inputs.
TEST_CASE("DoRA with LoRA dropout matches PEFT's dropout branch on the same masks: loss and every gradient") {
  const std::string folder = kFixtures + "/dora/llama_dropout";
  const Checkpoint reference(folder + "/reference.safetensors");
  HostAllocator host;
  CpuBackend backend(host);
  auto model = dora_model(backend, kLlama.base, folder + "/adapter", QuantizedBase::none, 0.1);
  CHECK(read_peft_adapter_config(folder + "/adapter").lora.lora_dropout == 0.1);
  load_peft_adapter(folder + "/adapter", *model);
  train_adapters(*model);
  const float loss = model->forward_backward(reference.view("input_ids"),
                                             shifted_targets(reference.view("labels"), host));
  const float want_loss = reference.view("loss").ptr<float>()[0];
  CHECK(std::abs(loss - want_loss) <= kTolerance * std::abs(want_loss));
  parity::check_adapter_gradients(*model, reference, kKeyPrefix, kTolerance);
}

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
  for (QuantizedBase format : {QuantizedBase::nf4, QuantizedBase::int8})
    for (double dropout : {0.0, 0.1}) {
      CAPTURE(int(format));
      CAPTURE(dropout);
      HostAllocator host;
      CpuBackend backend(host);
      auto quantized = dora_model(backend, kLlama.base, adapter, format, dropout);
      auto dense = dora_model(backend, kLlama.base, adapter, QuantizedBase::none, dropout);
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

namespace {

// PEFT's DoRA layer in float64 over a dense biased base, written from its
// formula: xd = dropout(x) (the shared mask), q = xd W^T (x W^T without
// dropout: PEFT's base_result), lora = scaling xd A^T B^T, g = m / ||W +
// scaling B A||_row (a constant in backward), y = x W^T + b + (g - 1) q +
// g lora; and the gradients for dy.
struct DoraRef {
  std::vector<double> y, dx, dA, dB, dm;
};

DoraRef dora_ref(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& b,
                 const std::vector<float>& A, const std::vector<float>& B, const std::vector<float>& m,
                 const std::vector<float>& dy, int64_t N, int64_t in, int64_t out, int64_t r, double s, float p,
                 uint64_t seed) {
  auto at = [](const std::vector<float>& v, int64_t i) { return double(v[size_t(i)]); };
  auto keep = [&](int64_t i) { return dropout_keep(seed, uint64_t(i), p) ? 1.0 / (1.0 - p) : 0.0; };
  std::vector<double> xd(size_t(N * in)), h(size_t(N * r), 0.0), g(static_cast<size_t>(out));
  for (int64_t i = 0; i < N * in; ++i) xd[size_t(i)] = at(x, i) * keep(i);
  for (int64_t o = 0; o < out; ++o) {
    double norm2 = 0.0;
    for (int64_t k = 0; k < in; ++k) {
      double v = at(w, o * in + k);
      for (int64_t j = 0; j < r; ++j) v += s * at(B, o * r + j) * at(A, j * in + k);
      norm2 += v * v;
    }
    g[size_t(o)] = at(m, o) / std::sqrt(norm2);
  }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < r; ++j)
      for (int64_t k = 0; k < in; ++k) h[size_t(n * r + j)] += xd[size_t(n * in + k)] * at(A, j * in + k);
  DoraRef ref{std::vector<double>(size_t(N * out)), std::vector<double>(size_t(N * in), 0.0),
              std::vector<double>(size_t(r * in), 0.0), std::vector<double>(size_t(out * r), 0.0),
              std::vector<double>(size_t(out), 0.0)};
  std::vector<double> gh(size_t(N * r), 0.0);  // s (g dy) B: the gradient at h
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < out; ++o) {
      double xw = 0.0, q = 0.0, lora = 0.0;
      for (int64_t k = 0; k < in; ++k) {
        xw += at(x, n * in + k) * at(w, o * in + k);
        q += xd[size_t(n * in + k)] * at(w, o * in + k);
      }
      for (int64_t j = 0; j < r; ++j) lora += s * h[size_t(n * r + j)] * at(B, o * r + j);
      const double go = g[size_t(o)], d = at(dy, n * out + o);
      ref.y[size_t(n * out + o)] = xw + at(b, o) + (go - 1.0) * q + go * lora;
      ref.dm[size_t(o)] += d * (q + lora) / (at(m, o) / go);
      for (int64_t k = 0; k < in; ++k) {
        ref.dx[size_t(n * in + k)] += d * at(w, o * in + k) * (1.0 + (go - 1.0) * keep(n * in + k));
      }
      for (int64_t j = 0; j < r; ++j) {
        ref.dB[size_t(o * r + j)] += s * go * d * h[size_t(n * r + j)];
        gh[size_t(n * r + j)] += s * go * d * at(B, o * r + j);
      }
    }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < r; ++j)
      for (int64_t k = 0; k < in; ++k) {
        ref.dA[size_t(j * in + k)] += gh[size_t(n * r + j)] * xd[size_t(n * in + k)];
        ref.dx[size_t(n * in + k)] += gh[size_t(n * r + j)] * at(A, j * in + k) * keep(n * in + k);
      }
  return ref;
}

void check_close(const std::vector<float>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double largest = 0.0;
  for (double v : want) largest = std::max(largest, std::abs(v));
  for (size_t i = 0; i < got.size(); ++i) CHECK(std::abs(got[i] - want[i]) <= 2e-5 * largest);
}

// The layer against the float64 formula, with and without LoRA dropout (the
// base then runs twice: over x, and PEFT's F.linear over the dropped input).
void check_dora_layer(int64_t N, int64_t in, int64_t out, int64_t r) {
  HostAllocator host;
  CpuBackend backend(host);
  const double s = lora_scaling(8.0, r, false);
  const std::vector<float> w = testing::gaussian(out * in, 0.1f, 1), x = testing::gaussian(N * in, 1.0f, 2);
  const std::vector<float> A = testing::gaussian(r * in, 0.15f, 3), B = testing::gaussian(out * r, 0.2f, 4);
  const std::vector<float> b = testing::gaussian(out, 0.5f, 5), dy = testing::gaussian(N * out, 1.0f, 6);
  std::vector<float> m = testing::gaussian(out, 0.1f, 7);
  for (float& v : m) v += 0.7f;
  for (float p : {0.0f, 0.3f})
    for (bool accumulate_dx : {false, true}) {
      CAPTURE(p);
      CAPTURE(accumulate_dx);
      Parameter weight, bias, lora_A, lora_B, magnitude;
      weight.value = testing::make(backend, {out, in}, w);
      bias.value = testing::make(backend, {out}, b);
      auto trainable = [&](Parameter& param, const Shape& shape, const std::vector<float>& values) {
        param.value = testing::make(backend, shape, values);
        param.grad = testing::make(backend, shape, std::vector<float>(size_t(shape_numel(shape)), 0.5f));
      };
      trainable(lora_A, {r, in}, A);
      trainable(lora_B, {out, r}, B);
      trainable(magnitude, {out}, m);
      LoraLinear layer(std::make_unique<DenseLinear>(weight, &bias), lora_A, lora_B, float(s), p, &magnitude, &bias);
      layer.set_dropout_seed(77);
      const DoraRef ref = dora_ref(x, w, b, A, B, m, dy, N, in, out, r, s, p, 77);
      const Tensor xt = testing::make(backend, {N, in}, x), dyt = testing::make(backend, {N, out}, dy);
      Tensor y = backend.empty({N, out}, DType::f32, MemCategory::activations);
      layer.forward(backend, y, xt);
      check_close(testing::read(y), ref.y);
      Tensor dx = testing::make(backend, {N, in}, std::vector<float>(size_t(N * in), 1.0f));
      layer.backward(backend, &dx, dyt, xt, accumulate_dx);
      auto plus = [](std::vector<double> v, double prior) {
        for (double& e : v) e += prior;
        return v;
      };
      check_close(testing::read(dx), plus(ref.dx, accumulate_dx ? 1.0 : 0.0));
      check_close(testing::read(lora_A.grad), plus(ref.dA, 0.5));
      check_close(testing::read(lora_B.grad), plus(ref.dB, 0.5));
      check_close(testing::read(magnitude.grad), plus(ref.dm, 0.5));
    }
}

}  // namespace

// in < 64 (one tile narrower than NF4's block), and a weight of 1,100 x
// 4,133 whose norm and dropped branch take two column tiles (the second
// partial): the tiles' sums and products must add up as one.
TEST_CASE("a DoRA layer matches PEFT's formula in float64, with and without dropout, bias included") {
  struct Sizes {
    int64_t N, in, out, r;
  };
  for (const Sizes& size : {Sizes{10, 37, 23, 4}, Sizes{3, 4133, 1100, 2}}) {
    CAPTURE(size.in);
    check_dora_layer(size.N, size.in, size.out, size.r);
  }
}

TEST_CASE("a DoRA magnitude the adapter config does not ask for is refused naming the tensor") {
  const std::string adapter = kLlama.folder + "/adapter";
  const SafetensorsFile file(adapter + "/adapter_model.safetensors");
  PeftAdapterConfig config = read_peft_adapter_config(adapter);
  CHECK(config.lora.use_dora);
  CHECK(read_lora_pairs(file, config).begin()->second.magnitude != nullptr);
  config.lora.use_dora = false;
  CHECK_THROWS_WITH(read_lora_pairs(file, config), doctest::Contains("is DoRA's magnitude but adapter_config.json"));
}
