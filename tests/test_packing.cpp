// Padding-free packing end to end on the CPU: examples packed into shared
// rows (make_rows, the DataLoader's position_ids, the model's cu_seqlens)
// give the loss and LoRA gradients of the same examples one per padded row,
// on the fixtures with grouped-query attention and llama3 rope, a sliding
// window shorter than the examples (Mistral) and GPT-NeoX's fused qkv with
// partial rotary.
#include <doctest/doctest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "model/causal_lm.h"
#include "model/families.h"
#include "model/safetensors.h"
#include "tests/packing_step.h"
#include "tests/parity.h"
#include "trainer/data/data.h"
#include "trainer/evaluate.h"

using namespace ft;
using ft::packing_test::kSeqLen;
using ft::packing_test::random_examples;
using ft::packing_test::StepResult;

namespace {

HostAllocator host;  // outlives every batch and copy made here

std::string fixture_dir(const std::string& fixture) { return std::string(FT_FIXTURES_DIR) + "/" + fixture; }

// One step on the CPU backend (tests/packing_step.h).
StepResult train_step(const std::string& fixture, Packing packing, bool keep_positions = true) {
  CpuBackend backend(host);
  return packing_test::train_step(backend, host, fixture_dir(fixture), packing, DType::f32, keep_positions);
}

}  // namespace

TEST_CASE("a packed micro-batch has the loss and LoRA gradients of its examples unpacked") {
  for (const std::string fixture : {"llama3_tiny", "llama_gqa", "mistral", "gpt_neox_parallel"}) {
    CAPTURE(fixture);
    const StepResult padded = train_step(fixture, Packing::none);
    const StepResult packed = train_step(fixture, Packing::padding_free);
    CHECK(padded.rows == 9);
    CHECK(packed.rows < 9);
    CHECK(std::abs(packed.loss - padded.loss) <= 1e-6 * std::abs(padded.loss));
    REQUIRE(packed.grads.size() == padded.grads.size());
    for (size_t i = 0; i < packed.grads.size(); ++i) {
      CAPTURE(i);
      CHECK(parity::relative_error(packed.grads[i], padded.grads[i]) <= 1e-6);
    }
    // The same rows with attention crossing examples (no position_ids) differ:
    // the equality above rests on the boundaries.
    const StepResult crossing = train_step(fixture, Packing::padding_free, false);
    CHECK(std::abs(crossing.loss - padded.loss) > 1e-4 * std::abs(padded.loss));
  }
}

// transformers with the same position_ids and no attention mask masks each
// example to itself (scripts/make_packing_fixture.py, which also checks that
// its packed logits are each example's alone).
TEST_CASE("packed logits equal transformers' with per-example position_ids") {
  for (const std::string fixture : {"llama3_tiny", "mistral", "gpt_neox_parallel"}) {
    CAPTURE(fixture);
    CpuBackend backend(host);
    const ModelConfig config = read_model_config(fixture_dir(fixture) + "/config.json");
    std::unique_ptr<CausalLM> model = make_causal_lm(config, backend, ModelOptions{});
    model->load(Checkpoint(fixture_dir(fixture)));
    Checkpoint reference(fixture_dir("packing") + "/" + fixture + ".safetensors");
    const Tensor ids = reference.view("input_ids"), position_ids = reference.view("position_ids");
    model->forward(ids, ids, &position_ids);
    CHECK(parity::relative_error(model->last_logits(), reference.view("logits")) <= 1e-5);
    model->forward(ids, ids);  // the same row with attention crossing the examples
    CHECK(parity::relative_error(model->last_logits(), reference.view("logits")) > 1e-3);
  }
}

// Evaluation batches keep their position_ids through trim_padding: the eval
// loss over a packed set is the padded set's.
TEST_CASE("the eval loss over packed rows equals the loss over padded rows") {
  CpuBackend backend(host);
  const ModelConfig config = read_model_config(fixture_dir("llama3_tiny") + "/config.json");
  std::unique_ptr<CausalLM> model = make_causal_lm(config, backend, ModelOptions{});
  model->load(Checkpoint(fixture_dir("llama3_tiny")));
  const TokenizedDataset data = random_examples(config.vocab_size);
  const DataLoader padded(make_rows(data, kSeqLen, Packing::none), 2, kSeqLen, 3, 1, host);
  const DataLoader packed(make_rows(data, kSeqLen, Packing::padding_free), 2, kSeqLen, 3, 1, host);
  const EvalLoss want = evaluate_loss(*model, padded, 0), got = evaluate_loss(*model, packed, 0);
  CHECK(packed.batches_per_epoch() < padded.batches_per_epoch());
  CHECK(got.tokens == want.tokens);
  CHECK(std::abs(got.loss - want.loss) <= 1e-6 * std::abs(want.loss));
}

TEST_CASE("position_ids that do not restart at 0 or count by one are refused, naming the token") {
  CpuBackend backend(host);
  const ModelConfig config = read_model_config(fixture_dir("llama_gqa") + "/config.json");
  std::unique_ptr<CausalLM> model = make_causal_lm(config, backend, ModelOptions{});
  model->init_random(1);
  const std::vector<int32_t> ids = {5, 6, 7, 8, 5, 6, 7, 8};
  const Tensor input_ids = Tensor::view_of(const_cast<int32_t*>(ids.data()), {2, 4}, DType::i32);
  auto refuse = [&](std::vector<int32_t> positions, const char* says) {
    const Tensor position_ids = Tensor::view_of(positions.data(), {2, 4}, DType::i32);
    CHECK_THROWS_WITH_AS(model->forward(input_ids, input_ids, &position_ids), doctest::Contains(says), Error);
  };
  refuse({0, 1, 2, 3, 1, 2, 3, 4}, "position_ids[1, 0] is 1, expected 0 (an example starts)");
  refuse({0, 1, 3, 0, 0, 1, 2, 3}, "position_ids[0, 2] is 3, expected 0 (an example starts) or 2");
  std::vector<int32_t> fine = {0, 1, 0, 1, 0, 0, 1, 2};
  const Tensor fine_ids = Tensor::view_of(fine.data(), {2, 4}, DType::i32);
  CHECK(std::isfinite(model->forward(input_ids, input_ids, &fine_ids)));
}
