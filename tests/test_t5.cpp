// T5 against transformers + PEFT: fixtures written by scripts/make_t5_fixtures.py
// (tests/fixtures/README.md, "T5"), tiny random T5ForConditionalGeneration
// checkpoints with odd sizes (d_kv 6 x 3 heads over d_model 20, 3 encoder and
// 2 decoder layers, 10 buckets with max distance 9):
//   t5_v1_0  relu feed-forward, tied embeddings (output scaled by d_model^-0.5)
//   t5_v1_1  gated-gelu feed-forward, its own lm_head (as FLAN-T5)
// Each is checked for the logits, the loss and every parameter's gradient,
// then with PEFT's adapter (q and v, which also match EncDecAttention) for the
// logits, loss, adapter gradients, one AdamW step and the loss after it; the
// adapter we save is PEFT's file, key for key and value for value; greedy
// generation gives generate()'s tokens.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/error.h"
#include "kernels/meta/meta_backend.h"
#include "model/causal_lm.h"
#include "model/families.h"
#include "model/peft_adapter.h"
#include "model/safetensors.h"
#include "model/t5.h"
#include "tests/host_tensors.h"
#include "tests/parity.h"
#include "trainer/generate_seq2seq.h"

using namespace ft;
using ft::testing::same_bytes;
using ft::parity::relative_error;

namespace {

// The tolerances of the Llama / GPT-NeoX parity tests: the fixtures' own f32
// vs f64 checks give <= 3.4e-6 (logits) and <= 8e-6 (gradients).
constexpr double kLogitsTolerance = 1e-4;
constexpr double kGradientTolerance = 1e-4;
const std::string kKeyPrefix = "base_model.model.";

std::string fixture_dir(const std::string& fixture) { return std::string(FT_FIXTURES_DIR) + "/" + fixture; }

ModelOptions f32_options() {
  ModelOptions options;
  options.weight_dtype = DType::f32;
  options.quantized_base = QuantizedBase::none;
  return options;
}

void check_loss(float got, const Tensor& want_tensor, const std::string& what) {
  const float want = want_tensor.ptr<float>()[0];
  MESSAGE(what, " relative error ", std::abs(got - want) / std::abs(want));
  CHECK(std::abs(got - want) <= 1e-5 * std::abs(want));
}

void check_against_transformers(const std::string& fixture, bool tied) {
  const std::string dir = fixture_dir(fixture);
  const ModelConfig config = read_model_config(dir + "/config.json");
  REQUIRE(config.tie_word_embeddings == tied);
  REQUIRE(config.head_dim * config.num_attention_heads != config.hidden_size);
  Checkpoint checkpoint(dir);
  Checkpoint reference(dir + "/reference.safetensors");
  HostAllocator host;
  TrackingAllocator tracker(host);
  CpuBackend backend(tracker);
  T5Model model(config, backend, f32_options());
  model.load(checkpoint);
  // Every weight byte is accounted for: the checkpoint's bytes, no more, no less.
  CHECK(tracker.stats().current(MemCategory::weights) == checkpoint.total_bytes());

  const Tensor input_ids = reference.view("input_ids"), labels = reference.view("labels");
  const Tensor decoder_ids = t5_decoder_inputs(labels, config.decoder_start_token_id, 0, host);
  CHECK(same_bytes(decoder_ids, reference.view("decoder_input_ids")));
  const float loss = model.forward(input_ids, decoder_ids, labels);
  const double logits_error = relative_error(model.last_logits(), reference.view("logits"));
  MESSAGE(fixture, " logits relative error ", logits_error);
  CHECK(logits_error <= kLogitsTolerance);
  check_loss(loss, reference.view("loss"), fixture + " loss");

  model.set_trainable([](const std::string&) { return true; });
  const size_t activations_before = tracker.stats().current(MemCategory::activations);
  check_loss(model.forward_backward(input_ids, decoder_ids, labels), reference.view("loss"), fixture + " train loss");
  // Nothing of the step outlives it.
  CHECK(tracker.stats().current(MemCategory::activations) == activations_before);
  double worst = 0.0;
  for (Parameter& p : model.parameters()) {
    CAPTURE(p.name);
    const double error = relative_error(p.grad, reference.view("grad." + p.name));
    worst = std::max(worst, error);
    CHECK(error <= kGradientTolerance);
  }
  MESSAGE(fixture, " worst gradient relative error ", worst, " over ", model.parameters().size(), " tensors");
}

void check_lora_against_peft(const std::string& fixture) {
  const std::string dir = fixture_dir(fixture), adapter = dir + "/adapter";
  Checkpoint reference(dir + "/lora_reference.safetensors");
  HostAllocator host;
  CpuBackend backend(host);
  ModelOptions options = f32_options();
  const PeftAdapterConfig peft = read_peft_adapter_config(adapter);
  CHECK(peft.task_type == "SEQ_2_SEQ_LM");
  options.lora = peft.lora;
  options.lora->target_modules = {};  // PEFT's default for t5: q and v
  std::unique_ptr<LanguageModel> built = make_language_model(read_model_config(dir + "/config.json"), backend, options);
  REQUIRE(built->as_seq2seq());
  T5Model& model = *built->as_seq2seq();
  CHECK(model.options().lora->target_modules == std::vector<std::string>{"q", "v"});
  // Encoder: 3 x (q, v); decoder: 2 x (self q, v and EncDecAttention q, v); A and B each.
  REQUIRE(model.adapters().size() == 2 * (3 * 2 + 2 * 4));
  model.load(Checkpoint(dir));
  load_peft_adapter(adapter, model);

  const Tensor input_ids = reference.view("input_ids"), labels = reference.view("labels");
  const Tensor decoder_ids = reference.view("decoder_input_ids");
  check_loss(model.forward(input_ids, decoder_ids, labels), reference.view("loss"), fixture + " lora loss");
  const double logits_error = relative_error(model.last_logits(), reference.view("logits"));
  MESSAGE(fixture, " lora logits relative error ", logits_error);
  CHECK(logits_error <= kLogitsTolerance);

  model.set_trainable([](const std::string& name) { return name.find("lora_") != std::string::npos; });
  model.forward_backward(input_ids, decoder_ids, labels);
  std::vector<Parameter*> trainable;
  double worst = 0.0;
  for (Parameter& p : model.adapters()) {
    CAPTURE(p.name);
    const double error = relative_error(p.grad, reference.view("grad." + kKeyPrefix + p.name));
    worst = std::max(worst, error);
    CHECK(error <= kGradientTolerance);
    trainable.push_back(&p);
  }
  MESSAGE(fixture, " worst LoRA gradient relative error ", worst);
  parity::fixture_adamw_step(backend, trainable);
  worst = 0.0;
  int64_t sensitive = 0;
  for (Parameter* p : trainable) {
    CAPTURE(p->name);
    const double error = ft::parity::after_step_error(*p, reference.view("after_step." + kKeyPrefix + p->name),
                                          reference.view("grad." + kKeyPrefix + p->name), sensitive);
    worst = std::max(worst, error);
    CHECK(error <= kGradientTolerance);
  }
  MESSAGE(fixture, " worst after-step relative error ", worst, " (", sensitive,
          " values with |grad| < 1e-6 left out)");
  CHECK(sensitive <= 1);
  check_loss(model.forward(input_ids, decoder_ids, labels), reference.view("loss_after_step"),
             fixture + " loss after step");

  // The stepped adapter, and our logits for the first row with it, kept under
  // the build folder for scripts/check_adapter_in_peft.py (PEFT must
  // reproduce them): folder/adapter and folder/adapter_logits.safetensors.
  const std::string folder = std::string(FT_BINARY_DIR) + "/test_t5/" + fixture + "_after_step";
  std::filesystem::remove_all(folder);
  save_peft_adapter(folder + "/adapter", model, peft);
  const Tensor row_ids = input_ids.slice_rows(0, 1), row_decoder_ids = decoder_ids.slice_rows(0, 1);
  model.forward(row_ids, row_decoder_ids, labels.slice_rows(0, 1));
  save_safetensors(folder + "/adapter_logits.safetensors",
                   {{"input_ids", row_ids}, {"decoder_input_ids", row_decoder_ids}, {"logits", model.last_logits()}});
}

// Our save of PEFT's adapter is PEFT's file: the same keys (T5's names under
// base_model.model.) and values, and it loads back to the same logits.
void check_adapter_round_trip(const std::string& fixture) {
  const std::string dir = fixture_dir(fixture), adapter = dir + "/adapter";
  HostAllocator host;
  CpuBackend backend(host);
  ModelOptions options = f32_options();
  const PeftAdapterConfig peft = read_peft_adapter_config(adapter);
  options.lora = peft.lora;
  const ModelConfig config = read_model_config(dir + "/config.json");
  T5Model model(config, backend, options);
  model.load(Checkpoint(dir));
  load_peft_adapter(adapter, model);
  const std::string folder = std::string(FT_BINARY_DIR) + "/test_t5/" + fixture + "_adapter";
  std::filesystem::remove_all(folder);
  save_peft_adapter(folder, model, peft);
  Checkpoint ours(folder + "/adapter_model.safetensors"), theirs(adapter + "/adapter_model.safetensors");
  REQUIRE(ours.names() == theirs.names());
  for (const std::string& name : theirs.names()) {
    CAPTURE(name);
    CHECK(same_bytes(ours.view(name), theirs.view(name)));
  }
  CHECK(read_peft_adapter_config(folder).task_type == "SEQ_2_SEQ_LM");

  T5Model reloaded(config, backend, options);
  reloaded.load(Checkpoint(dir));
  load_peft_adapter(folder, reloaded);
  Checkpoint reference(dir + "/lora_reference.safetensors");
  const Tensor input_ids = reference.view("input_ids"), labels = reference.view("labels");
  const Tensor decoder_ids = reference.view("decoder_input_ids");
  model.forward(input_ids, decoder_ids, labels);
  reloaded.forward(input_ids, decoder_ids, labels);
  CHECK(same_bytes(reloaded.last_logits(), model.last_logits()));
}

}  // namespace

TEST_CASE("t5 v1.0 (relu, tied embeddings scaled by d_model^-0.5) matches transformers: logits, loss, gradients") {
  check_against_transformers("t5_v1_0", true);
}

TEST_CASE("t5 v1.1 (gated-gelu, own lm_head, as FLAN-T5) matches transformers: logits, loss, gradients") {
  check_against_transformers("t5_v1_1", false);
}

TEST_CASE("t5 v1.0 with PEFT LoRA on q and v: logits, loss, gradients, one AdamW step") {
  check_lora_against_peft("t5_v1_0");
}

TEST_CASE("t5 v1.1 with PEFT LoRA on q and v: logits, loss, gradients, one AdamW step") {
  check_lora_against_peft("t5_v1_1");
}

TEST_CASE("t5 adapters save as PEFT's file under T5's key names and load back") {
  check_adapter_round_trip("t5_v1_0");
  check_adapter_round_trip("t5_v1_1");
}

TEST_CASE("t5 relative position buckets are transformers' (bidirectional and causal)") {
  const int64_t rel[] = {-300, -128, -127, -91, -64, -45, -33, -32, -16, -12, -9, -8, -7, -5, -4, -3, -1,
                         0,    1,    3,    4,   7,   8,   9,   12,  16,  32,  33, 45, 64, 91, 127, 128, 300};
  // transformers 5.23's T5Attention._relative_position_bucket on the same distances.
  struct Case {
    bool bidirectional;
    int64_t buckets, max_distance;
    std::vector<int32_t> want;
  };
  const Case cases[] = {
      {true, 32, 128, {15, 15, 15, 15, 14, 12, 12, 12, 10, 9, 8, 8, 7, 5, 4, 3, 1,
                       0, 17, 19, 20, 23, 24, 24, 25, 26, 28, 28, 28, 30, 31, 31, 31, 31}},
      {true, 10, 9, {4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 3, 3, 2, 1,
                     0, 6, 7, 8, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9}},
      {false, 32, 128, {31, 31, 31, 29, 26, 23, 21, 21, 16, 12, 9, 8, 7, 5, 4, 3, 1,
                        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
      {false, 10, 9, {9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 8, 7, 5, 4, 3, 1,
                      0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
  };
  for (const Case& c : cases)
    for (size_t i = 0; i < c.want.size(); ++i) {
      CAPTURE(c.bidirectional);
      CAPTURE(c.buckets);
      CAPTURE(rel[i]);
      CHECK(t5_relative_position_bucket(rel[i], c.bidirectional, c.buckets, c.max_distance) == c.want[i]);
    }
}

TEST_CASE("t5 config: T5's field names, both feed-forward forms, transformers 5's tie fields, clear refusals") {
  const std::string base = R"({"model_type": "t5", "d_model": 20, "d_ff": 28, "d_kv": 6, "num_layers": 3,
                               "num_heads": 3, "vocab_size": 97)";
  ModelConfig v10 = parse_model_config(base + "}", "v10");
  CHECK(v10.num_decoder_layers == 3);  // defaults to num_layers
  CHECK(v10.tie_word_embeddings);      // T5Config's default
  CHECK(!v10.gated_ffn);
  CHECK(v10.relative_attention_num_buckets == 32);
  CHECK(v10.relative_attention_max_distance == 128);
  CHECK(v10.decoder_start_token_id == 0);
  ModelConfig flan = parse_model_config(
      base + R"(, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": false, "num_decoder_layers": 2})", "flan");
  CHECK(flan.gated_ffn);
  CHECK(!flan.tie_word_embeddings);
  CHECK(flan.num_decoder_layers == 2);
  // transformers 5 writes tie_word_embeddings true for every T5 and says
  // with scale_decoder_outputs whether the head is v1.0's shared one.
  ModelConfig v5 = parse_model_config(
      base + R"(, "tie_word_embeddings": true, "scale_decoder_outputs": false})", "v5");
  CHECK(!v5.tie_word_embeddings);
  CHECK(!v5.scale_decoder_outputs);
  CHECK(v10.scale_decoder_outputs);
  CHECK_THROWS_WITH_AS(parse_model_config(base + R"(, "feed_forward_proj": "gated-silu"})", "cfg"),
                       doctest::Contains("feed_forward_proj \"gated-silu\" is not supported for t5"), Error);
  CHECK_THROWS_WITH_AS(parse_model_config(R"({"model_type": "t5", "d_model": 20})", "cfg"),
                       doctest::Contains("missing required field \"d_ff\""), Error);
  HostAllocator host;
  CpuBackend backend(host);
  CHECK_THROWS_WITH_AS(make_causal_lm(v10, backend, {}), doctest::Contains("encoder-decoder"), Error);
  ModelOptions checkpointed = f32_options();
  checkpointed.activation_checkpointing = ActivationCheckpointing::per_layer;
  CHECK_THROWS_WITH_AS(T5Model(v10, backend, checkpointed), doctest::Contains("activation checkpointing"), Error);
}

TEST_CASE("a v1.1 T5 that transformers 5 saved tied (no lm_head.weight, unscaled) runs as its untied twin") {
  // t5_v1_1 twice: as released (own lm_head.weight, here a copy of shared) and as transformers 5 writes
  // a v1.1 built from its config (tie_word_embeddings true, scale_decoder_outputs false, no lm_head.weight).
  const std::string dir = fixture_dir("t5_v1_1");
  const Checkpoint source(dir);
  const auto write_twin = [&](const std::string& name, bool tied) {
    const std::filesystem::path folder = std::filesystem::temp_directory_path() / ("test_t5_" + name);
    std::filesystem::remove_all(folder);
    std::filesystem::create_directories(folder);
    nlohmann::json config = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
    config["tie_word_embeddings"] = tied;
    if (tied) config["scale_decoder_outputs"] = false;
    std::ofstream(folder / "config.json") << config.dump();
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const std::string& tensor : source.names())
      if (tensor != "lm_head.weight") tensors.emplace_back(tensor, source.view(tensor));
    if (!tied) tensors.emplace_back("lm_head.weight", source.view("shared.weight"));
    save_safetensors((folder / "model.safetensors").string(), tensors);
    return folder.string();
  };
  const std::string untied = write_twin("untied", false), tied = write_twin("tied", true);
  const ModelConfig tied_config = read_model_config(tied + "/config.json");
  CHECK((tied_config.tie_word_embeddings && !tied_config.scale_decoder_outputs));
  Checkpoint reference(dir + "/reference.safetensors");
  HostAllocator host;
  CpuBackend backend(host);
  const Tensor input_ids = reference.view("input_ids"), labels = reference.view("labels");
  std::vector<float> losses;
  for (const std::string& folder : {untied, tied}) {
    const ModelConfig config = read_model_config(folder + "/config.json");
    T5Model model(config, backend, f32_options());
    model.load(Checkpoint(folder));
    const Tensor decoder_ids = t5_decoder_inputs(labels, config.decoder_start_token_id, 0, host);
    losses.push_back(model.forward(input_ids, decoder_ids, labels));
  }
  CHECK(losses[0] == losses[1]);
  std::filesystem::remove_all(untied);
  std::filesystem::remove_all(tied);
}

namespace {

// A quantised base: every linear quantised but the feed-forward output wo
// (as transformers + bitsandbytes quantise a T5), the bias tables, norms and
// embeddings not. Returns the loss and the cosine between the LoRA gradients
// (all adapters together) and the f32 model's.
std::pair<float, double> quantized_base_step(bool nf4) {
  const std::string dir = fixture_dir("t5_v1_1");
  const ModelConfig config = read_model_config(dir + "/config.json");
  Checkpoint reference(dir + "/lora_reference.safetensors");
  const Tensor input_ids = reference.view("input_ids"), labels = reference.view("labels");
  const Tensor decoder_ids = reference.view("decoder_input_ids");
  HostAllocator host;
  CpuBackend backend(host);
  ModelOptions options = f32_options();
  options.quantized_base = nf4 ? QuantizedBase::nf4 : QuantizedBase::int8;
  options.lora = read_peft_adapter_config(dir + "/adapter").lora;
  T5Model model(config, backend, options);
  model.load(Checkpoint(dir));
  load_peft_adapter(dir + "/adapter", model);
  int64_t quantized = 0;
  for (Parameter& p : model.parameters()) {
    const bool linear = p.name.find("relative_attention_bias") == std::string::npos && p.name != "shared.weight" &&
                        p.name != "lm_head.weight" && p.name.find("layer_norm") == std::string::npos &&
                        !p.name.ends_with(".wo.weight");
    CAPTURE(p.name);
    CHECK((p.value.dtype == (nf4 ? DType::u8 : DType::i8)) == linear);
    quantized += linear;
  }
  // Encoder: 3 x (q, k, v, o, wi_0, wi_1); decoder: 2 x (those and EncDecAttention's q, k, v, o).
  CHECK(quantized == 3 * 6 + 2 * 10);
  const float loss = model.forward(input_ids, decoder_ids, labels);
  model.set_trainable([](const std::string& name) { return name.find("lora_") != std::string::npos; });
  CHECK(model.forward_backward(input_ids, decoder_ids, labels) == doctest::Approx(loss).epsilon(1e-6));
  double dot = 0.0, ours = 0.0, theirs = 0.0;
  for (Parameter& p : model.adapters()) {
    const Tensor want_grad = reference.view("grad." + kKeyPrefix + p.name);
    for (int64_t i = 0; i < p.grad.numel(); ++i) {
      const double g = p.grad.ptr<float>()[i], w = want_grad.ptr<float>()[i];
      dot += g * w, ours += g * g, theirs += w * w;
    }
  }
  const double cosine = dot / std::sqrt(ours * theirs);
  MESSAGE(std::string(nf4 ? "nf4" : "int8"), " base: loss ", loss, ", LoRA gradients' cosine with the f32 model's ",
          cosine);
  return {loss, cosine};
}

}  // namespace

TEST_CASE("t5 over an INT8 base: linears int8, loss and LoRA gradients near the f32 model's") {
  // The int8 rounding of a 20-wide model moves single gradients by up to
  // ~30%; their direction, all adapters together, stays the f32 model's.
  const auto [loss, cosine] = quantized_base_step(false);
  CHECK(std::abs(loss - 4.9192f) <= 0.02f * 4.9192f);  // the f32 model's loss
  CHECK(cosine >= 0.95);
}

TEST_CASE("t5 over an NF4 base: as transformers with bitsandbytes' dequantised weights") {
  // 4-bit rounding moves this small, sharp model far: transformers with each
  // linear but wo replaced by bitsandbytes' dequantize_4bit(quantize_4bit(W,
  // nf4, blocksize 64, double quantisation)) and the same adapter
  // (tests/fixtures/t5_v1_1/nf4_reference.json,
  // scripts/make_t5_quantized_reference.py) gives loss 5.1657 (f32 model:
  // 4.9192) and LoRA gradients whose cosine with the f32 model's is -0.4105
  // (with wo quantised too: 5.2366 and -0.3202). We match both (our
  // double-quantised absmax can pick a neighbouring code where bitsandbytes'
  // CPU search does not, test_nf4.cpp).
  std::ifstream file(fixture_dir("t5_v1_1") + "/nf4_reference.json");
  const nlohmann::json reference = nlohmann::json::parse(file);
  const float want_loss = reference["loss"];
  const double want_cosine = reference["lora_gradient_cosine_with_f32"];
  const auto [loss, cosine] = quantized_base_step(true);
  CHECK(std::abs(loss - want_loss) <= 0.005f * want_loss);
  CHECK(std::abs(cosine - want_cosine) <= 0.02);
}

namespace {

// A fixture's model in f32 on the CPU, its weights loaded, and its reference.safetensors.
struct LoadedT5 {
  HostAllocator host;
  CpuBackend backend{host};
  T5Model model;
  Checkpoint reference;
  explicit LoadedT5(const std::string& fixture)
      : model(read_model_config(fixture_dir(fixture) + "/config.json"), backend, f32_options()),
        reference(fixture_dir(fixture) + "/reference.safetensors") {
    model.load(Checkpoint(fixture_dir(fixture)));
  }
};

// The rows of host i32 [B, S] input ids.
std::vector<std::vector<int32_t>> input_rows(const Tensor& input_ids) {
  const int64_t S = input_ids.dim(1);
  std::vector<std::vector<int32_t>> rows;
  for (int64_t b = 0; b < input_ids.dim(0); ++b)
    rows.emplace_back(input_ids.ptr<int32_t>() + b * S, input_ids.ptr<int32_t>() + (b + 1) * S);
  return rows;
}

}  // namespace

TEST_CASE("t5 greedy generation equals transformers' generate(); encode/decode split equals forward") {
  for (const std::string fixture : {"t5_v1_0", "t5_v1_1"}) {
    CAPTURE(fixture);
    LoadedT5 loaded(fixture);
    T5Model& model = loaded.model;
    const Checkpoint& reference = loaded.reference;

    const Tensor input_ids = reference.view("input_ids"), want = reference.view("generated");
    const int64_t steps = want.dim(1);
    const std::vector<std::vector<int32_t>> inputs = input_rows(input_ids);
    SamplingOptions greedy;
    greedy.max_new_tokens = steps;
    const std::vector<std::vector<int32_t>> got = generate_seq2seq(model, inputs, greedy, {{1}, {}, nullptr});
    SamplingOptions uncached = greedy;
    uncached.kv_cache = false;
    const std::vector<std::vector<int32_t>> got_uncached = generate_seq2seq(model, inputs, uncached, {{1}, {}, nullptr});
    for (size_t b = 0; b < inputs.size(); ++b) {
      const int32_t* row = want.ptr<int32_t>() + int64_t(b) * steps;
      std::vector<int32_t> want_row(row, row + steps);
      want_row.erase(std::find(want_row.begin(), want_row.end(), -1), want_row.end());
      CHECK(got[b] == want_row);
      CHECK(got_uncached[b] == want_row);
    }
    // A stop id ends a row before it: the first greedy token of row 0 as the stop.
    CHECK(generate_seq2seq(model, {inputs[0]}, greedy, {{got[0][0]}, {}, nullptr})[0].empty());

    const Tensor labels = reference.view("labels"), decoder_ids = reference.view("decoder_input_ids");
    const float loss = model.forward(input_ids, decoder_ids, labels);
    const Tensor logits = model.last_logits();
    model.encode(input_ids);
    CHECK(model.decode(decoder_ids, labels) == loss);
    CHECK(same_bytes(model.last_logits(), logits));
  }
}

TEST_CASE("t5 generation with the decoder key/value cache equals the uncached decoder, token for token") {
  for (const std::string fixture : {"t5_v1_0", "t5_v1_1"}) {
    CAPTURE(fixture);
    LoadedT5 loaded(fixture);
    T5Model& model = loaded.model;
    const Checkpoint& reference = loaded.reference;
    HostAllocator& host = loaded.host;
    const Tensor input_ids = reference.view("input_ids");
    std::vector<std::vector<int32_t>> inputs = input_rows(input_ids);
    inputs.push_back({5, 17, 3});  // a shorter input too
    // No stop id: 40 tokens each, past the decoder's logarithmic buckets and their cap (max distance 9).
    SamplingOptions greedy, sampled;
    greedy.max_new_tokens = sampled.max_new_tokens = 40;
    sampled.temperature = 1.3;
    sampled.top_p = 0.95;
    sampled.seed = 7;
    for (const SamplingOptions& options : {greedy, sampled}) {
      CAPTURE(options.temperature);
      SamplingOptions uncached = options;
      uncached.kv_cache = false;
      const std::vector<std::vector<int32_t>> cached_tokens = generate_seq2seq(model, inputs, options, {});
      CHECK(cached_tokens == generate_seq2seq(model, inputs, uncached, {}));
      for (const std::vector<int32_t>& row : cached_tokens) CHECK(row.size() == 40);
    }
    // One cached step's logits are the uncached decoder's last row.
    model.encode(input_ids.slice_rows(0, 1));
    T5DecoderCache cache = model.make_decoder_cache(3);
    const std::vector<int32_t> decoder_ids = {0, 11, 42};
    for (int32_t token : decoder_ids) model.decode_cached(cache, token);
    const Tensor cached_logits = model.last_logits();
    Tensor ids = Tensor::empty({1, 3}, DType::i32, host, MemCategory::activations);
    Tensor ignored = Tensor::empty({1, 3}, DType::i32, host, MemCategory::activations);
    for (int t = 0; t < 3; ++t) ids.ptr<int32_t>()[t] = decoder_ids[size_t(t)], ignored.ptr<int32_t>()[t] = -100;
    model.decode(ids, ignored);
    const Tensor last = model.last_logits().slice_rows(2, 1);
    // The same sums, from a one-row product against a three-row one: the
    // order of their f32 additions follows the build's vectorisation.
    CHECK(relative_error(cached_logits, last) <= 4e-6);
    CHECK_THROWS_WITH_AS(model.decode_cached(cache, 1), doctest::Contains("past the cache's 3 positions"), Error);
  }
}

TEST_CASE("t5 on the meta backend (the memory planner) allocates exactly what the CPU step allocates") {
  const std::string dir = fixture_dir("t5_v1_1");
  const ModelConfig config = read_model_config(dir + "/config.json");
  Checkpoint reference(dir + "/lora_reference.safetensors");
  ModelOptions options = f32_options();
  options.lora = read_peft_adapter_config(dir + "/adapter").lora;
  auto step_peaks = [&](Backend& backend, TrackingAllocator& tracker) {
    T5Model model(config, backend, options);
    model.set_trainable([](const std::string& name) { return name.find("lora_") != std::string::npos; });
    tracker.reset_peaks();
    model.forward_backward(reference.view("input_ids"), reference.view("decoder_input_ids"),
                           reference.view("labels"));
    return std::vector<size_t>{tracker.stats().peak(MemCategory::activations), tracker.stats().total_peak_bytes,
                               tracker.stats().current(MemCategory::weights)};
  };
  HostAllocator host;
  TrackingAllocator cpu_tracker(host);
  CpuBackend cpu(cpu_tracker);
  MetaAllocator meta;
  TrackingAllocator meta_tracker(meta);
  MetaBackend planner(meta_tracker, MemoryPolicy::cpu);
  const std::vector<size_t> on_cpu = step_peaks(cpu, cpu_tracker), planned = step_peaks(planner, meta_tracker);
  MESSAGE("t5 step: peak activations ", on_cpu[0], " bytes, peak total ", on_cpu[1], " bytes");
  CHECK(on_cpu[0] > 0);
  CHECK(planned == on_cpu);
}

namespace {

// Host i32 [rows, width]: each row's ids, then `fill` to the width.
Tensor padded_rows(const std::vector<std::vector<int32_t>>& rows, int64_t width, int32_t fill, HostAllocator& host) {
  Tensor t = Tensor::empty({int64_t(rows.size()), width}, DType::i32, host, MemCategory::activations);
  for (size_t b = 0; b < rows.size(); ++b)
    for (int64_t t_pos = 0; t_pos < width; ++t_pos)
      t.ptr<int32_t>()[int64_t(b) * width + t_pos] = t_pos < int64_t(rows[b].size()) ? rows[b][size_t(t_pos)] : fill;
  return t;
}

}  // namespace

TEST_CASE("t5 padded batch: encoder padding masked, loss and every gradient as each row run alone") {
  const std::string dir = fixture_dir("t5_v1_1");
  const ModelConfig config = read_model_config(dir + "/config.json");
  HostAllocator host;
  CpuBackend backend(host);
  ModelOptions options = f32_options();
  options.lora = read_peft_adapter_config(dir + "/adapter").lora;
  options.lora->lora_dropout = 0.0;  // dropout masks depend on the batch layout
  T5Model model(config, backend, options);
  model.load(Checkpoint(dir));
  model.init_adapters(3);
  // B nonzero, so the adapters' A gradients are too, and every parameter trains.
  for (Parameter& p : model.adapters())
    if (p.name.find("lora_B") != std::string::npos) backend.fill(p.value, 0.05f);
  model.set_trainable([](const std::string&) { return true; });
  const std::vector<std::vector<int32_t>> inputs = {{5, 9, 14, 3, 1}, {7, 1}, {22, 4, 8, 1}};
  const std::vector<std::vector<int32_t>> labels = {{4, 6, 1}, {11, 2, 9, 1}, {1}};
  const int64_t S = 5, T = 4;
  const int64_t counted = 3 + 4 + 1;

  auto all_grads = [&] {
    std::vector<std::vector<float>> grads;
    for (std::deque<Parameter>* list : {&model.parameters(), &model.adapters()})
      for (Parameter& p : *list) grads.push_back(ft::testing::read(p.grad));
    return grads;
  };
  // Each row alone, its gradient weighted by its share of the counted tokens.
  model.zero_grads();
  double want_loss = 0.0;
  for (size_t b = 0; b < inputs.size(); ++b) {
    const Tensor row_labels = padded_rows({labels[b]}, int64_t(labels[b].size()), -100, host);
    const float share = float(labels[b].size()) / float(counted);
    want_loss += share * model.forward_backward(padded_rows({inputs[b]}, int64_t(inputs[b].size()), 0, host),
                                                t5_decoder_inputs(row_labels, config.decoder_start_token_id, 0, host),
                                                row_labels, share);
  }
  const std::vector<std::vector<float>> want = all_grads();

  model.zero_grads();
  const Tensor batch_labels = padded_rows(labels, T, -100, host);
  const Tensor decoder_ids = t5_decoder_inputs(batch_labels, config.decoder_start_token_id, 0, host);
  const Tensor encoder_ids = padded_rows(inputs, S, 0, host);
  const float loss = model.forward_backward(encoder_ids, decoder_ids, batch_labels, 1.0f, {5, 2, 4});
  CHECK(loss == doctest::Approx(want_loss).epsilon(1e-5));
  const std::vector<std::vector<float>> got = all_grads();
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    double max_diff = 0.0, max_want = 0.0;
    for (size_t n = 0; n < got[i].size(); ++n) {
      max_diff = std::max(max_diff, double(std::abs(got[i][n] - want[i][n])));
      max_want = std::max(max_want, double(std::abs(want[i][n])));
    }
    CHECK(max_want > 0.0);
    worst = std::max(worst, max_diff / max_want);
  }
  MESSAGE("padded batch: worst gradient relative error ", worst, " over ", got.size(), " tensors");
  CHECK(worst <= 1e-5);
  // Without the mask the padding leaks into the short rows: a different loss.
  model.zero_grads();
  const float unmasked = model.forward(encoder_ids, decoder_ids, batch_labels);
  CHECK(std::abs(unmasked - loss) > 1e-3f);
  // The eval forward takes the same mask.
  CHECK(model.forward(encoder_ids, decoder_ids, batch_labels, {5, 2, 4}) == doctest::Approx(loss).epsilon(1e-6));
}
