// PEFT LoRA parity on tests/fixtures/llama_lora (written by
// scripts/make_fixtures.py with transformers + peft): the llama_gqa base with
// PEFT's adapter (r 4, alpha 8, q_proj + v_proj, nonzero B) gives PEFT's
// logits, loss, adapter gradients and AdamW step; the adapter we save has
// PEFT's keys and config and loads back to the same model; bad adapter
// folders are refused naming what is wrong.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/error.h"
#include "model/families.h"
#include "model/llama.h"
#include "model/peft_adapter.h"
#include "model/safetensors.h"
#include "tests/host_tensors.h"
#include "tests/parity.h"
#include "trainer/optimizer.h"

using namespace ft;
using ft::testing::same_bytes;
using ft::parity::read_json;
using ft::parity::relative_error;
using ft::parity::shifted_targets;
using nlohmann::json;

namespace {

const std::string kBaseFolder = std::string(FT_FIXTURES_DIR) + "/llama_gqa";
const std::string kLoraFolder = std::string(FT_FIXTURES_DIR) + "/llama_lora";
const std::string kAdapterFolder = kLoraFolder + "/adapter";
const std::string kKeyPrefix = "base_model.model.";

// f32 against f32 PyTorch on a 2-layer model: the fixture's own f32 vs f64
// check gives ~6e-7 for logits and ~2e-6 for gradients, so 1e-4 leaves
// room for summation order without hiding a wrong formula.
constexpr double kTolerance = 1e-4;

// The f32 llama_gqa base with the LoRA layout adapter_folder's config asks
// for, new adapters to start as init says.
std::unique_ptr<LlamaModel> make_lora_model(Backend& backend, const std::string& adapter_folder,
                                            LoraInit init = LoraInit::kaiming_uniform) {
  ModelOptions options;
  options.weight_dtype = DType::f32;
  options.quantized_base = QuantizedBase::none;
  options.lora = read_peft_adapter_config(adapter_folder).lora;
  options.lora->init_lora_weights = init;
  auto model = std::make_unique<LlamaModel>(read_model_config(kBaseFolder + "/config.json"), backend, options);
  model->load(Checkpoint(kBaseFolder));
  return model;
}

// Our saved folder against PEFT's: same keys and shapes, and the config
// fields that decide what PEFT builds.
void check_saved_like_peft(const std::string& folder) {
  CHECK(parity::adapter_file_shapes(folder) == parity::adapter_file_shapes(kAdapterFolder));
  const SafetensorsFile ours(folder + "/adapter_model.safetensors");  // named: entries() points into it
  for (const SafetensorsEntry& e : ours.entries()) CHECK(e.dtype == DType::f32);

  json our_config = read_json(folder + "/adapter_config.json");
  json peft_config = read_json(kAdapterFolder + "/adapter_config.json");
  for (const char* field : {"peft_type", "r", "lora_alpha", "task_type", "bias", "fan_in_fan_out", "use_rslora",
                            "use_dora", "base_model_name_or_path"}) {
    CAPTURE(field);
    CHECK(our_config[field] == peft_config[field]);
  }
  auto sorted = [](const json& list) {
    std::vector<std::string> names = list.get<std::vector<std::string>>();
    std::sort(names.begin(), names.end());
    return names;
  };
  CHECK(sorted(our_config["target_modules"]) == sorted(peft_config["target_modules"]));
}

}  // namespace

TEST_CASE("llama + PEFT adapter matches peft: logits, loss, adapter gradients, one AdamW step; save/load") {
  Checkpoint base(kBaseFolder);
  Checkpoint reference(kLoraFolder + "/reference.safetensors");
  HostAllocator host;
  TrackingAllocator tracker(host);
  CpuBackend backend(tracker);
  std::unique_ptr<LlamaModel> model = make_lora_model(backend, kAdapterFolder);
  load_peft_adapter(kAdapterFolder, *model);
  REQUIRE(model->adapters().size() == 8);

  Tensor input_ids = reference.view("input_ids");
  Tensor targets = shifted_targets(reference.view("labels"), host);
  float loss = model->forward(input_ids, targets);
  const double logits_error = relative_error(model->last_logits(), reference.view("logits"));
  MESSAGE("logits relative error ", logits_error);
  CHECK(logits_error <= kTolerance);
  const float want_loss = reference.view("loss").ptr<float>()[0];
  MESSAGE("loss relative error ", std::abs(loss - want_loss) / std::abs(want_loss));
  CHECK(std::abs(loss - want_loss) <= kTolerance * std::abs(want_loss));

  // Only the adapters train; the base gets no gradient buffer at all.
  model->set_trainable([](const std::string& name) { return name.find("lora_") != std::string::npos; });
  model->forward_backward(input_ids, targets);
  for (Parameter& p : model->parameters()) CHECK(!p.trainable());
  const std::vector<Parameter*> trainable = ft::parity::check_adapter_gradients(*model, reference, kKeyPrefix, kTolerance);
  int64_t trainable_count = 0;
  for (const Parameter* adapter : trainable) trainable_count += adapter->value.numel();
  // 2 layers x (q: A [4, 64] + B [64, 4], v: A [4, 64] + B [32, 4]).
  CHECK(trainable_count == 2 * (4 * 64 + 64 * 4 + 4 * 64 + 32 * 4));

  // torch.optim.AdamW over the adapters; the fixture does not clip.
  json hyper = read_json(kLoraFolder + "/optimizer.json");
  AdamWOptions options;
  options.beta1 = hyper["beta1"];
  options.beta2 = hyper["beta2"];
  options.eps = hyper["eps"];
  options.weight_decay = hyper["weight_decay"];
  options.max_grad_norm = 0.0;
  const size_t optimizer_before = tracker.stats().current(MemCategory::optimizer);
  AdamW adamw(backend, trainable, options);
  // Two f32 moments per trainable value and no masters: the adapters are f32.
  CHECK(tracker.stats().current(MemCategory::optimizer) - optimizer_before == size_t(2 * 4 * trainable_count));
  adamw.step(hyper["lr"].get<double>());
  for (Parameter& adapter : model->adapters()) {
    CAPTURE(adapter.name);
    const double error = relative_error(adapter.value, reference.view("after_step." + kKeyPrefix + adapter.name));
    MESSAGE("after-step relative error ", error, " ", adapter.name);
    CHECK(error <= kTolerance);
  }
  // The frozen base is untouched, bit for bit.
  for (Parameter& p : model->parameters()) {
    CAPTURE(p.name);
    CHECK(same_bytes(p.value, base.view(p.name)));
  }
  const float loss_after = model->forward(input_ids, targets);
  const float want_loss_after = reference.view("loss_after_step").ptr<float>()[0];
  MESSAGE("loss after step relative error ", std::abs(loss_after - want_loss_after) / std::abs(want_loss_after));
  CHECK(std::abs(loss_after - want_loss_after) <= kTolerance * std::abs(want_loss_after));

  // Save the stepped adapter (kept under the build folder for a by-hand
  // check with PeftModel.from_pretrained) and load it into a fresh model.
  const std::string folder = std::string(FT_BINARY_DIR) + "/test_peft/adapter_after_step";
  std::filesystem::remove_all(folder);
  save_peft_adapter(folder, *model, read_peft_adapter_config(kAdapterFolder));
  check_saved_like_peft(folder);
  CHECK(!std::filesystem::exists(folder + "/adapter_config.json.tmp"));
  std::unique_ptr<LlamaModel> reloaded = make_lora_model(backend, folder);
  load_peft_adapter(folder, *reloaded);
  reloaded->forward(input_ids, targets);
  CHECK(same_bytes(reloaded->last_logits(), model->last_logits()));

  // Our adapters carry a checksum: one flipped bit in a weight is an error naming the file.
  const std::string flipped = folder + "_flipped", weights = flipped + "/adapter_model.safetensors";
  std::filesystem::remove_all(flipped);
  std::filesystem::copy(folder, flipped);
  std::string bytes;
  {
    std::ifstream in(weights, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  bytes[bytes.size() - 3] = char(bytes[bytes.size() - 3] ^ 0x01);  // a low mantissa bit of the last value
  std::ofstream(weights, std::ios::binary | std::ios::trunc) << bytes;
  std::string message;
  try {
    load_peft_adapter(flipped, *reloaded);
  } catch (const Error& error) {
    message = error.what();
  }
  CHECK(message.find(weights + ": corrupt: its checksum is ") == 0);
}

namespace {

// An adapter folder made from the fixture's, with the config and the tensor
// list edited by the caller.
struct AdapterFiles {
  json config = read_json(kAdapterFolder + "/adapter_config.json");
  SafetensorsFile file{kAdapterFolder + "/adapter_model.safetensors"};
  std::vector<std::pair<std::string, Tensor>> tensors;

  AdapterFiles() {
    for (const SafetensorsEntry& e : file.entries())
      tensors.emplace_back(e.name, Tensor::view_of(const_cast<void*>(e.data), e.shape, e.dtype));
  }
  std::string write(const std::string& name) const {
    const std::string folder = std::string(FT_BINARY_DIR) + "/test_peft/" + name;
    std::filesystem::create_directories(folder);
    std::ofstream(folder + "/adapter_config.json") << config.dump(2);
    save_safetensors(folder + "/adapter_model.safetensors", tensors);
    return folder;
  }
};

}  // namespace

TEST_CASE("adapter configs PEFT would not give us, or that do not fit the model, are refused naming the field") {
  AdapterFiles prefix_tuning;
  prefix_tuning.config["peft_type"] = "PREFIX_TUNING";
  CHECK_THROWS_WITH_AS(read_peft_adapter_config(prefix_tuning.write("prefix_tuning")),
                       doctest::Contains("adapter_config.json: field \"peft_type\" is \"PREFIX_TUNING\""), Error);

  AdapterFiles no_targets;
  no_targets.config.erase("target_modules");
  CHECK_THROWS_WITH_AS(read_peft_adapter_config(no_targets.write("no_targets")),
                       doctest::Contains("missing required field \"target_modules\""), Error);

  // What PEFT fills in for an absent r or lora_alpha, we do too.
  AdapterFiles no_rank;
  no_rank.config.erase("r");
  no_rank.config.erase("lora_alpha");
  const LoraOptions defaults = read_peft_adapter_config(no_rank.write("no_rank")).lora;
  CHECK(defaults.r == 8);
  CHECK(defaults.lora_alpha == 8.0);
  no_rank.config["r"] = 0;
  CHECK_THROWS_WITH_AS(read_peft_adapter_config(no_rank.write("zero_rank")),
                       doctest::Contains("field \"r\" must be a positive integer, got 0"), Error);

  // A string target_modules is PEFT's regular expression (test_module_selection); a broken one is refused.
  AdapterFiles regex_targets;
  regex_targets.config["target_modules"] = ".*\\.(q_proj|v_proj";
  CHECK_THROWS_WITH_AS(read_peft_adapter_config(regex_targets.write("regex_targets")),
                       doctest::Contains("adapter_config.json: field target_modules \".*\\.(q_proj|v_proj\": not a "
                                         "valid regular expression"),
                       Error);

  AdapterFiles lora_bias;
  lora_bias.config["lora_bias"] = true;
  CHECK_THROWS_WITH_AS(read_peft_adapter_config(lora_bias.write("lora_bias")),
                       doctest::Contains("field \"lora_bias\" = true is not supported"), Error);

  HostAllocator host;
  CpuBackend backend(host);
  std::unique_ptr<LlamaModel> model = make_lora_model(backend, kAdapterFolder);
  AdapterFiles other_rank;
  other_rank.config["r"] = 8;
  CHECK_THROWS_WITH_AS(load_peft_adapter(other_rank.write("other_rank"), *model),
                       doctest::Contains("field \"r\" is 8 but the model's adapters have r = 4"), Error);

  AdapterFiles other_targets;
  other_targets.config["target_modules"] = {"q_proj", "k_proj"};
  CHECK_THROWS_WITH_AS(load_peft_adapter(other_targets.write("other_targets"), *model),
                       doctest::Contains("field \"target_modules\""), Error);
}

// PEFT's init_lora_weights: true, false and "gaussian" (any case) read into
// the LoRA options and written back as PEFT writes them; another string is
// kept as written, and one whose initialisation rewrote the base's weights
// (PiSSA, CorDA, OLoRA, LoftQ, LoRA-GA) makes the adapter warn that it
// belongs to that rewritten base.
TEST_CASE("init_lora_weights: read and saved as PEFT writes it; one that rewrites the base is refused") {
  HostAllocator host;
  CpuBackend backend(host);
  std::unique_ptr<LlamaModel> model = make_lora_model(backend, kAdapterFolder);
  AdapterFiles files;
  files.config.erase("base_model_name_or_path");  // no other-base warning from the folder it names
  struct Case {
    json value;
    LoraInit init;
    std::string kept, saved;
  };
  for (const Case& c : {Case{true, LoraInit::kaiming_uniform, "", "true"}, Case{false, LoraInit::random, "", "false"},
                        Case{"Gaussian", LoraInit::gaussian, "", "\"gaussian\""},
                        Case{"eva", LoraInit::kaiming_uniform, "eva", "\"eva\""}}) {
    CAPTURE(c.value.dump());
    files.config["init_lora_weights"] = c.value;
    const std::string folder = files.write("init_lora_weights");
    const PeftAdapterConfig adapter = read_peft_adapter_config(folder);
    CHECK(adapter.lora.init_lora_weights == c.init);
    CHECK(adapter.init_lora_weights == c.kept);
    const std::string saved = std::string(FT_BINARY_DIR) + "/test_peft/init_lora_weights_saved";
    std::filesystem::remove_all(saved);
    save_peft_adapter(saved, *model, adapter);
    CHECK(read_json(saved + "/adapter_config.json")["init_lora_weights"].dump() == c.saved);
  }
  // PEFT's from_pretrained runs these again over the base it loads (W - scaling B0 A0), which W + B A is not.
  for (const char* rewrites : {"pissa", "pissa_niter_4", "OLoRA", "loftq", "corda", "lora_ga"}) {
    CAPTURE(rewrites);
    files.config["init_lora_weights"] = rewrites;
    const std::string folder = files.write("init_lora_weights");
    const std::string expected = folder + "/adapter_config.json: init_lora_weights \"" + rewrites + "\": PEFT runs "
                                 "this initialisation again over the base when it loads the adapter";
    CHECK_THROWS_WITH_AS(read_peft_adapter_config(folder), doctest::Contains(expected.c_str()), Error);
  }
  files.config["init_lora_weights"] = 1;
  CHECK_THROWS_WITH_AS(read_peft_adapter_config(files.write("init_lora_weights")),
                       doctest::Contains("field \"init_lora_weights\" must be a boolean or a string, got 1"), Error);
}

// A model's new adapters start as lora.init_lora_weights says (the
// distributions themselves: test_lora): gaussian's A with std 1 / r and B
// zero, false's B drawn as well.
TEST_CASE("init_adapters starts the adapters as init_lora_weights says") {
  HostAllocator host;
  CpuBackend backend(host);
  for (LoraInit init : {LoraInit::gaussian, LoraInit::random}) {
    CAPTURE(int(init));
    std::unique_ptr<LlamaModel> model = make_lora_model(backend, kAdapterFolder, init);
    model->init_adapters(5);
    double sum_sq_A = 0.0, count_A = 0.0, nonzero_B = 0.0;
    for (const Parameter& p : model->adapters()) {
      const std::vector<float> values = ft::testing::read(p.value);
      if (p.name.find("lora_A") != std::string::npos)
        for (float a : values) sum_sq_A += double(a) * a, count_A += 1.0;
      else
        nonzero_B += double(std::count_if(values.begin(), values.end(), [](float b) { return b != 0.0f; }));
    }
    REQUIRE(count_A > 0.0);
    if (init == LoraInit::gaussian) {
      const double r = double(model->options().lora->r);
      CHECK(sum_sq_A / count_A == doctest::Approx(1.0 / (r * r)).epsilon(0.15));
      CHECK(nonzero_B == 0.0);
    } else {
      CHECK(nonzero_B > 0.0);
    }
  }
}

TEST_CASE("adapter weights: a missing, extra or misshapen tensor is refused naming it; adapter-named keys load") {
  HostAllocator host;
  CpuBackend backend(host);
  std::unique_ptr<LlamaModel> model = make_lora_model(backend, kAdapterFolder);
  load_peft_adapter(kAdapterFolder, *model);
  Checkpoint reference(kLoraFolder + "/reference.safetensors");
  const std::string dropped = kKeyPrefix + "model.layers.1.self_attn.v_proj.lora_B.weight";

  AdapterFiles missing;
  std::erase_if(missing.tensors, [&](const auto& t) { return t.first == dropped; });
  CHECK_THROWS_WITH_AS(load_peft_adapter(missing.write("missing_key"), *model),
                       doctest::Contains(("missing tensor \"" + dropped + "\"").c_str()), Error);

  AdapterFiles extra;
  extra.tensors.emplace_back(kKeyPrefix + "model.layers.0.mlp.up_proj.lora_A.weight", extra.tensors[0].second);
  CHECK_THROWS_WITH_AS(load_peft_adapter(extra.write("extra_key"), *model),
                       doctest::Contains(("unexpected tensor \"" + kKeyPrefix + "model.layers.0.mlp.up_proj.lora_A.weight\"").c_str()),
                       Error);

  AdapterFiles misshapen;
  for (auto& [name, tensor] : misshapen.tensors)
    if (name == dropped) tensor = tensor.reshaped({tensor.dim(1), tensor.dim(0)});
  CHECK_THROWS_WITH_AS(load_peft_adapter(misshapen.write("misshapen"), *model),
                       doctest::Contains(("tensor \"" + dropped + "\" has shape [4, 32]").c_str()), Error);

  // Refused loads copied nothing: the model still gives PEFT's logits.
  Tensor targets = shifted_targets(reference.view("labels"), host);
  model->forward(reference.view("input_ids"), targets);
  CHECK(relative_error(model->last_logits(), reference.view("logits")) <= kTolerance);

  // Keys that keep the adapter name (".lora_A.default.weight") load the same.
  AdapterFiles named;
  for (auto& [name, tensor] : named.tensors) name.replace(name.rfind(".weight"), 7, ".default.weight");
  std::unique_ptr<LlamaModel> fresh = make_lora_model(backend, kAdapterFolder);
  load_peft_adapter(named.write("adapter_named_keys"), *fresh);
  fresh->forward(reference.view("input_ids"), targets);
  CHECK(same_bytes(fresh->last_logits(), model->last_logits()));
}

TEST_CASE("no target_modules: PEFT's default targets for the architecture, recorded in the saved adapter") {
  HostAllocator host;
  CpuBackend backend(host);
  ModelOptions options;
  options.lora = LoraOptions{};
  const struct {
    const char* fixture;
    std::vector<std::string> targets;
    std::string first_adapter;
  } cases[] = {
      {"llama_gqa", {"q_proj", "v_proj"}, "model.layers.0.self_attn.q_proj.lora_A.weight"},
      {"gpt_neox_parallel", {"query_key_value"}, "gpt_neox.layers.0.attention.query_key_value.lora_A.weight"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.fixture);
    const ModelConfig config = read_model_config(std::string(FT_FIXTURES_DIR) + "/" + c.fixture + "/config.json");
    std::unique_ptr<CausalLM> model = make_causal_lm(config, backend, options);
    CHECK(model->options().lora->target_modules == c.targets);
    // Two adapters (A, B) per targeted module per layer, PEFT's default rank.
    REQUIRE(model->adapters().size() == 2 * c.targets.size() * size_t(config.num_hidden_layers));
    CHECK(model->adapters().front().name == c.first_adapter);
    CHECK(model->adapters().front().value.dim(0) == 8);

    const std::string folder = std::string(FT_BINARY_DIR) + "/peft_default_targets_" + c.fixture;
    model->init_adapters(1);
    save_peft_adapter(folder, *model, PeftAdapterConfig{*model->options().lora, "", "CAUSAL_LM", {}});
    CHECK(read_peft_adapter_config(folder).lora.target_modules == c.targets);
  }
}
