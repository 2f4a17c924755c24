// Which modules LoRA adapts, against PEFT: tests/fixtures/module_selection
// (scripts/make_module_selection_fixture.py) holds, for a 12-layer Llama, a
// 12-layer GPT-NeoX and a T5, the modules PEFT's get_peft_model adapted (or
// that it refused) for LoraConfigs with a string target_modules (a regular
// expression), exclude_modules in both forms, and layers_to_transform with
// layers_pattern; Python's answers for the regular expressions involved;
// and two PEFT adapters on llama_gqa with reference logits and gradients. A
// model built from the same fields adapts the same modules; the adapters
// load to PEFT's values and save PEFT's fields; a run config sets them and
// bad values are refused naming the field.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/error.h"
#include "model/families.h"
#include "model/lora_pattern.h"
#include "model/peft_adapter.h"
#include "model/safetensors.h"
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
const std::string kFolder = kFixtures + "/module_selection";
const std::string kKeyPrefix = "base_model.model.";

// f32 against f32 PyTorch, as test_rank_pattern.
constexpr double kTolerance = 1e-4;

std::vector<std::string> adapted_modules(LanguageModel& model) {
  std::vector<std::string> modules;
  for (const Parameter& adapter : model.adapters()) {
    const std::string module = adapter.name.substr(0, adapter.name.find(".lora_"));
    if (std::find(modules.begin(), modules.end(), module) == modules.end()) modules.push_back(module);
  }
  std::sort(modules.begin(), modules.end());
  return modules;
}

// fields as an adapter_config.json of its own folder (r 4, alpha 8 as the
// fixture's LoraConfig), read as PEFT's files are.
LoraOptions read_fields(const json& fields, const std::string& name) {
  const fs::path folder = fs::path(FT_BINARY_DIR) / "test_module_selection" / name;
  fs::create_directories(folder);
  json config = fields;
  config["peft_type"] = "LORA";
  config["r"] = 4;
  config["lora_alpha"] = 8;
  std::ofstream(folder / "adapter_config.json") << config.dump(2);
  return read_peft_adapter_config(folder.string()).lora;
}

std::unique_ptr<LanguageModel> build(const ModelConfig& config, Backend& backend, const LoraOptions& lora) {
  ModelOptions options;
  options.weight_dtype = DType::f32;
  options.lora = lora;
  return make_language_model(config, backend, options);
}

}  // namespace

TEST_CASE("a string target_modules or exclude_modules fully matches as Python's re.fullmatch") {
  const json cases = read_json(kFolder + "/cases.json");
  REQUIRE(cases["fullmatch"].size() >= 5);
  for (const json& c : cases["fullmatch"]) {
    const std::string pattern = c[0], module = c[1];
    CAPTURE(pattern);
    CAPTURE(module);
    CHECK(regex_fullmatch(pattern, module, "test") == c[2].get<bool>());
  }
  // Backtracking past PCRE2's limit is an Error, not a no (Python's re tries every split of the name).
  CHECK_THROWS_WITH_AS(regex_fullmatch("(\\w*\\.?)*_\\d", "model.layers.0.self_attn.q_proj", "lora.target_modules"),
                       doctest::Contains("lora.target_modules: matching model.layers.0.self_attn.q_proj failed ("),
                       Error);
  CHECK_THROWS_WITH_AS(regex_fullmatch("(q_proj", "q_proj", "x.yaml:3: lora.target_modules"),
                       doctest::Contains("x.yaml:3: lora.target_modules \"(q_proj\": not a valid regular expression"),
                       Error);
}

TEST_CASE("layers_to_transform reads PEFT's layer index, by layers_pattern when given") {
  const json cases = read_json(kFolder + "/cases.json");
  REQUIRE(cases["layer_index"].size() >= 5);
  for (const json& c : cases["layer_index"]) {
    const std::string module = c[0];
    const std::vector<std::string> patterns = c[1];
    CAPTURE(module);
    CAPTURE(c[1].dump());
    CHECK(peft_layer_index(module, patterns) == c[2].get<int64_t>());
  }
  // Python's int() of a pattern's own group: PEFT fails; so do we, saying why.
  CHECK_THROWS_WITH_AS(peft_layer_index("model.layers.3.mlp", {"(layers|h)"}),
                       doctest::Contains("reads \"layers\" as the layer index of model.layers.3.mlp"), Error);
}

TEST_CASE("every LoraConfig of the fixture adapts PEFT's modules, or is refused where PEFT refuses it") {
  const json cases = read_json(kFolder + "/cases.json");
  HostAllocator host;
  CpuBackend backend(host);
  int64_t adapted = 0, refused = 0;
  for (const json& model_cases : cases["models"]) {
    const ModelConfig config = parse_model_config(model_cases["config"].dump(), "cases.json");
    int64_t index = 0;
    for (const json& c : model_cases["cases"]) {
      const std::string name = model_cases["name"].get<std::string>() + "_" + std::to_string(index++);
      CAPTURE(name);
      CAPTURE(c["fields"].dump());
      if (c.contains("error")) {
        CAPTURE(c["error"].get<std::string>());
        CHECK_THROWS_AS(build(config, backend, read_fields(c["fields"], name)), Error);
        ++refused;
        continue;
      }
      auto model = build(config, backend, read_fields(c["fields"], name));
      CHECK(adapted_modules(*model) == c["adapted"].get<std::vector<std::string>>());
      ++adapted;
    }
  }
  CHECK(adapted >= 15);
  CHECK(refused >= 5);
}

TEST_CASE("a pattern naming any one module of transformers' model adapts it as PEFT does, or is refused") {
  // PEFT adapts a module the pattern matches when it is a linear layer or an
  // embedding and refuses any other kind (a norm, a block, an activation,
  // dropout, a rotary embedding). Here LoRA adapts the decoder's linear
  // layers: every other module PEFT adapts or refuses must be refused, a
  // weightless one (a tied head, T5's embed_tokens) included.
  const json cases = read_json(kFolder + "/cases.json");
  HostAllocator host;
  CpuBackend backend(host);
  int64_t adapted = 0, refused = 0;
  for (const json& model_cases : cases["single_modules"]) {
    const ModelConfig config = parse_model_config(model_cases["config"].dump(), "cases.json");
    for (const json& c : model_cases["modules"]) {
      const std::string module = c[0], type = c[1];
      std::string pattern;  // Python's re.escape of a module name: its dots
      for (char ch : module) pattern += ch == '.' ? std::string("\\.") : std::string(1, ch);
      CAPTURE(module);
      CAPTURE(c[2].dump());
      const LoraOptions lora = read_fields({{"target_modules", pattern}}, model_cases["name"].get<std::string>());
      const bool head = module == "lm_head" || module == "embed_out";
      if (c[2].contains("adapted") && type == "Linear" && !head) {
        REQUIRE(c[2]["adapted"] == json::array({module}));
        CHECK(adapted_modules(*build(config, backend, lora)) == std::vector<std::string>{module});
        ++adapted;
      } else {
        const std::string refusal = "matches " + module + ", which is not a linear module";
        CHECK_THROWS_WITH_AS(build(config, backend, lora), doctest::Contains(refusal.c_str()), Error);
        ++refused;
      }
    }
  }
  CHECK(adapted >= 50);
  CHECK(refused >= 150);
}

TEST_CASE("the refusals say what leaves no module and how to name modules") {
  HostAllocator host;
  CpuBackend backend(host);
  const ModelConfig config = read_model_config(kBase + "/config.json");
  auto error_of = [&](const json& fields) {
    try {
      build(config, backend, read_fields(fields, "refusal"));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(error_of({{"target_modules", "q_proj"}}) ==
        "lora.target_modules \"q_proj\" (a string: a regular expression the whole module name must match, as "
        "in PEFT; module names go in a list, such as [q_proj, v_proj]) leaves no module of this llama model to adapt "
        "(its linear modules are q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)");
  CHECK(error_of({{"target_modules", {"q_proj"}}, {"exclude_modules", {"q_proj"}}}) ==
        "lora.target_modules [q_proj] with lora.exclude_modules leaves no module of this llama model to adapt (its "
        "linear modules are q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)");
  CHECK(error_of({{"target_modules", {"q_proj"}}, {"layers_to_transform", 7}}) ==
        "lora.target_modules [q_proj] with lora.layers_to_transform leaves no module of this llama model to adapt (its "
        "linear modules are q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)");
  CHECK(error_of({{"target_modules", "model\\.(embed_tokens|layers\\.0\\.self_attn\\.q_proj)"}})
            .starts_with("lora.target_modules: \"model\\.(embed_tokens|layers\\.0\\.self_attn\\.q_proj)\" matches "
                         "model.embed_tokens, which is not a linear module"));
  CHECK(error_of({{"target_modules", ".*"}}).find("\" matches model, which is not a linear module") !=
        std::string::npos);
}

TEST_CASE("PEFT adapters with a string target_modules, and with layers and exclusions, load to PEFT's values") {
  HostAllocator host;
  CpuBackend backend(host);
  for (const char* name : {"regex", "layers"}) {
    CAPTURE(name);
    const std::string folder = kFolder + "/" + name, adapter = folder + "/adapter";
    const Checkpoint reference(folder + "/reference.safetensors");
    auto model = parity::adapter_model(backend, kBase, adapter);
    CHECK(parity::adapter_file_shapes(adapter).size() == 2 * adapted_modules(*model).size());
    load_peft_adapter(adapter, *model);
    const Tensor input_ids = reference.view("input_ids");
    const Tensor targets = shifted_targets(reference.view("labels"), host);
    parity::check_reference_forward(*model, reference, input_ids, targets, kTolerance);
    model->set_trainable([](const std::string& n) { return n.find(".lora_") != std::string::npos; });
    model->forward_backward(input_ids, targets);
    CHECK(parity::check_adapter_gradients(*model, reference, kKeyPrefix, kTolerance).size() ==
          2 * adapted_modules(*model).size());

    model->forward(input_ids, targets);
    const std::string saved = parity::check_save_and_reload(
        *model, adapter, [&](const std::string& f) { return parity::adapter_model(backend, kBase, f); },
        std::string("test_module_selection_") + name, input_ids, targets);
    const json ours = read_json(saved + "/adapter_config.json"), peft = read_json(adapter + "/adapter_config.json");
    for (const char* field : {"target_modules", "exclude_modules", "layers_to_transform"}) {
      CAPTURE(field);
      CHECK(ours[field] == peft[field]);
    }
    // PEFT saves the one name as written; a list of it reads the same.
    const json& pattern = peft["layers_pattern"];
    CHECK(ours["layers_pattern"] == (pattern.is_null() ? json() : json::array({pattern})));
  }
  const LoraOptions regex = read_peft_adapter_config(kFolder + "/regex/adapter").lora;
  CHECK(regex.target_modules.empty());
  CHECK(regex.target_modules_regex == "model\\.layers\\.1\\.(self_attn\\.(q|k)_proj|mlp\\.down_proj)");
  const LoraOptions layers = read_peft_adapter_config(kFolder + "/layers/adapter").lora;
  CHECK(layers.layers_to_transform == std::vector<int64_t>{1});
  CHECK(layers.layers_pattern == std::vector<std::string>{"layers"});
  CHECK(layers.exclude_modules == std::vector<std::string>{"layers.1.self_attn.v_proj"});
}

TEST_CASE("all-linear with exclude_modules saves every linear kind beside the exclusions, which select the same") {
  HostAllocator host;
  CpuBackend backend(host);
  ModelOptions options;
  options.weight_dtype = DType::f32;
  options.lora = read_fields({{"target_modules", "all-linear"}, {"exclude_modules", {"o_proj"}}}, "all_linear");
  auto model = make_causal_lm(read_model_config(kBase + "/config.json"), backend, options);
  model->load(Checkpoint(kBase));
  CHECK(adapted_modules(*model).size() == 12);  // 2 layers x 6 kinds
  // As PEFT, which expands all-linear to every linear module before excluding any.
  CHECK(model->options().lora->target_modules ==
        std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"});
  PeftAdapterConfig adapter;
  adapter.lora = *model->options().lora;
  const std::string folder = (fs::temp_directory_path() / "test_module_selection_all_linear").string();
  fs::remove_all(folder);
  save_peft_adapter(folder, *model, adapter);
  CHECK(read_json(folder + "/adapter_config.json")["exclude_modules"] == json{"o_proj"});
  auto reloaded = parity::adapter_model(backend, kBase, folder);
  CHECK(adapted_modules(*reloaded) == adapted_modules(*model));
}

TEST_CASE("rank_pattern, alpha_pattern and exclude_modules entries that match nothing are named") {
  HostAllocator host;
  CpuBackend backend(host);
  ModelOptions options;
  options.weight_dtype = DType::f32;
  options.lora = read_fields({{"target_modules", {"q_proj", "v_proj"}},
                              {"exclude_modules", {"o_prj", "layers.1.self_attn.v_proj"}},
                              {"rank_pattern", {{"q_projj", 8}, {"v_proj", 2}, {"k_proj", 6}}},
                              {"alpha_pattern", {{"layers.0.self_attn.q_proj", 16}}}},
                             "unmatched");
  auto model = make_causal_lm(read_model_config(kBase + "/config.json"), backend, options);
  // k_proj is a linear module but not adapted: its rank changes nothing either.
  CHECK(unmatched_lora_keys(*model->options().lora, model->linear_modules(), adapted_modules(*model)) ==
        std::vector<std::string>{"lora.rank_pattern \"k_proj\" matches no adapted module",
                                 "lora.rank_pattern \"q_projj\" matches no adapted module",
                                 "lora.exclude_modules \"o_prj\" matches no linear module"});
  LoraOptions regex = *model->options().lora;
  regex.rank_pattern.clear();
  regex.exclude_modules.clear();
  regex.exclude_modules_regex = ".*\\.mlp\\.q_proj";
  CHECK(unmatched_lora_keys(regex, model->linear_modules(), adapted_modules(*model)) ==
        std::vector<std::string>{"lora.exclude_modules \".*\\.mlp\\.q_proj\" matches no linear module"});
}

TEST_CASE("an adapter into a model built with other module selection is refused naming the field") {
  HostAllocator host;
  CpuBackend backend(host);
  ModelOptions options;
  options.weight_dtype = DType::f32;
  options.lora = read_peft_adapter_config(kFolder + "/layers/adapter").lora;
  options.lora->exclude_modules.clear();
  options.lora->target_modules = {"q_proj", "up_proj"};
  auto model = make_causal_lm(read_model_config(kBase + "/config.json"), backend, options);
  CHECK_THROWS_WITH_AS(load_peft_adapter(kFolder + "/layers/adapter", *model),
                       doctest::Contains("field \"target_modules\" is [\"q_proj\",\"up_proj\",\"v_proj\"] but the "
                                         "model's adapters have [\"q_proj\",\"up_proj\"]"),
                       Error);
}

namespace {

const std::string kRunYaml = "model: " + kBase + "\ndata: {train: unused.jsonl}\nprecision: fp32\nlr: 0.01\n"
                             "lora:\n  r: 4\n"
                             "  target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]\n"
                             "  exclude_modules: '.*\\.o_proj'\n"
                             "  layers_to_transform: 1\n  layers_pattern: layers\n";

}  // namespace

TEST_CASE("a run config's module selection builds, trains and saves PEFT's fields") {
  const TrainConfig config = parse_train_config(kRunYaml, "configs/x.yaml");
  CHECK(config.lora.exclude_modules_regex == ".*\\.o_proj");
  CHECK(config.lora.layers_to_transform == std::vector<int64_t>{1});
  HostAllocator host;
  CpuBackend backend(host);
  const parity::TrainedAdapter trained = parity::train_and_save(
      config, Checkpoint(kFolder + "/layers/reference.safetensors"), backend, host, "test_module_selection_trained");
  const std::vector<std::string> want = {"model.layers.1.mlp.down_proj",      "model.layers.1.mlp.gate_proj",
                                         "model.layers.1.mlp.up_proj",        "model.layers.1.self_attn.k_proj",
                                         "model.layers.1.self_attn.q_proj",   "model.layers.1.self_attn.v_proj"};
  CHECK(adapted_modules(*trained.setup.model) == want);
  const json saved = read_json(trained.folder + "/adapter_config.json");
  CHECK(saved["target_modules"] ==
        json{"down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"});  // sorted, as PEFT's
  CHECK(saved["exclude_modules"] == ".*\\.o_proj");
  CHECK(saved["layers_to_transform"] == json{1});
  CHECK(saved["layers_pattern"] == json{"layers"});
  auto reloaded = parity::adapter_model(backend, kBase, trained.folder);
  CHECK(adapted_modules(*reloaded) == want);
}

TEST_CASE("bad module selection in a run config is one error naming the file, line and field") {
  CHECK(parity::lora_config_error("  target_modules: '(q_proj'\n")
            .starts_with("configs/x.yaml:4: lora.target_modules \"(q_proj\": not a valid regular expression"));
  CHECK(parity::lora_config_error("  target_modules: []\n") ==
        "configs/x.yaml:4: lora.target_modules: expected a non-empty list of module names such as [q_proj, v_proj], "
        "all-linear, or a regular expression over whole module names, got an empty list");
  CHECK(parity::lora_config_error("  target_modules: {q: 1}\n") ==
        "configs/x.yaml:4: lora.target_modules: expected a non-empty list of module names such as [q_proj, v_proj], "
        "all-linear, or a regular expression over whole module names, got a map");
  CHECK(parity::lora_config_error("  exclude_modules: '[o_proj'\n")
            .starts_with("configs/x.yaml:4: lora.exclude_modules \"[o_proj\": not a valid regular expression"));
  CHECK(parity::lora_config_error("  layers_to_transform: [0, -1]\n") ==
        "configs/x.yaml:4: lora.layers_to_transform: expected an integer in [0, 16777216], got \"-1\"");
  CHECK(parity::lora_config_error("  layers_to_transform: first\n") ==
        "configs/x.yaml:4: lora.layers_to_transform: expected an integer in [0, 16777216], got \"first\"");
  CHECK(parity::lora_config_error("  target_modules: '.*q_proj'\n  layers_to_transform: [1]\n") ==
        "configs/x.yaml: lora.layers_to_transform and layers_pattern need target_modules as a list of names (PEFT "
        "refuses them with a string target_modules, all-linear included; a regular expression can name the layers "
        "itself)");
  CHECK(parity::lora_config_error("  target_modules: all-linear\n  layers_to_transform: [1]\n")
            .starts_with("configs/x.yaml: lora.layers_to_transform and layers_pattern need target_modules as a list"));
  CHECK(parity::lora_config_error("  layers_pattern: layers\n") ==
        "configs/x.yaml: lora.layers_pattern is set without layers_to_transform (as in PEFT, it only says where the "
        "layer index of layers_to_transform is read)");
  CHECK(is_all_linear("ALL-LINEAR"));
  CHECK(parse_train_config("model: m\ndata: {train: t.jsonl}\nlora: {target_modules: All-Linear}\n", "x.yaml")
            .lora.target_modules == std::vector<std::string>{kAllLinear});
}
