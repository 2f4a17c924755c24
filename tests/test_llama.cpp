// The Llama decoder against transformers: fixtures written by
// scripts/make_fixtures.py (tiny random checkpoints + reference outputs).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include <unistd.h>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/error.h"
#include "model/families.h"
#include "model/llama.h"
#include "model/safetensors.h"
#include "tests/parity.h"

using namespace ft;
using ft::parity::relative_error;
using ft::parity::shifted_targets;

namespace {

bool gets_reference_gradient(const std::string& name) {
  return name.find("q_proj") != std::string::npos || name.find("v_proj") != std::string::npos ||
         name == "model.embed_tokens.weight" || name == "model.norm.weight";
}

// Tolerances: f32 logits 1e-4, gradients 1e-3
// (gradients sum many more products, so f32 reordering costs more).
constexpr double kLogitsTolerance = 1e-4;
constexpr double kGradientTolerance = 1e-3;

void check_against_transformers(const std::string& fixture) {
  const std::string dir = std::string(FT_FIXTURES_DIR) + "/" + fixture;
  ModelConfig config = read_model_config(dir + "/config.json");
  Checkpoint checkpoint(dir);
  Checkpoint reference(dir + "/reference.safetensors");
  HostAllocator host;
  TrackingAllocator tracker(host);
  CpuBackend backend(tracker);
  LlamaModel model(config, backend);
  model.load(checkpoint);
  // Every weight byte is accounted for: the checkpoint's bytes, no more, no less.
  CHECK(tracker.stats().current(MemCategory::weights) == checkpoint.total_bytes());

  Tensor input_ids = reference.view("input_ids");
  Tensor targets = shifted_targets(reference.view("labels"), host);
  float loss = model.forward(input_ids, targets);
  CHECK(relative_error(model.last_logits(), reference.view("logits")) <= kLogitsTolerance);
  float want_loss = reference.view("loss").ptr<float>()[0];
  CHECK(loss == doctest::Approx(want_loss).epsilon(1e-5));

  model.set_trainable(gets_reference_gradient);
  const size_t activations_before = tracker.stats().current(MemCategory::activations);
  float train_loss = model.forward_backward(input_ids, targets);
  CHECK(train_loss == doctest::Approx(want_loss).epsilon(1e-5));
  // Nothing of the step outlives it.
  CHECK(tracker.stats().current(MemCategory::activations) == activations_before);
  int checked = 0;
  for (Parameter& p : model.parameters()) {
    if (!p.trainable()) continue;
    CAPTURE(p.name);
    CHECK(relative_error(p.grad, reference.view("grad." + p.name)) <= kGradientTolerance);
    ++checked;
  }
  CHECK(checked == 2 * config.num_hidden_layers + 2);
}

}  // namespace

TEST_CASE("llama with grouped-query attention and untied embeddings matches transformers") {
  check_against_transformers("llama_gqa");
}

TEST_CASE("llama with tied embeddings matches transformers") { check_against_transformers("llama_tied"); }

TEST_CASE("a checkpoint missing a tensor the config needs is refused, naming the tensor") {
  const std::string dir = std::string(FT_FIXTURES_DIR) + "/llama_gqa";
  Checkpoint full(dir);
  std::vector<std::pair<std::string, Tensor>> kept;
  for (const std::string& name : full.names())
    if (name != "model.layers.1.mlp.up_proj.weight") kept.emplace_back(name, full.view(name));
  // Per process: ctest runs this binary three times at once (test_llama and its _avx2 and _avx512_core
  // entries), and a shared path let one run's save replace the file another was reading.
  const std::string path =
      std::string(FT_BINARY_DIR) + "/llama_missing_tensor." + std::to_string(getpid()) + ".safetensors";
  save_safetensors(path, kept);
  HostAllocator host;
  CpuBackend backend(host);
  LlamaModel model(read_model_config(dir + "/config.json"), backend);
  CHECK_THROWS_WITH_AS(model.load(Checkpoint(path)),
                       doctest::Contains("missing tensor \"model.layers.1.mlp.up_proj.weight\""), Error);
  std::remove(path.c_str());
}
