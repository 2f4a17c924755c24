// Quantised checkpoints as transformers + bitsandbytes save them
// (tests/fixtures/bnb_checkpoint/, written by
// scripts/make_bnb_checkpoint_fixtures.py from tests/fixtures/llama_gqa):
// an 8-bit one loads and computes with W = codes * SCB / 127; a saved base
// (save_quantized_base, quantized_base_config) has transformers' tensor
// names, dtypes, shapes and config.json; a quantization_config this program
// cannot honour, or one the run's quantization disagrees with, is one Error
// naming config.json and the field.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "model/causal_lm.h"
#include "model/families.h"
#include "model/quant/int8.h"
#include "model/quantized_base.h"
#include "model/safetensors.h"
#include "tests/host_tensors.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::same_bytes;

const std::string kFixtures = FT_FIXTURES_DIR;
const std::string kDense = kFixtures + "/llama_gqa";
const std::string kInt8 = kFixtures + "/bnb_checkpoint/llama_int8";
const std::string kNf4Config = kFixtures + "/bnb_checkpoint/llama_nf4/config.json";

json read_json(const std::string& path) { return json::parse(std::ifstream(path)); }

// A fresh folder under the build tree, per test process.
fs::path scratch(const std::string& tag) {
  const fs::path path = fs::path(FT_BINARY_DIR) / ("bnb_checkpoint_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(path);
  fs::create_directories(path);
  return path;
}

ModelOptions int8_options(float threshold = 6.0f) {
  ModelOptions options;
  options.quantized_base = QuantizedBase::int8;
  options.int8_threshold = threshold;
  return options;
}

std::unique_ptr<CausalLM> load_model(Backend& backend, const std::string& config, const std::string& weights,
                                     const ModelOptions& options) {
  auto model = make_causal_lm(read_model_config(config), backend, options);
  model->load(Checkpoint(weights));
  return model;
}

// Logits of a fixed batch.
Tensor logits_of(CausalLM& model, Allocator& host) {
  Tensor ids = Tensor::empty({2, 8}, DType::i32, host, MemCategory::activations);
  Tensor targets = Tensor::empty({2, 8}, DType::i32, host, MemCategory::activations);
  for (int i = 0; i < 16; ++i) ids.ptr<int32_t>()[i] = (i * 37) % 320, targets.ptr<int32_t>()[i] = (i * 53) % 320;
  model.forward(ids, targets);
  return model.last_logits();
}

std::string module_of(const std::string& weight) { return weight.substr(0, weight.size() - std::string(".weight").size()); }

TEST_CASE("an 8-bit checkpoint saved by transformers loads, and its linears compute with W = codes * SCB / 127") {
  HostAllocator host;
  CpuBackend backend(host);
  Checkpoint file(kInt8);
  // A threshold below every nonzero input makes every input column an
  // outlier: the whole product runs in f32 through the dequantised weight,
  // so the forward is the dense one of what the file's numbers mean.
  auto int8 = load_model(backend, kInt8 + "/config.json", kInt8, int8_options(1e-30f));
  auto dense = load_model(backend, kDense + "/config.json", kDense, {});
  size_t int8_weights = 0;
  for (const Parameter& p : int8->parameters()) {
    CAPTURE(p.name);
    Tensor& dense_value = dense->parameter(p.name).value;
    if (p.value.dtype != DType::i8) {
      CHECK(same_bytes(p.value, file.view(p.name)));
      CHECK(same_bytes(dense_value, file.view(p.name)));  // transformers saved the rest as it was
      continue;
    }
    ++int8_weights;
    // Taken as stored: the codes under the weight's name, the scales under the module's.
    const Tensor codes = file.view(p.name), scb = file.view(module_of(p.name) + ".SCB");
    CHECK(same_bytes(p.value, codes));
    CHECK(same_bytes(int8_scales(p), scb));
    const int64_t out = codes.dim(0), in = codes.dim(1);
    for (int64_t o = 0; o < out; ++o) {
      const double scale = double(load_as_f32(scb.data, DType::f32, o));
      for (int64_t k = 0; k < in; ++k)
        dense_value.ptr<float>()[o * in + k] =
            float(double(static_cast<const int8_t*>(codes.data)[o * in + k]) * scale / 127.0);
    }
  }
  CHECK(int8_weights == 2 * 7);
  const std::vector<float> got = testing::read(logits_of(*int8, host));
  const std::vector<float> want = testing::read(logits_of(*dense, host));
  double worst = 0.0, largest = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, double(std::abs(got[i] - want[i])));
    largest = std::max(largest, double(std::abs(want[i])));
  }
  CHECK(worst <= 1e-5 * largest);

  // At transformers' threshold the inputs are quantised too: close, not equal.
  auto default_threshold = load_model(backend, kInt8 + "/config.json", kInt8, int8_options());
  const std::vector<float> approximate = testing::read(logits_of(*default_threshold, host));
  double drift = 0.0;
  for (size_t i = 0; i < want.size(); ++i) drift = std::max(drift, double(std::abs(approximate[i] - want[i])));
  CHECK(drift <= 0.05 * largest);
}

TEST_CASE("a base saved by an earlier version (\"<module>.weight.SCB\", no weight_format) still loads") {
  HostAllocator host;
  CpuBackend backend(host);
  Checkpoint file(kInt8);
  const fs::path dir = scratch("earlier");
  NamedTensors tensors;
  for (const std::string& name : file.names()) {
    if (name.ends_with(".weight_format")) continue;
    const bool scb = name.ends_with(".SCB");
    tensors.emplace_back(scb ? name.substr(0, name.size() - 4) + ".weight.SCB" : name, file.view(name));
  }
  save_safetensors((dir / "model.safetensors").string(), tensors);
  fs::copy_file(kDense + "/config.json", dir / "config.json");  // earlier bases had no quantization_config
  auto earlier = load_model(backend, (dir / "config.json").string(), dir.string(), int8_options());
  auto current = load_model(backend, kInt8 + "/config.json", kInt8, int8_options());
  for (const Parameter& p : current->parameters()) {
    CAPTURE(p.name);
    const Parameter& q = earlier->parameter(p.name);
    CHECK(same_bytes(p.value, q.value));
    if (p.value.dtype == DType::i8) CHECK(same_bytes(int8_scales(p), int8_scales(q)));
  }
  fs::remove_all(dir);
}

TEST_CASE("a saved base has the tensor names, dtypes, shapes and config.json transformers + bitsandbytes write") {
  HostAllocator host;
  CpuBackend backend(host);
  const fs::path dir = scratch("saved");
  SUBCASE("int8") {
    const ModelOptions options = int8_options();
    auto model = load_model(backend, kDense + "/config.json", kDense, options);
    const std::string saved = (dir / "model.safetensors").string();
    save_quantized_base(*model, saved);
    Checkpoint ours(saved), theirs(kInt8);
    std::vector<std::string> names = ours.names(), bnb_names = theirs.names();
    std::sort(names.begin(), names.end());
    std::sort(bnb_names.begin(), bnb_names.end());
    CHECK(names == bnb_names);
    int64_t codes_off_by_one = 0;
    for (const std::string& name : bnb_names) {
      CAPTURE(name);
      if (!ours.contains(name)) continue;
      const SafetensorsEntry &a = ours.entry(name), &b = theirs.entry(name);
      CHECK(a.dtype == b.dtype);
      CHECK(a.shape == b.shape);
      if (a.dtype != b.dtype || a.shape != b.shape) continue;
      const Tensor x = ours.view(name), y = theirs.view(name);
      if (name.ends_with(".weight_format") || (a.dtype == DType::f32 && !name.ends_with(".SCB"))) {
        CHECK(same_bytes(x, y));
        continue;
      }
      // bitsandbytes quantises the weight rounded to f16 (Int8Params), we
      // the f32 weight: its row absmax is ours to f16 precision, the codes
      // at most one apart.
      for (int64_t i = 0; i < x.numel(); ++i) {
        if (a.dtype == DType::f32) {
          const float s = load_as_f32(x.data, DType::f32, i), t = load_as_f32(y.data, DType::f32, i);
          CHECK(std::abs(s - t) <= std::ldexp(std::abs(t), -11));
          continue;
        }
        const int d = std::abs(int(static_cast<const int8_t*>(x.data)[i]) - int(static_cast<const int8_t*>(y.data)[i]));
        CHECK(d <= 1);
        codes_off_by_one += d;
      }
    }
    CHECK(codes_off_by_one == 543);  // of 58,368 (tests/fixtures/README.md)
    json config = quantized_base_config(kDense + "/config.json", options), want = read_json(kInt8 + "/config.json");
    config.erase("transformers_version");
    want.erase("transformers_version");
    CHECK(config.dump(2) == want.dump(2));
  }
  SUBCASE("nf4 (its tensors: tests/test_nf4.cpp)") {
    ModelOptions options;
    options.quantized_base = QuantizedBase::nf4;
    options.nf4_double_quant = true;
    json config = quantized_base_config(kDense + "/config.json", options), want = read_json(kNf4Config);
    config.erase("transformers_version");
    want.erase("transformers_version");
    CHECK(config.dump(2) == want.dump(2));
  }
  fs::remove_all(dir);
}

// The int8 fixture's config.json with quantization_config's fields changed.
std::string config_with(const json& changes) {
  json config = read_json(kInt8 + "/config.json");
  for (const auto& [key, value] : changes.items()) config["quantization_config"][key] = value;
  return config.dump();
}

TEST_CASE("a quantization_config that cannot be honoured is one Error naming config.json, the field and what is supported") {
  const auto refused = [](const json& changes, const std::string& message) {
    CAPTURE(changes.dump());
    CHECK_THROWS_WITH(parse_model_config(config_with(changes), "dir/config.json"),
                      doctest::Contains(("dir/config.json: quantization_config" + message).c_str()));
  };
  const json four_bit = {{"load_in_8bit", false}, {"load_in_4bit", true}, {"bnb_4bit_quant_type", "nf4"}};
  json fp4 = four_bit, bf16_storage = four_bit, missing_type = four_bit;
  fp4["bnb_4bit_quant_type"] = "fp4";
  bf16_storage["bnb_4bit_quant_storage"] = "bfloat16";
  missing_type["bnb_4bit_quant_type"] = nullptr;
  refused(fp4, ".bnb_4bit_quant_type \"fp4\" is not supported (supported: \"nf4\")");
  refused(missing_type, ".bnb_4bit_quant_type \"fp4\" is not supported");  // BitsAndBytesConfig's default
  refused(bf16_storage, ".bnb_4bit_quant_storage \"bfloat16\" is not supported (supported: \"uint8\"");
  refused({{"quant_method", "gptq"}}, ".quant_method \"gptq\": only \"bitsandbytes\"");
  refused({{"llm_int8_has_fp16_weight", true}}, ".llm_int8_has_fp16_weight: true is not supported (supported: false");
  refused({{"load_in_8bit", false}}, " has load_in_8bit false and load_in_4bit false: exactly one must be true");
  refused({{"load_in_8bit", "yes"}}, ": field \"load_in_8bit\" has the wrong type");

  // The 8-bit config's 4-bit fields are BitsAndBytesConfig's defaults (fp4): not read.
  CHECK(parse_model_config(config_with({}), "c").stored_quantization.format == QuantizedBase::int8);
  const ModelConfig nf4 = parse_model_config(config_with(four_bit), "c");
  CHECK(nf4.stored_quantization.format == QuantizedBase::nf4);
  CHECK(!nf4.stored_quantization.double_quant);
  CHECK(parse_model_config(read_json(kDense + "/config.json").dump(), "c").stored_quantization.format ==
        QuantizedBase::none);
}

TEST_CASE("a quantised checkpoint loads only with the quantization its config.json names") {
  HostAllocator host;
  CpuBackend backend(host);
  const std::string config = kInt8 + "/config.json";
  ModelOptions nf4;
  nf4.quantized_base = QuantizedBase::nf4;
  CHECK_THROWS_WITH(load_model(backend, config, kInt8, {}),
                    doctest::Contains((config + ": quantization_config.load_in_8bit is true: its decoder linears are "
                                       "stored int8 and load only with quantization.mode int8 (this run has none)")
                                          .c_str()));
  CHECK_THROWS_WITH(load_model(backend, config, kInt8, nf4),
                    doctest::Contains("load only with quantization.mode int8 (this run has nf4)"));

  // transformers' NF4 config.json over bitsandbytes' NF4 tensors: transformers' own folder.
  const std::string nf4_tensors = kFixtures + "/nf4/llama_nf4";
  CHECK_THROWS_WITH(load_model(backend, kNf4Config, nf4_tensors, int8_options()),
                    doctest::Contains((kNf4Config + ": quantization_config.load_in_4bit is true: its decoder linears "
                                       "are stored NF4 and load only with quantization.mode nf4 (this run has int8)")
                                          .c_str()));
  nf4.nf4_double_quant = false;
  CHECK_THROWS_WITH(load_model(backend, kNf4Config, nf4_tensors, nf4),
                    doctest::Contains((kNf4Config + ": quantization_config.bnb_4bit_use_double_quant is true but "
                                       "quantization.double_quant is false; set it to true")
                                          .c_str()));
  nf4.nf4_double_quant = true;
  auto from_transformers = load_model(backend, kNf4Config, nf4_tensors, nf4);
  auto without_config = load_model(backend, kDense + "/config.json", nf4_tensors, nf4);
  CHECK(same_bytes(logits_of(*from_transformers, host), logits_of(*without_config, host)));
}

}  // namespace
}  // namespace ft
