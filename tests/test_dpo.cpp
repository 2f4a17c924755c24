// DPO against trl's loss (tests/fixtures/dpo, scripts/make_dpo_fixture.py:
// trl 1.16.0's DPOTrainer loss re-implemented in torch over PEFT's model,
// the reference taken under disable_adapter()): the llama_gqa base with the
// llama_lora adapter gives the fixture's loss, trl's reward and log-prob
// figures and every LoRA gradient, for the sigmoid and the IPO loss, with the
// LM head unchunked and chunked across rows; the adapters are on again
// afterwards; preference rows that are not {prompt, chosen, rejected} are
// refused naming the line and the field.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <tuple>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/error.h"
#include "model/families.h"
#include "model/llama.h"
#include "model/peft_adapter.h"
#include "model/safetensors.h"
#include "tests/parity.h"
#include "trainer/data/preference_data.h"
#include "trainer/dpo.h"

using namespace ft;
using ft::parity::relative_error;
using ft::parity::shifted_targets;

namespace {

const std::string kFixtures = FT_FIXTURES_DIR;
const std::string kAdapterFolder = kFixtures + "/llama_lora/adapter";

// As test_peft: f32 against f32 PyTorch, whose own f32 vs f64 gap is ~1e-6
// on these gradients (the fixture script prints it).
constexpr double kTolerance = 1e-4;

std::unique_ptr<LlamaModel> make_policy(Backend& backend, int64_t loss_chunk_tokens) {
  ModelOptions options;
  options.weight_dtype = DType::f32;
  options.quantized_base = QuantizedBase::none;
  options.loss_chunk_tokens = loss_chunk_tokens;
  options.lora = read_peft_adapter_config(kAdapterFolder).lora;
  auto model = std::make_unique<LlamaModel>(read_model_config(kFixtures + "/llama_gqa/config.json"),
                                            backend, options);
  model->load(Checkpoint(kFixtures + "/llama_gqa"));
  load_peft_adapter(kAdapterFolder, *model);
  model->set_trainable([](const std::string& name) { return name.find("lora_") != std::string::npos; });
  return model;
}

float scalar(const Checkpoint& reference, const std::string& name) { return reference.view(name).ptr<float>()[0]; }

void check_against_trl(int64_t loss_chunk_tokens, DpoLoss loss_type, const char* prefix) {
  Checkpoint reference(kFixtures + "/dpo/reference.safetensors");
  HostAllocator host;
  CpuBackend backend(host);
  std::unique_ptr<LlamaModel> model = make_policy(backend, loss_chunk_tokens);
  Batch batch{reference.view("input_ids"), shifted_targets(reference.view("labels"), host), 0};
  const int64_t pairs = batch.input_ids.dim(0) / 2;
  DpoConfig config{scalar(reference, std::string(prefix) + ".beta"), loss_type};

  const float logits_before = model->forward(batch.input_ids, batch.targets);
  DpoFigures figures = dpo_micro_batch(*model, batch, config, true, 1.0 / double(pairs));
  CHECK(figures.pairs == pairs);
  const nlohmann::json means = figures.means();
  for (const char* name : {"loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies",
                           "logps/chosen", "logps/rejected"}) {
    CAPTURE(name);
    const double want = scalar(reference, std::string(prefix) + "." + name), got = means[name].get<double>();
    MESSAGE(std::string(prefix), " ", std::string(name), ": ours ", got, ", trl's ", want);
    CHECK(std::abs(got - want) <= kTolerance * std::max(std::abs(want), 1.0));
  }
  for (Parameter& adapter : model->adapters()) {
    CAPTURE(adapter.name);
    const double error =
        relative_error(adapter.grad, reference.view(std::string(prefix) + ".grad.base_model.model." + adapter.name));
    MESSAGE(std::string(prefix), " gradient relative error ", error, " ", adapter.name);
    CHECK(error <= kTolerance);
  }
  // The reference forward turned the adapters off only while it ran.
  CHECK(model->forward(batch.input_ids, batch.targets) == logits_before);
}

std::string preference_error(const std::string& name, const std::string& content, bool read_margins = false) {
  const std::filesystem::path dir = std::filesystem::path(FT_BINARY_DIR) / "test_dpo_tmp";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path) << content;
  try {
    load_preference_jsonl(path, read_margins);
  } catch (const Error& e) {
    const std::string message = e.what();
    return message.starts_with(path) ? name + message.substr(path.size()) : message;
  }
  return "";
}

}  // namespace

TEST_CASE("DPO sigmoid loss, trl's figures and LoRA gradients match trl's loss over PEFT") {
  check_against_trl(0, DpoLoss::sigmoid, "sigmoid");
}

TEST_CASE("DPO IPO loss (length-averaged log-ratios) matches trl's") { check_against_trl(0, DpoLoss::ipo, "ipo"); }

TEST_CASE("DPO with the LM head in chunks that cut across rows gives the same loss and gradients") {
  check_against_trl(5, DpoLoss::sigmoid, "sigmoid");
  check_against_trl(7, DpoLoss::ipo, "ipo");
}

TEST_CASE("preference rows must be {prompt, chosen, rejected} strings or lists of messages") {
  const std::string good = R"({"prompt": "a", "chosen": "b", "rejected": "c"})";
  CHECK(preference_error("ok.jsonl", good + "\n\n" + good + "\n") == "");
  const std::string expected = "\"chosen\" and \"rejected\" strings or lists of messages, and the \"prompt\" they "
                               "follow (preference pairs: objective: dpo and reward read them)";
  CHECK(preference_error("sft.jsonl", good + "\n" + R"({"prompt": "a", "completion": "b"})" + "\n") ==
        "sft.jsonl:2: row lacks \"chosen\": expected " + expected + ", got keys \"completion\", \"prompt\"");
  CHECK(preference_error("number.jsonl", R"({"prompt": "a", "chosen": "b", "rejected": 3})") ==
        "number.jsonl:1: \"rejected\" must be a string, got number");
  CHECK(preference_error("list.jsonl", "7") == "list.jsonl:1: expected a JSON object with " + expected + ", got number");
  CHECK(preference_error("empty.jsonl", "\n") == "empty.jsonl: no rows (expected JSON rows with " + expected + ")");
  // No prompt: trl's extract_prompt (tests/fixtures/trl_tokenization.json holds its results), which needs text on both sides.
  CHECK(preference_error("implicit.jsonl", R"({"chosen": "Q: yes", "rejected": "Q: no"})") == "");
  CHECK(preference_error("blank.jsonl", R"({"chosen": "", "rejected": "no"})") ==
        "blank.jsonl:1: the row has no \"prompt\", so it is the text \"chosen\" and \"rejected\" share (trl's "
        "extract_prompt), which needs both non-empty");
  // trl's RewardTrainer "margin": a finite number on every row or on none (objective: dpo ignores it).
  const std::string margin = R"({"prompt": "a", "chosen": "b", "rejected": "c", "margin": 0.5})";
  CHECK(preference_error("margins.jsonl", margin + "\n" + margin + "\n", true) == "");
  CHECK(preference_error("some.jsonl", good + "\n" + margin + "\n", true) ==
        "some.jsonl:1: no \"margin\", which line 2 gives: trl's RewardTrainer needs the column on every row or on "
        "none");
  CHECK(preference_error("some.jsonl", good + "\n" + margin + "\n") == "");
  CHECK(preference_error("text.jsonl", R"({"prompt": "a", "chosen": "b", "rejected": "c", "margin": "1"})", true) ==
        "text.jsonl:1: \"margin\" must be a finite number (trl's RewardTrainer subtracts it from the pair's score "
        "difference), got \"1\"");
  // A conversational pair (trl's): both sides lists of messages, each conversation a training row.
  CHECK(preference_error("mixed.jsonl", R"({"prompt": [{"role": "user", "content": "a"}], "chosen": "b", "rejected": "c"})") ==
        "mixed.jsonl:1: \"chosen\" must be a non-empty list of messages in a conversational pair (trl's), got \"b\"");
  CHECK(preference_error("roles.jsonl", R"({"prompt": [{"role": "user", "content": "a"}], )"
                                        R"("chosen": [{"role": "user", "content": "b"}], "rejected": [{"role": "assistant", "content": "c"}]})") ==
        "roles.jsonl:1 (chosen): the last message is the user's (expected an assistant turn to train on)");
  std::filesystem::remove_all(std::filesystem::path(FT_BINARY_DIR) / "test_dpo_tmp");
}

TEST_CASE("each batch of pairs carries its pairs' margins, in the shuffled order and in file order") {
  HostAllocator host;
  TokenizedPairs pairs;
  for (int32_t i = 0; i < 7; ++i) {  // pair i: the token 10 + i on both sides, margin i / 4
    pairs.chosen.push_back({{1, 10 + i, 2}, {0, 1, 1}});
    pairs.rejected.push_back({{1, 10 + i, 3}, {0, 1, 1}});
    pairs.margins.push_back(double(i) / 4);
  }
  PreferenceLoader loader(pairs, 3, 4, 0, 99, host);
  const auto check_batch = [](const Batch& batch) {
    REQUIRE(batch.margins.size() == 3);
    for (int64_t b = 0; b < 3; ++b) {
      const int32_t token = batch.input_ids.ptr<int32_t>()[b * batch.input_ids.dim(1) + 1];
      CHECK(batch.margins[size_t(b)] == (token == 0 ? 0.0 : double(token - 10) / 4));  // 0: an epoch's padding
    }
  };
  for (int64_t i = 0; i < 2 * loader.batches_per_epoch(); ++i) check_batch(loader.next());
  for (int64_t i = 0; i < loader.batches_per_epoch(); ++i) check_batch(loader.batch_in_order(i));
  pairs.margins.clear();
  CHECK(PreferenceLoader(pairs, 3, 4, 0, 99, host).next().margins.empty());
}

// Padding-free packed pairs (packed_pairs: several pairs per row, chosen and
// rejected in rows of one index) give the figures and LoRA gradients of the
// same pairs one per row, with the LM head whole and in chunks that cut
// across the packed completions.
TEST_CASE("DPO over packed pairs equals DPO over one pair a row") {
  std::mt19937 rng(9);
  std::uniform_int_distribution<int32_t> token(4, 300);
  auto completion = [&](int64_t prompt, int64_t length) {
    TokenSequence sequence;
    for (int64_t t = 0; t < length; ++t) {
      sequence.tokens.push_back(token(rng));
      sequence.loss_mask.push_back(t >= prompt ? 1 : 0);
    }
    return sequence;
  };
  TokenizedPairs pairs;
  for (auto [prompt, chosen, rejected] : {std::tuple{3, 9, 6}, {2, 4, 7}, {4, 12, 13}, {1, 3, 5}, {3, 8, 4}}) {
    pairs.chosen.push_back(completion(prompt, chosen));
    pairs.rejected.push_back(completion(prompt, rejected));
  }
  const int64_t seq_len = 16;
  HostAllocator host;
  const Batch padded = PreferenceLoader(pairs, 5, seq_len, 3, 1, host).batch_in_order(0);
  const TokenizedPairs packed_rows = packed_pairs(pairs, seq_len);
  CHECK(packed_rows.chosen.size() < pairs.chosen.size());
  const Batch packed = PreferenceLoader(packed_rows, int64_t(packed_rows.chosen.size()), seq_len, 3, 1, host)
                           .batch_in_order(0);
  CHECK(count_pairs(padded) == 5);
  CHECK(count_pairs(packed) == 5);
  for (int64_t chunk : {0, 5}) {
    CAPTURE(chunk);
    CpuBackend backend(host);
    const DpoConfig config{0.1, DpoLoss::sigmoid};
    std::unique_ptr<LlamaModel> want_model = make_policy(backend, chunk), got_model = make_policy(backend, chunk);
    const DpoFigures want = dpo_micro_batch(*want_model, padded, config, true, 0.2);
    const DpoFigures got = dpo_micro_batch(*got_model, packed, config, true, 0.2);
    CHECK(got.pairs == 5);
    const nlohmann::json want_means = want.means(), got_means = got.means();
    for (const auto& [name, value] : want_means.items()) {
      CAPTURE(name);
      CHECK(std::abs(got_means.at(name).get<double>() - value.get<double>()) <=
            1e-6 * std::max(std::abs(value.get<double>()), 1.0));
    }
    for (size_t i = 0; i < want_model->adapters().size(); ++i)
      CHECK(relative_error(got_model->adapters()[i].grad, want_model->adapters()[i].grad) <= 1e-6);
  }
}
