// PEFT's per-module rank and alpha (LoraConfig's rank_pattern and
// alpha_pattern) against PEFT: tests/fixtures/rank_pattern
// (scripts/make_rank_pattern_fixture.py) adapts every linear of llama_gqa at
// r 4, alpha 8, with patterns giving q_proj r 8, layer 1's down_proj r 2,
// layer 0's gate_proj and up_proj r 6 (a regular expression), v_proj alpha 32
// and o_proj alpha 4. A model built from that adapter config has PEFT's
// shapes, logits, loss and gradients; it saves PEFT's config and keys; the
// merge gives merge_and_unload()'s weights; a run config with the patterns
// trains and plans to the byte; bad patterns are refused naming the field.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/error.h"
#include "model/families.h"
#include "model/lora_pattern.h"
#include "model/peft_adapter.h"
#include "model/safetensors.h"
#include "tests/host_tensors.h"
#include "tests/parity.h"
#include "trainer/optimizer.h"
#include "trainer/setup.h"
#include "trainer/train_config.h"

using namespace ft;
using ft::parity::read_json;
using ft::parity::shifted_targets;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kFixtures = FT_FIXTURES_DIR;
const std::string kBase = kFixtures + "/llama_gqa";
const std::string kFolder = kFixtures + "/rank_pattern";
const std::string kAdapter = kFolder + "/adapter";
const std::string kKeyPrefix = "base_model.model.";

// f32 against f32 PyTorch: the fixture's own f32 vs f64 check gives ~5e-7
// for logits and ~1.2e-6 for gradients (as test_peft's LoRA).
constexpr double kTolerance = 1e-4;

std::map<std::string, Shape> shapes_of(LanguageModel& model) {
  std::map<std::string, Shape> shapes;
  for (const Parameter& adapter : model.adapters()) shapes[kKeyPrefix + adapter.name] = adapter.value.shape;
  return shapes;
}

LoraOptions options_with(std::vector<std::pair<std::string, int64_t>> ranks,
                         std::vector<std::pair<std::string, double>> alphas = {}) {
  LoraOptions lora;
  lora.r = 4;
  lora.lora_alpha = 8;
  lora.rank_pattern = std::move(ranks);
  lora.alpha_pattern = std::move(alphas);
  return lora;
}

}  // namespace

TEST_CASE("a pattern key matches as PEFT's re.match(rf\"(.*\\.)?({key})$\", module)") {
  const std::string q0 = "model.layers.0.self_attn.q_proj";
  // Each expectation is Python's (peft.utils.other.get_pattern_key's match).
  const std::vector<std::tuple<std::string, std::string, bool>> cases = {
      {"q_proj", q0, true},
      {"proj", q0, false},  // a whole name after a dot, not a suffix
      {"_proj", q0, false},
      {"k_proj", q0, false},
      {"layers.0.self_attn.q_proj", q0, true},
      {"layers.1.self_attn.q_proj", q0, false},
      {"model.layers.0.self_attn.q_proj", q0, true},
      {"^model.layers.0.self_attn.q_proj", q0, true},
      {"^layers.0.self_attn.q_proj", q0, false},
      {"self_attn", q0, false},  // it must end the name
      {"layers.1.mlp.down_proj", "model.layers.11.mlp.down_proj", false},
      {"layers\\.\\d+\\.mlp\\.(gate|up)_proj", "model.layers.12.mlp.up_proj", true},
      {"q_proj|v_proj", "model.layers.0.self_attn.v_proj", true},
      {".*attn.*", "model.layers.0.self_attn.k_proj", true},
  };
  for (const auto& [key, module, matches] : cases) {
    CAPTURE(key);
    CAPTURE(module);
    CHECK(module_pattern_matches(key, module, "test") == matches);
  }
  CHECK_THROWS_WITH_AS(module_pattern_matches("q_proj(", q0, "x.yaml:3: lora.rank_pattern"),
                       doctest::Contains("x.yaml:3: lora.rank_pattern \"q_proj(\": not a valid regular expression"),
                       Error);
}

TEST_CASE("module_lora: the first matching key wins, rank and alpha apart; scaling alpha / r or / sqrt(r)") {
  const std::string down0 = "model.layers.0.mlp.down_proj", down1 = "model.layers.1.mlp.down_proj";
  const LoraOptions specific_first = options_with({{"layers.1.mlp.down_proj", 2}, {"down_proj", 6}});
  CHECK(module_lora(specific_first, down1).r == 2);
  CHECK(module_lora(specific_first, down0).r == 6);
  const LoraOptions general_first = options_with({{"down_proj", 6}, {"layers.1.mlp.down_proj", 2}});
  CHECK(module_lora(general_first, down1).r == 6);
  CHECK(module_lora(general_first, "model.layers.0.self_attn.q_proj").r == 4);  // no key: lora.r

  LoraOptions lora = options_with({{"q_proj", 16}}, {{"v_proj", 32}, {"q_proj", 2}});
  const ModuleLora q = module_lora(lora, "model.layers.0.self_attn.q_proj");
  CHECK(q.r == 16);
  CHECK(q.lora_alpha == 2.0);
  CHECK(q.scaling == 2.0f / 16.0f);
  const ModuleLora v = module_lora(lora, "model.layers.0.self_attn.v_proj");
  CHECK(v.r == 4);
  CHECK(v.scaling == 8.0f);
  lora.use_rslora = true;
  CHECK(module_lora(lora, "model.layers.0.self_attn.q_proj").scaling == float(2.0 / std::sqrt(16.0)));
}

TEST_CASE("rank_pattern and alpha_pattern on llama match PEFT: shapes, logits, loss, gradients") {
  const Checkpoint reference(kFolder + "/reference.safetensors");
  HostAllocator host;
  CpuBackend backend(host);
  const PeftAdapterConfig config = read_peft_adapter_config(kAdapter);
  // The file's order (PEFT's save sorts the keys).
  using Ranks = std::vector<std::pair<std::string, int64_t>>;
  CHECK(config.lora.rank_pattern ==
        Ranks{{"layers.1.mlp.down_proj", 2}, {"layers\\.0\\.mlp\\.(gate|up)_proj", 6}, {"q_proj", 8}});
  CHECK(config.lora.alpha_pattern == std::vector<std::pair<std::string, double>>{{"o_proj", 4}, {"v_proj", 32}});

  auto model = parity::adapter_model(backend, kBase, kAdapter);
  CHECK(shapes_of(*model) == parity::adapter_file_shapes(kAdapter));
  load_peft_adapter(kAdapter, *model);
  const Tensor input_ids = reference.view("input_ids");
  const Tensor targets = shifted_targets(reference.view("labels"), host);
  parity::check_reference_forward(*model, reference, input_ids, targets, kTolerance);

  model->set_trainable([](const std::string& name) { return name.find(".lora_") != std::string::npos; });
  model->forward_backward(input_ids, targets);
  CHECK(parity::check_adapter_gradients(*model, reference, kKeyPrefix, kTolerance).size() == 28);
}

TEST_CASE("an adapter with patterns saves PEFT's config and keys and loads back to the same logits") {
  const Checkpoint reference(kFolder + "/reference.safetensors");
  HostAllocator host;
  CpuBackend backend(host);
  auto model = parity::adapter_model(backend, kBase, kAdapter);
  load_peft_adapter(kAdapter, *model);
  const Tensor input_ids = reference.view("input_ids");
  const Tensor targets = shifted_targets(reference.view("labels"), host);
  model->forward(input_ids, targets);

  const std::string folder = parity::check_save_and_reload(
      *model, kAdapter, [&](const std::string& saved) { return parity::adapter_model(backend, kBase, saved); },
      "test_rank_pattern_saved", input_ids, targets);
  const json ours = read_json(folder + "/adapter_config.json"), peft = read_json(kAdapter + "/adapter_config.json");
  for (const char* field : {"r", "lora_alpha", "rank_pattern", "alpha_pattern", "use_rslora"}) {
    CAPTURE(field);
    CHECK(ours[field] == peft[field]);
  }
  // Written as PEFT writes them: sorted keys, integers as integers.
  std::ifstream saved(folder + "/adapter_config.json");
  const std::string text((std::istreambuf_iterator<char>(saved)), std::istreambuf_iterator<char>());
  CHECK(text.find("\"alpha_pattern\": {\n    \"o_proj\": 4,\n    \"v_proj\": 32\n  }") != std::string::npos);

  // Into a model built without the patterns: refused naming the field.
  ModelOptions plain;
  plain.weight_dtype = DType::f32;
  plain.lora = read_peft_adapter_config(kAdapter).lora;
  plain.lora->rank_pattern.clear();
  auto without = make_causal_lm(read_model_config(kBase + "/config.json"), backend, plain);
  CHECK_THROWS_WITH_AS(load_peft_adapter(folder, *without),
                       doctest::Contains("field \"rank_pattern\" is {\"layers.1.mlp.down_proj\":2,"), Error);
}

TEST_CASE("finetune merge of an adapter with patterns gives PEFT's merge_and_unload weights") {
  const Checkpoint reference(kFolder + "/reference.safetensors");
  int64_t checked = 0;
  const std::string log =
      parity::check_merged_weights(kBase, kAdapter, reference, "test_rank_pattern_merged", &checked);
  CHECK(log.find("merged 14 LoRA modules (scalings 1 to 8)") != std::string::npos);
  CHECK(checked == 14);
}

namespace {

const std::string kRunYaml =
    "model: " + kBase + "\ndata: {train: unused.jsonl}\nprecision: fp32\nlr: 0.01\n"
    "lora:\n  r: 4\n  target_modules: all-linear\n"
    "  rank_pattern: {q_proj: 8, layers.1.mlp.down_proj: 2}\n  alpha_pattern: {v_proj: 32}\n";

}  // namespace

TEST_CASE("a run config's lora.rank_pattern and lora.alpha_pattern build, train and save PEFT's adapter") {
  const TrainConfig config = parse_train_config(kRunYaml, "configs/x.yaml");
  using Ranks = std::vector<std::pair<std::string, int64_t>>;
  CHECK(config.lora.rank_pattern == Ranks{{"q_proj", 8}, {"layers.1.mlp.down_proj", 2}});  // the file's order
  HostAllocator host;
  CpuBackend backend(host);
  const parity::TrainedAdapter trained = parity::train_and_save(
      config, Checkpoint(kFolder + "/reference.safetensors"), backend, host, "test_rank_pattern_trained");
  const std::map<std::string, Shape> shapes = shapes_of(*trained.setup.model);
  CHECK(shapes.at(kKeyPrefix + "model.layers.0.self_attn.q_proj.lora_A.weight") == Shape{8, 64});
  CHECK(shapes.at(kKeyPrefix + "model.layers.1.mlp.down_proj.lora_B.weight") == Shape{64, 2});
  CHECK(shapes.at(kKeyPrefix + "model.layers.0.mlp.down_proj.lora_A.weight") == Shape{4, 88});
  const json saved = read_json(trained.folder + "/adapter_config.json");
  CHECK(saved["rank_pattern"] == json{{"layers.1.mlp.down_proj", 2}, {"q_proj", 8}});
  CHECK(saved["alpha_pattern"] == json{{"v_proj", 32}});
  CHECK(parity::adapter_file_shapes(trained.folder) == shapes);
}

namespace {

// An adapter folder with the fixture's weights and its config edited.
std::string edited_adapter(const std::string& name, const std::function<void(json&)>& edit) {
  const fs::path folder = fs::path(FT_BINARY_DIR) / "test_rank_pattern" / name;
  fs::create_directories(folder);
  json config = read_json(kAdapter + "/adapter_config.json");
  edit(config);
  std::ofstream(folder / "adapter_config.json") << config.dump(2);
  fs::copy_file(kAdapter + "/adapter_model.safetensors", folder / "adapter_model.safetensors",
                fs::copy_options::overwrite_existing);
  return folder.string();
}

}  // namespace

TEST_CASE("bad patterns are one error naming the file, line and field") {
  CHECK(parity::lora_config_error("  rank_pattern: {q_proj: 0}\n") ==
        "configs/x.yaml:4: lora.rank_pattern \"q_proj\": expected an integer in [1, 65536], got \"0\"");
  CHECK(parity::lora_config_error("  rank_pattern: {q_proj: 1.5}\n") ==
        "configs/x.yaml:4: lora.rank_pattern \"q_proj\": expected an integer in [1, 65536], got \"1.5\"");
  CHECK(parity::lora_config_error("  rank_pattern: {q_proj: eight}\n") ==
        "configs/x.yaml:4: lora.rank_pattern \"q_proj\": expected an integer in [1, 65536], got \"eight\"");
  CHECK(parity::lora_config_error("  rank_pattern: [q_proj]\n") ==
        "configs/x.yaml:4: lora.rank_pattern: expected a map from module pattern to value, e.g. {q_proj: 16}, got a "
        "list");
  CHECK(parity::lora_config_error("  alpha_pattern: {v_proj: -1}\n") ==
        "configs/x.yaml:4: lora.alpha_pattern \"v_proj\": expected a number in (0, 1e6], got \"-1\"");
  CHECK(parity::lora_config_error("  rank_pattern:\n    q_proj: 8\n    \"(k_proj\": 2\n").starts_with(
      "configs/x.yaml:4: lora.rank_pattern \"(k_proj\": not a valid regular expression (at offset 7: "));
  CHECK(parse_train_config("model: m\ndata: {train: t.jsonl}\n", "configs/x.yaml").lora.rank_pattern.empty());

  const std::string source = "adapter_config.json: field ";
  auto adapter_error = [](const std::string& name, const std::function<void(json&)>& edit) {
    try {
      read_peft_adapter_config(edited_adapter(name, edit));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(adapter_error("rank_zero", [](json& c) { c["rank_pattern"]["q_proj"] = 0; })
            .ends_with(source + "\"rank_pattern\" \"q_proj\" must be a positive integer, got 0"));
  CHECK(adapter_error("rank_text", [](json& c) { c["rank_pattern"]["q_proj"] = "8"; })
            .ends_with(source + "\"rank_pattern\" \"q_proj\" must be a positive integer, got \"8\""));
  CHECK(adapter_error("alpha_zero", [](json& c) { c["alpha_pattern"]["v_proj"] = 0; })
            .ends_with(source + "\"alpha_pattern\" \"v_proj\" must be a positive number, got 0"));
  CHECK(adapter_error("not_object", [](json& c) { c["rank_pattern"] = json::array({"q_proj"}); })
            .ends_with(source + "\"rank_pattern\" must be an object from module pattern to value, got [\"q_proj\"]"));
  CHECK(adapter_error("bad_regex", [](json& c) { c["rank_pattern"]["q_proj["] = 8; })
            .find(source + "rank_pattern \"q_proj[\": not a valid regular expression") != std::string::npos);
}
