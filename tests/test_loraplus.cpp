// LoRA+ (loraplus_lr_ratio) against PEFT's create_loraplus_optimizer:
// tests/fixtures/loraplus (scripts/make_loraplus_fixture.py) holds one
// AdamW step of PEFT's LoRA+ (lr 1e-2, ratio 16, weight decay 0.01) over
// the DoRA adapter of tests/fixtures/dora/llama, where lora_A steps at lr
// and lora_B and the 1-D magnitudes at 16 x lr. Ours takes the same step to
// PEFT's values, also with the optimizer state offloaded in chunks that
// split the groups; the run config key is read and refused where it has no
// meaning.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/error.h"
#include "model/families.h"
#include "model/peft_adapter.h"
#include "model/safetensors.h"
#include "tests/host_tensors.h"
#include "tests/parity.h"
#include "trainer/optimizer.h"
#include "trainer/train_config.h"

using namespace ft;
using ft::parity::shifted_targets;

namespace {

const std::string kFixtures = FT_FIXTURES_DIR;
const std::string kBase = kFixtures + "/llama_gqa";
const std::string kDora = kFixtures + "/dora/llama";
const std::string kKeyPrefix = "base_model.model.";
constexpr double kTolerance = 1e-4;  // f32 against f32 PyTorch, as test_dora

// The DoRA fixture's adapter over llama_gqa, its gradients taken on the
// fixture's batch.
std::unique_ptr<CausalLM> stepped_model(Backend& backend, HostAllocator& host) {
  auto model = parity::adapter_model(backend, kBase, kDora + "/adapter");
  load_peft_adapter(kDora + "/adapter", *model);
  model->set_trainable([](const std::string& name) { return name.find(".lora_") != std::string::npos; });
  const Checkpoint batch(kDora + "/reference.safetensors");
  model->forward_backward(batch.view("input_ids"), shifted_targets(batch.view("labels"), host));
  return model;
}

AdamWOptions loraplus_options() {
  AdamWOptions options;
  options.weight_decay = 0.01;
  options.eps = 1e-8;
  options.max_grad_norm = 0.0;  // create_loraplus_optimizer does not clip
  options.loraplus_lr_ratio = 16.0;
  return options;
}

}  // namespace

TEST_CASE("loraplus_lr_ratio: one AdamW step gives PEFT's LoRA+ values, lora_B and the magnitudes at 16 x lr") {
  const Checkpoint reference(kFixtures + "/loraplus/reference.safetensors");
  HostAllocator host;
  CpuBackend backend(host);
  auto model = stepped_model(backend, host);
  std::vector<Parameter*> trainable = parity::check_adapter_gradients(*model, reference, kKeyPrefix, kTolerance);
  AdamW adamw(backend, trainable, loraplus_options());
  adamw.step(1e-2);
  parity::check_adapters_after_step(*model, reference, kKeyPrefix, kTolerance);
  const Checkpoint batch(kDora + "/reference.safetensors");
  const float loss_after = model->forward(batch.view("input_ids"), shifted_targets(batch.view("labels"), host));
  const float want_after = reference.view("loss_after_step").ptr<float>()[0];
  CHECK(std::abs(loss_after - want_after) <= kTolerance * std::abs(want_after));

  // Without the ratio every tensor moves by about lr: the fixture's lora_B would be 16 times off.
  auto plain = stepped_model(backend, host);
  AdamWOptions options = loraplus_options();
  options.loraplus_lr_ratio = 1.0;
  std::vector<Parameter*> plain_trainable;
  for (Parameter& adapter : plain->adapters()) plain_trainable.push_back(&adapter);
  AdamW(backend, plain_trainable, options).step(1e-2);
  const Parameter& b = plain->adapters()[1];
  REQUIRE(b.name.find(".lora_B.") != std::string::npos);
  int64_t sensitive = 0;
  CHECK(parity::after_step_error(b, reference.view("after_step." + kKeyPrefix + b.name),
                                 reference.view("grad." + kKeyPrefix + b.name), sensitive) > 10 * kTolerance);
}

TEST_CASE("loraplus_lr_ratio with the optimizer state offloaded in chunks steps as resident, bit for bit") {
  HostAllocator host;
  CpuBackend backend(host);
  auto resident = stepped_model(backend, host), offloaded = stepped_model(backend, host);
  std::vector<Parameter*> resident_trainable, offloaded_trainable;
  for (Parameter& adapter : resident->adapters()) resident_trainable.push_back(&adapter);
  for (Parameter& adapter : offloaded->adapters()) offloaded_trainable.push_back(&adapter);
  AdamW(backend, resident_trainable, loraplus_options()).step(1e-2);
  HostAllocator state;
  AdamWOptions options = loraplus_options();
  options.host_state = &state;
  options.offload_chunk_elements = 100;  // chunks that hold lora_A, lora_B and magnitude elements together
  AdamW(backend, offloaded_trainable, options).step(1e-2);
  for (size_t i = 0; i < resident_trainable.size(); ++i) {
    CAPTURE(resident_trainable[i]->name);
    CHECK(testing::same_bytes(offloaded_trainable[i]->value, resident_trainable[i]->value));
  }
}

TEST_CASE("loraplus_lr_ratio in a run config: read, and refused without adapters") {
  const std::string base = "model: m\ndata: {train: t.jsonl}\n";
  CHECK(parse_train_config(base + "loraplus_lr_ratio: 16\n", "configs/x.yaml").loraplus_lr_ratio == 16.0);
  CHECK(parse_train_config(base, "configs/x.yaml").loraplus_lr_ratio == 1.0);
  CHECK(parity::config_error(base + "loraplus_lr_ratio: 0\n") ==
        "configs/x.yaml:3: loraplus_lr_ratio: expected a number in (0, 1e6], got \"0\"");
  CHECK(parity::config_error(base + "trainable: all\nquantization: {mode: none}\nloraplus_lr_ratio: 16\n") ==
        "configs/x.yaml: loraplus_lr_ratio applies to trainable: lora (it steps lora_B faster than lora_A)");
}
