// Activation checkpointing (ModelOptions::activation_checkpointing) and the
// chunked lm_head loss (ModelOptions::loss_chunk_tokens) against the plain
// path on the fixtures: the same loss and gradients, and an activation peak
// lower by exactly what the shapes predict.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "model/causal_lm.h"
#include "model/families.h"
#include "model/safetensors.h"
#include "tests/host_tensors.h"
#include "tests/parity.h"
#include "trainer/data/data.h"
#include "trainer/evaluate.h"

using namespace ft;
using ft::testing::same_bytes;
using parity::relative_error;
using parity::shifted_targets;

namespace {

const std::string kFixtures[] = {"llama_gqa", "gpt_neox_parallel", "gpt_neox_sequential"};
constexpr int64_t kChunk = 5;  // does not divide the fixtures' 2 x 11 tokens: the last chunk has 2 rows

HostAllocator host;  // outlives every tensor copied to the host here

std::string fixture_dir(const std::string& fixture) { return std::string(FT_FIXTURES_DIR) + "/" + fixture; }

struct Step {
  ActivationCheckpointing checkpointing = ActivationCheckpointing::none;
  int64_t loss_chunk_tokens = 0;
  bool lora = true;        // LoRA (dropout 0.1) on every linear; false: every parameter trains
  uint64_t dropout_seed = 11;
  int64_t vocab_size = 0;  // 0: the fixture's weights; else random weights with this vocabulary
  bool int8_base = false;
  float int8_threshold = 6.0f;  // below the fixtures' largest MLP inputs: outlier columns that differ by chunk
  int64_t stream_slots = 0;  // > 0: the INT8 base streamed from host memory through this many slots
  int64_t mlp_chunk_tokens = 0;
  bool packed = false;  // row 0 holds two examples (position_ids restart at its token 6)
  std::vector<std::string> lora_targets = {};  // empty: every linear
};

struct StepResult {
  float loss = 0.0f;
  std::vector<std::pair<std::string, Tensor>> grads;  // host f32 copies, every trainable tensor
  size_t activation_peak = 0;                         // bytes above what was allocated before the step
};

ModelOptions model_options(const ModelConfig& config, const Step& step) {
  ModelOptions options;
  options.activation_checkpointing = step.checkpointing;
  options.loss_chunk_tokens = step.loss_chunk_tokens;
  options.quantized_base = step.int8_base ? QuantizedBase::int8 : QuantizedBase::none;
  options.int8_threshold = step.int8_threshold;
  options.stream_base = step.stream_slots > 0;
  options.stream_slots = step.stream_slots;
  options.mlp_chunk_tokens = step.mlp_chunk_tokens;
  if (!step.lora) return options;
  options.lora = LoraOptions{
      .r = 4,
      .lora_dropout = 0.1,
      .target_modules = step.lora_targets.empty() ? parity::all_linear_modules(config) : step.lora_targets};
  return options;
}

// One forward_backward on the fixture's reference batch.
StepResult train_step(const std::string& fixture, const Step& step) {
  TrackingAllocator tracker(host);
  CpuBackend backend(tracker);
  ModelConfig config = read_model_config(fixture_dir(fixture) + "/config.json");
  if (step.vocab_size) config.vocab_size = step.vocab_size;
  std::unique_ptr<CausalLM> model = make_causal_lm(config, backend, model_options(config, step));
  if (step.vocab_size)
    model->init_random(5);
  else
    model->load(Checkpoint(fixture_dir(fixture)));
  if (step.lora) {
    model->init_adapters(3);
    parity::set_lora_B(*model);
  }
  model->set_trainable([&](const std::string& name) { return !step.lora || name.find(".lora_") != std::string::npos; });
  model->set_dropout_seed(step.dropout_seed);
  Checkpoint reference(fixture_dir(fixture) + "/reference.safetensors");
  Tensor targets = shifted_targets(reference.view("labels"), host);

  StepResult result;
  tracker.reset_peaks();
  const size_t before = tracker.stats().current(MemCategory::activations);
  const Tensor input_ids = reference.view("input_ids");
  Tensor positions = Tensor::empty(input_ids.shape, DType::i32, host, MemCategory::activations);
  for (int64_t i = 0; i < positions.numel(); ++i) {
    const int64_t t = i % input_ids.dim(1);
    positions.ptr<int32_t>()[i] = int32_t(i < input_ids.dim(1) && t >= 6 ? t - 6 : t);
  }
  result.loss = model->forward_backward(input_ids, targets, 1.0f, step.packed ? &positions : nullptr);
  CHECK(tracker.stats().current(MemCategory::activations) == before);  // nothing of the step outlives it
  result.activation_peak = tracker.stats().peak(MemCategory::activations) - before;
  for (std::deque<Parameter>* list : {&model->parameters(), &model->adapters()})
    for (Parameter& p : *list) {
      if (!p.trainable()) continue;
      Tensor grad = Tensor::empty(p.grad.shape, DType::f32, host, MemCategory::gradients);
      backend.copy(grad, p.grad);
      result.grads.emplace_back(p.name, grad);
    }
  return result;
}

// got's gradients are want's bit for bit, or with max_error > 0 agree within
// it (parity::relative_error).
void check_gradients(const StepResult& got, const StepResult& want, double max_error = 0.0) {
  REQUIRE(got.grads.size() == want.grads.size());
  for (size_t i = 0; i < got.grads.size(); ++i) {
    const std::string& name = got.grads[i].first;  // not a structured binding: CAPTURE's lambda (clang, OpenMP)
    const auto& grad = got.grads[i].second;
    CAPTURE(name);
    REQUIRE(name == want.grads[i].first);
    if (max_error == 0.0) {
      CHECK(same_bytes(grad, want.grads[i].second));
      continue;
    }
    const double error = relative_error(grad, want.grads[i].second);
    CHECK(error <= max_error);
  }
}

}  // namespace

TEST_CASE("checkpointing and the chunked loss give the plain path's loss and gradients") {
  for (const std::string& fixture : kFixtures)
    for (bool lora : {true, false}) {
      CAPTURE(fixture);
      CAPTURE(lora);
      const StepResult plain = train_step(fixture, {.lora = lora});
      const StepResult checkpointed =
          train_step(fixture, {.checkpointing = ActivationCheckpointing::per_layer, .lora = lora});
      const StepResult chunked = train_step(fixture, {.loss_chunk_tokens = kChunk, .lora = lora});
      const StepResult both = train_step(
          fixture, {.checkpointing = ActivationCheckpointing::per_layer, .loss_chunk_tokens = kChunk, .lora = lora});

      // Recomputation runs the same ops on the same inputs with the same
      // dropout seeds: the loss and every gradient are bit-identical.
      CHECK(checkpointed.loss == plain.loss);
      check_gradients(checkpointed, plain);
      check_gradients(both, chunked);
      // The chunked loss gives each logits row the same value (the loss is
      // bit-identical), but its GEMMs see fewer rows: the lm_head weight's
      // gradient is added up chunk by chunk, and a GEMM library may block and
      // sum an M-row product differently for each M (oneDNN does on AVX2), so
      // dhidden and every gradient below it agree within f32 rounding.
      CHECK(chunked.loss == plain.loss);
      CHECK(both.loss == plain.loss);
      check_gradients(chunked, plain, 1e-6);

      // The dropout masks are live (another seed, other gradients), so the
      // equalities above do check that recomputation reuses the step's seeds.
      if (lora) {
        const StepResult reseeded = train_step(fixture, {.lora = lora, .dropout_seed = 12});
        CHECK(reseeded.loss != plain.loss);
      }
    }
}

// The MLP over chunks of tokens (mlp_chunk_tokens), with and without
// checkpointing, on packed rows too, the INT8 base's and LoRA dropout's
// included (its masks are drawn for the chunk's rows of the whole batch):
// every per-token value is the unchunked one's, and LoRA's gradients add the
// tokens' terms in token order (accumulate_outer_products), so the loss and
// every adapter gradient are bit-identical. A fully trained MLP weight's
// gradient is a GEMM's sum over tokens that the chunks add up in parts
// (rounded once per chunk), so those agree within f32 rounding only, as the
// chunked loss's lm_head gradient does.
TEST_CASE("the chunked MLP gives the unchunked step's loss and gradients") {
  for (const std::string& fixture : kFixtures)
    for (bool lora : {true, false})
      for (bool packed : {false, true})
        for (ActivationCheckpointing checkpointing :
             {ActivationCheckpointing::none, ActivationCheckpointing::per_layer}) {
          CAPTURE(fixture);
          CAPTURE(lora);
          CAPTURE(packed);
          CAPTURE(int(checkpointing));
          const StepResult plain = train_step(fixture, {.checkpointing = checkpointing, .lora = lora, .packed = packed});
          for (int64_t chunk : {1, 5, 7, 22, 64}) {  // 2 x 11 tokens: 5 and 7 leave a short last chunk
            CAPTURE(chunk);
            const StepResult chunked = train_step(
                fixture,
                {.checkpointing = checkpointing, .lora = lora, .mlp_chunk_tokens = chunk, .packed = packed});
            CHECK(chunked.loss == plain.loss);
            REQUIRE(chunked.grads.size() == plain.grads.size());
            for (size_t i = 0; i < plain.grads.size(); ++i) {
              const std::string& name = plain.grads[i].first;
              CAPTURE(name);
              const bool mlp_weight = !lora && name.find(".mlp.") != std::string::npos;
              if (mlp_weight) CHECK(relative_error(chunked.grads[i].second, plain.grads[i].second) <= 1e-6);
              else CHECK(same_bytes(chunked.grads[i].second, plain.grads[i].second));
            }
          }
        }
}

// LoRA (dropout 0.1) on the attention only, the long-context recipe, over
// the INT8 base and a dense one: the MLP trains nothing, so every gradient
// of the chunked step is the unchunked one's, bit for bit. The fixtures'
// MLP inputs stay below LLM.int8()'s 6.0; at a threshold of 1.5 their
// outlier columns differ from chunk to chunk (gate/up's and down's alike),
// and the chunks must still use the whole batch's (Linear::scan_rows).
TEST_CASE("with the MLP frozen, the chunked MLP's gradients are the unchunked step's bit for bit") {
  for (const std::string& fixture : kFixtures)
    for (float int8_threshold : {0.0f, 6.0f, 1.5f})
      for (ActivationCheckpointing checkpointing :
           {ActivationCheckpointing::none, ActivationCheckpointing::per_layer}) {
        const bool int8_base = int8_threshold > 0.0f;
        CAPTURE(fixture);
        CAPTURE(int8_threshold);
        CAPTURE(int(checkpointing));
        const std::vector<std::string> attention = fixture == "llama_gqa"
                                                       ? std::vector<std::string>{"q_proj", "v_proj"}
                                                       : std::vector<std::string>{"query_key_value"};
        const Step plain_step{.checkpointing = checkpointing, .int8_base = int8_base, .int8_threshold = int8_threshold,
                              .lora_targets = attention};
        const StepResult plain = train_step(fixture, plain_step);
        for (int64_t chunk : {5, 64}) {  // 64: one chunk holds all 22 tokens, so nothing is scanned
          CAPTURE(chunk);
          Step chunked_step = plain_step;
          chunked_step.mlp_chunk_tokens = chunk;
          const StepResult chunked = train_step(fixture, chunked_step);
          CHECK(chunked.loss == plain.loss);
          check_gradients(chunked, plain);
        }
      }
}

// A base streamed from host memory (on the CPU copy_async is a memcpy into
// the slot) through one slot: every layer is copied into it before it runs,
// the backward's too, and its tensors are views of the slot meanwhile. The
// loss and gradients are the resident step's bit for bit.
TEST_CASE("an INT8 base streamed through a slot gives the resident step's loss and gradients") {
  for (const std::string& fixture : kFixtures)
    for (ActivationCheckpointing checkpointing : {ActivationCheckpointing::none, ActivationCheckpointing::per_layer}) {
      CAPTURE(fixture);
      CAPTURE(int(checkpointing));
      const StepResult resident = train_step(fixture, {.checkpointing = checkpointing, .int8_base = true});
      const StepResult streamed =
          train_step(fixture, {.checkpointing = checkpointing, .int8_base = true, .stream_slots = 1});
      CHECK(streamed.loss == resident.loss);
      check_gradients(streamed, resident);
    }
}

// The peak of a training step comes while the lm_head chunk's logits exist
// (the vocabulary is raised to 8192 so that it does, even for 5-token chunks).
// Then every residual, the final norm and its statistics, the losses, dhidden
// and, without checkpointing, every layer's saved activations are alive:
//   peak = 3 N i32 token tensors + (L + 1) N C residuals + N C final norm
//        + N * norm statistics + N losses + N C dhidden
//        + (checkpointed ? 0 : L N S) + rows V logits            (f32 but tokens)
// with rows = N unchunked or the chunk, and S the f32 values one layer saves
// per token (the LayerActivations of llama.cpp and gpt_neox.cpp).
TEST_CASE("the activation peak drops by exactly the layers' saved activations and the unchunked logits") {
  for (const std::string& fixture : kFixtures) {
    CAPTURE(fixture);
    const int64_t V = 8192;
    const ModelConfig c = read_model_config(fixture_dir(fixture) + "/config.json");
    const int64_t N = 2 * 11, C = c.hidden_size, I = c.intermediate_size, L = c.num_hidden_layers;
    const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
    const bool llama = c.model_type == "llama";
    // llama: norm1, rstd1, q, k, v, attn, lse, residual_mid, norm2, rstd2, gate, up, act.
    // gpt_neox: norm1, mean1, rstd1, q, k, v, attn, lse, [residual_mid], norm2, mean2, rstd2, h.
    const int64_t S = llama ? C + 1 + Hq * D + 2 * Hkv * D + Hq * D + Hq + C + C + 1 + 3 * I
                            : C + 2 + 3 * C + C + Hq + (c.use_parallel_residual ? 0 : C) + C + 2 + I;
    const int64_t norm_statistics = llama ? 1 : 2;
    const int64_t common = 3 * N * 4 + ((L + 1) * N * C + N * C + N * norm_statistics + N + N * C) * 4;
    auto predicted = [&](bool checkpointed, int64_t logit_rows) {
      return size_t(common + (checkpointed ? 0 : L * N * S * 4) + logit_rows * V * 4);
    };
    const auto per_layer = ActivationCheckpointing::per_layer;
    const size_t plain = train_step(fixture, {.vocab_size = V}).activation_peak;
    const size_t checkpointed = train_step(fixture, {.checkpointing = per_layer, .vocab_size = V}).activation_peak;
    const size_t chunked = train_step(fixture, {.loss_chunk_tokens = kChunk, .vocab_size = V}).activation_peak;
    const size_t both =
        train_step(fixture, {.checkpointing = per_layer, .loss_chunk_tokens = kChunk, .vocab_size = V})
            .activation_peak;
    MESSAGE(fixture, " activation peak bytes: plain ", plain, ", checkpointed ", checkpointed, ", chunked ", chunked,
            ", both ", both, " (one layer saves ", N * S * 4, ", logits ", N * V * 4, ")");
    CHECK(plain == predicted(false, N));
    CHECK(checkpointed == predicted(true, N));
    CHECK(chunked == predicted(false, kChunk));
    CHECK(both == predicted(true, kChunk));
  }
}

// Checkpoint offload moves checkpoints from a GPU into host memory; the CPU
// backend's are there already, so a CPU model refuses it (device: auto on a
// machine without a GPU reaches this), naming the key.
TEST_CASE("offload.activations: host is refused on the CPU backend and without per-layer checkpointing") {
  CpuBackend backend(host);
  const ModelConfig config = read_model_config(fixture_dir("llama_gqa") + "/config.json");
  ModelOptions options;
  options.offload_activations = true;
  CHECK_THROWS_WITH_AS(make_causal_lm(config, backend, options),
                       doctest::Contains("offload.activations: host keeps the per-layer checkpoints in host memory: "
                                         "it needs activation_checkpointing: per_layer"),
                       Error);
  options.activation_checkpointing = ActivationCheckpointing::per_layer;
  CHECK_THROWS_WITH_AS(make_causal_lm(config, backend, options),
                       doctest::Contains("offload.activations: host moves the checkpoints from a GPU to host memory"),
                       Error);
}

// A T5's feed-forward blocks do not run in chunks: the option is refused by
// name rather than ignored.
TEST_CASE("mlp_chunk_tokens is refused for a T5 model, naming the key") {
  CpuBackend backend(host);
  const ModelConfig config = read_model_config(fixture_dir("t5_v1_1") + "/config.json");
  ModelOptions options;
  options.mlp_chunk_tokens = 4;
  CHECK_THROWS_WITH_AS(make_language_model(config, backend, options),
                       doctest::Contains("t5: mlp_chunk_tokens is not supported"),
                       Error);
}

// An evaluation between training steps frees everything it made: the eval
// forward keeps its [tokens, vocab] f32 logits for last_logits(), which
// evaluate_loss releases, so the steps after it do not carry them.
TEST_CASE("evaluate_loss leaves no activation behind (the eval logits are released)") {
  TrackingAllocator tracker(host);
  CpuBackend backend(tracker);
  const ModelConfig config = read_model_config(fixture_dir("llama_gqa") + "/config.json");
  std::unique_ptr<CausalLM> model = make_causal_lm(config, backend, ModelOptions{});
  model->init_random(2);
  std::vector<TokenSequence> rows;
  for (int32_t r = 0; r < 5; ++r) rows.push_back({{1, 10 + r, 20, 30 + r, 2}, {0, 1, 1, 1, 1}});
  const DataLoader eval(rows, 2, 8, 3, 1, host);
  const size_t before = tracker.stats().current(MemCategory::activations);
  const EvalLoss loss = evaluate_loss(*model, eval, 0);
  CHECK(std::isfinite(loss.loss));
  CHECK(loss.tokens == 5 * 4);
  CHECK(tracker.stats().current(MemCategory::activations) == before);
  CHECK(!model->last_logits().defined());
}
