// Long context on the CPU: a tiny Llama with LoRA at T = 32,768 tokens
// against transformers + PEFT (tests/fixtures/long_context,
// scripts/make_long_context_fixture.py) for the three rope scalings released
// long-context checkpoints use (llama3, linear, dynamic NTK past
// max_position_embeddings): the loss, logits at every 2,048th position and
// every LoRA gradient. And a step whose q holds more than 2^31 elements,
// planned on the meta device, where no size may wrap around.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "kernels/cpu/cpu_backend.h"
#include "model/families.h"
#include "model/peft_adapter.h"
#include "model/safetensors.h"
#include "tests/parity.h"
#include "trainer/plan.h"
#include "trainer/setup.h"
#include "trainer/train_config.h"

using namespace ft;
using ft::parity::relative_error;
using ft::parity::shifted_targets;

namespace {

// The fixture's own f32 against f64 check gives at most 9e-6 (its script
// prints it); measured here: losses equal to 6 digits, gradients within
// 8.7e-6 relative.
constexpr double kLossTolerance = 1e-5, kLogitsTolerance = 1e-4, kGradientTolerance = 1e-4;

void check_long_context(const std::string& rope) {
  CAPTURE(rope);
  const std::string dir = std::string(FT_FIXTURES_DIR) + "/long_context/" + rope, adapter = dir + "/adapter";
  Checkpoint reference(dir + "/reference.safetensors");
  HostAllocator host;
  CpuBackend backend(host);
  ModelOptions options;
  options.lora = read_peft_adapter_config(adapter).lora;
  std::unique_ptr<CausalLM> model = make_causal_lm(read_model_config(dir + "/config.json"), backend, options);
  model->load(Checkpoint(dir));
  load_peft_adapter(adapter, *model);
  model->set_trainable([](const std::string& name) { return name.find("lora_") != std::string::npos; });
  const Tensor input_ids = reference.view("input_ids");
  REQUIRE(input_ids.dim(1) == 32768);
  const Tensor targets = shifted_targets(input_ids, host);

  const float loss = model->forward(input_ids, targets);
  const float want_loss = reference.view("loss").ptr<float>()[0];
  MESSAGE(rope, ": loss ", loss, ", transformers' ", want_loss);
  CHECK(std::abs(loss - want_loss) <= kLossTolerance * want_loss);
  const Tensor positions = reference.view("logit_positions"), want_rows = reference.view("logits_rows");
  const int64_t V = want_rows.dim(1);
  Tensor rows = Tensor::empty(want_rows.shape, DType::f32, host, MemCategory::activations);
  for (int64_t r = 0; r < positions.numel(); ++r)
    std::copy_n(model->last_logits().ptr<float>() + int64_t(positions.ptr<int32_t>()[r]) * V, V,
                rows.ptr<float>() + r * V);
  CHECK(relative_error(rows, want_rows) <= kLogitsTolerance);

  model->forward_backward(input_ids, targets);
  for (Parameter& p : model->adapters()) {
    CAPTURE(p.name);
    const double error = relative_error(p.grad, reference.view("grad.base_model.model." + p.name));
    MESSAGE(p.name, " gradient relative error ", error);
    CHECK(error <= kGradientTolerance);
  }
}

}  // namespace

TEST_CASE("32,768 tokens with llama3, linear and dynamic rope match transformers + PEFT") {
  for (const char* rope : {"llama3", "linear", "dynamic"}) check_long_context(rope);
}

// Llama-3.1-8B's shape at T = 524,544 tokens (2^19 + 256): q, k's and v's
// rows, the attention output and every [T, 4096] activation hold
// 2,148,532,224 elements, past 2^31. The plan must count their bytes
// exactly (an int32 product would wrap negative), with the checkpoints
// offloaded so the step is a long-context one.
TEST_CASE("plan: a step whose activations pass 2^31 elements counts them without wrapping") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(FT_BINARY_DIR) / "test_long_context_tmp";
  fs::create_directories(dir);
  std::ifstream source(std::string(FT_SOURCE_DIR) + "/configs/llama-3.1-8b/config.json");
  std::string json((std::istreambuf_iterator<char>(source)), std::istreambuf_iterator<char>());
  const std::string key = "\"max_position_embeddings\": 131072";
  REQUIRE(json.find(key) != std::string::npos);
  json.replace(json.find(key), key.size(), "\"max_position_embeddings\": 1048576");
  std::ofstream(dir / "config.json") << json;
  const TrainConfig config = plan_config_for_model(
      (dir / "config.json").string(),
      {"quantization.mode=nf4", "lora.target_modules=[q_proj,v_proj]", "offload.activations=host"});
  const int64_t T = (int64_t(1) << 19) + 256;
  const int64_t elements = T * 32 * 128;
  REQUIRE(elements > (int64_t(1) << 31));
  const StepPlan plan = plan_step(config, PlanOptions{}, 1, T);
  // Two bf16 [T, 4096] tensors live at once at least (a layer's input and
  // its norm's output), so the activations exceed 2 x 4 GiB.
  CHECK(plan.at_peak.current(MemCategory::activations) > size_t(2 * elements) * 2);
  CHECK(plan.host_activation_bytes == size_t(31 * elements) * 2);
  CHECK(plan.activation_pcie_bytes == 2 * plan.host_activation_bytes);
  MESSAGE("Llama-3.1-8B NF4 at ", T, " tokens: peak ", plan.total_bytes(), " bytes, checkpoints in host memory ",
          plan.host_activation_bytes);
  fs::remove_all(dir);
}

TEST_CASE("seq_len past max_position_embeddings: refused with fixed rope, taken with dynamic NTK rope") {
  // Dynamic NTK rope rescales its base for each longer sequence, so
  // transformers trains and generates past the model's positions with it.
  for (const std::string fixture : {"llama_gqa", "llama_dynamic_rope"}) {
    CAPTURE(fixture);
    const std::string dir = std::string(FT_FIXTURES_DIR) + "/" + fixture;
    const ModelConfig model = read_model_config(dir + "/config.json");
    const TrainConfig config = parse_train_config(
        "model: " + dir + "\ndata: {train: unused.jsonl}\nseq_len: " + std::to_string(4 * model.max_position_embeddings),
        "long.yaml");
    if (model.rope_scaling.type == "dynamic") {
      CHECK_NOTHROW(check_seq_len(config, model));
    } else {
      CHECK_THROWS_WITH_AS(check_seq_len(config, model),
                           doctest::Contains("is larger than the model's max_position_embeddings"), Error);
    }
  }
}
