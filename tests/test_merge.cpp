// finetune merge against PEFT: tests/fixtures/merge/reference.safetensors
// (scripts/make_merge_fixtures.py) holds the logits of merge_and_unload() on
// llama_gqa + llama_lora and gpt_neox_parallel + gpt_neox_lora (the fused
// query_key_value), in f32 and with the merged weights rounded to bf16. Our
// merged folders, loaded as plain checkpoints with no adapter, must give
// them: f32 within 1e-5 of the largest |logit| (measured 5e-7), bf16 within
// 2e-5 (a bf16 rounding of W + scaling B A can land one ulp away when the
// sum is taken in another order; measured 3.4e-6). Also: the
// shards, the index and the copied files; and every bad input is one Error
// naming the file, raised before --out is touched.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/error.h"
#include "model/causal_lm.h"
#include "model/families.h"
#include "model/peft_adapter.h"
#include "model/safetensors.h"
#include "trainer/adapter_merge.h"
#include "trainer/cli/merge.h"

using namespace ft;
namespace fs = std::filesystem;

namespace {

const std::string kFixtures = FT_FIXTURES_DIR;

std::string fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / (std::string(FT_TEST_NAME) + "_" + name);
  fs::remove_all(dir);
  return dir.string();
}

MergeCommand command_for(const std::string& base, const std::string& adapter, const std::string& out) {
  MergeCommand command;
  command.model = kFixtures + "/" + base;
  command.adapter = kFixtures + "/" + adapter + "/adapter";
  command.out = out;
  return command;
}

// The merged folder's logits on the fixture's input ids, [T, vocab]; with an
// adapter folder, those of folder with it loaded as generate loads it.
std::vector<float> merged_logits(const std::string& folder, const std::string& adapter = "") {
  HostAllocator host;
  CpuBackend backend(host);
  ModelOptions options;
  if (!adapter.empty()) options.lora = read_peft_adapter_config(adapter).lora;
  auto model = make_causal_lm(read_model_config(folder + "/config.json"), backend, options);
  model->load(Checkpoint(folder));
  if (!adapter.empty()) load_peft_adapter(adapter, *model);
  const Checkpoint reference(kFixtures + "/merge/reference.safetensors");
  const Tensor ids = reference.view("input_ids");
  const int64_t T = ids.numel();
  Tensor input_ids = Tensor::empty({1, T}, DType::i32, host, MemCategory::activations);
  Tensor targets = Tensor::empty({1, T}, DType::i32, host, MemCategory::activations);
  std::copy_n(ids.ptr<int32_t>(), T, input_ids.ptr<int32_t>());
  std::fill_n(targets.ptr<int32_t>(), T, -100);
  model->forward(input_ids, targets);
  const Tensor& logits = model->last_logits();
  return std::vector<float>(logits.ptr<float>(), logits.ptr<float>() + logits.numel());
}

void check_against_peft(const std::string& folder, const std::string& key, double bound_of_max) {
  CAPTURE(key);
  const std::vector<float> got = merged_logits(folder);
  const Checkpoint reference(kFixtures + "/merge/reference.safetensors");
  const Tensor want = reference.view(key);
  REQUIRE(int64_t(got.size()) == want.numel());
  double largest = 0.0, worst = 0.0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    largest = std::max(largest, double(std::abs(want.ptr<float>()[i])));
    worst = std::max(worst, double(std::abs(got[size_t(i)] - want.ptr<float>()[i])));
  }
  CAPTURE(worst);
  CHECK(worst <= bound_of_max * largest);
}

std::string error_of(const MergeCommand& command) {
  std::ostringstream log;
  try {
    merge_adapter(command, log);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

}  // namespace

TEST_CASE("merged checkpoints give PEFT's merge_and_unload logits, f32 and bf16") {
  std::ostringstream log;
  const std::string llama = fresh_dir("llama");
  MergeCommand command = command_for("llama_gqa", "llama_lora", llama);
  command.max_shard_bytes = 100'000;  // several shards and an index
  merge_adapter(command, log);
  check_against_peft(llama, "llama.logits_f32", 1e-5);
  const nlohmann::json index = nlohmann::json::parse(std::ifstream(llama + "/model.safetensors.index.json"));
  const size_t shards = std::distance(fs::directory_iterator(llama), fs::directory_iterator{}) - 3;
  CHECK(shards > 2);
  CHECK(index["weight_map"].size() == Checkpoint(kFixtures + "/llama_gqa").names().size());
  for (size_t i = 1; i <= shards; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "/model-%05zu-of-%05zu.safetensors", i, shards);
    CHECK(fs::file_size(llama + name) <= 100'000 + 4096);  // tensors within the limit, plus the header
  }
  CHECK(fs::exists(llama + "/generation_config.json"));

  for (const char* dtype : {"f32", "bf16"}) {
    const std::string neox = fresh_dir(std::string("neox_") + dtype);
    MergeCommand neox_command = command_for("gpt_neox_parallel", "gpt_neox_lora", neox);
    if (std::string(dtype) == "bf16") neox_command.dtype = DType::bf16;
    merge_adapter(neox_command, log);
    CHECK(fs::exists(neox + "/model.safetensors"));
    const nlohmann::json config = nlohmann::json::parse(std::ifstream(neox + "/config.json"));
    const std::string stored = config.contains("dtype") ? config["dtype"] : config["torch_dtype"];
    CHECK(stored == (std::string(dtype) == "bf16" ? "bfloat16" : "float32"));
    if (std::string(dtype) == "bf16") check_against_peft(neox, "neox.logits_bf16", 2e-5);
    else check_against_peft(neox, "neox.logits_f32", 1e-5);
  }
}

// llama_gqa rewritten with each tensor in dtype_of(name), and scaled (one element of `big` set to 1e5).
static std::string rewritten_base(const std::string& name, DType (*dtype_of)(const std::string&), const std::string& big) {
  const std::string folder = fresh_dir(name);
  fs::create_directories(folder);
  fs::copy_file(kFixtures + "/llama_gqa/config.json", folder + "/config.json");
  const Checkpoint base(kFixtures + "/llama_gqa");
  HostAllocator host;
  CpuBackend backend(host);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const std::string& tensor : base.names()) {
    Tensor f32 = backend.empty(base.view(tensor).shape, DType::f32, MemCategory::weights);
    backend.copy(f32, base.view(tensor));
    if (tensor == big) f32.ptr<float>()[0] = 1e5f;
    Tensor stored = backend.empty(f32.shape, dtype_of(tensor), MemCategory::weights);
    backend.copy(stored, f32);
    tensors.emplace_back(tensor, stored);
  }
  save_safetensors(folder + "/model.safetensors", tensors, {{"format", "pt"}});
  return folder;
}

static DType mixed_dtype(const std::string& name) {
  if (name.find("self_attn") != std::string::npos) return DType::bf16;
  return name.find("mlp") != std::string::npos ? DType::f16 : DType::f32;
}

static DType all_f32(const std::string&) { return DType::f32; }

TEST_CASE("merge keeps each tensor's own dtype, as PEFT's merge_and_unload, and config.json's dtype with it") {
  const std::string base = rewritten_base("mixed_base", mixed_dtype, "");
  std::ostringstream log;
  MergeCommand command = command_for("llama_gqa", "llama_lora", fresh_dir("mixed_out"));
  command.model = base;
  merge_adapter(command, log);
  CHECK(log.str().find("into 21 bf16 and f16 and f32 tensors") != std::string::npos);
  const Checkpoint input(base), merged(command.out);
  REQUIRE(merged.names() == input.names());
  for (const std::string& name : input.names()) {
    CAPTURE(name);
    CHECK(merged.entry(name).dtype == input.entry(name).dtype);
    const bool adapted = name.find("q_proj") != std::string::npos || name.find("v_proj") != std::string::npos;
    const SafetensorsEntry &a = input.entry(name), &b = merged.entry(name);
    CHECK((std::memcmp(a.data, b.data, a.size_bytes) == 0) == !adapted);  // only the adapted weights change
  }
  const nlohmann::json config = nlohmann::json::parse(std::ifstream(command.out + "/config.json"));
  CHECK(config["dtype"] == "float32");
}

TEST_CASE("merge refuses a weight that rounds to infinity in --dtype fp16, naming it and what to give") {
  MergeCommand command = command_for("llama_gqa", "llama_lora", fresh_dir("overflow_out"));
  command.model = rewritten_base("big_base", all_f32, "model.layers.1.mlp.down_proj.weight");
  command.dtype = DType::f16;
  CHECK(error_of(command) == command.out + ": tensor \"model.layers.1.mlp.down_proj.weight\" does not fit f16: element "
                             "0 rounds to infinity (f16 holds |x| <= 65504); give --dtype bf16 or fp32");
  CHECK(!fs::exists(command.out));  // nothing half-written left behind
  command.dtype = DType::bf16;
  command.out = fresh_dir("overflow_bf16");
  CHECK(error_of(command) == "");
}

// A base bitsandbytes saved quantised (NF4 with double quantisation, and
// LLM.int8()) merges into floating weights: each decoder weight dequantised
// as bitsandbytes dequantises it, the adapter's scaling * B A added in f32
// (scripts/make_quantized_merge_fixture.py: bitsandbytes' dequantize_4bit
// and int8_vectorwise_dequant). Within 1e-6 of the largest |w| (the sums'
// order; the int8 scale is divided by 127 here and multiplied by its
// reciprocal there). The folder holds the model's tensors alone, floating,
// and its config.json no quantization_config.
TEST_CASE("merge dequantises a base bitsandbytes saved in NF4 or INT8, as bitsandbytes does") {
  const Checkpoint reference(kFixtures + "/merge/quantized_reference.safetensors");
  for (const auto& [format, base] : {std::pair{"nf4", "nf4/llama_nf4"}, std::pair{"int8", "bnb_checkpoint/llama_int8"}}) {
    CAPTURE(format);
    const std::string out = fresh_dir(std::string("quantized_") + format);
    std::ostringstream log;
    merge_adapter(command_for(base, "llama_lora", out), log);
    CHECK(log.str().find("(the base's INT8 or NF4 weights dequantised)") != std::string::npos);
    const Checkpoint merged(out);
    std::vector<std::string> names = merged.names(), want = Checkpoint(kFixtures + "/llama_gqa").names();
    std::sort(names.begin(), names.end());
    std::sort(want.begin(), want.end());
    CHECK(names == want);
    int compared = 0;
    for (const std::string& key : reference.names()) {
      if (!key.starts_with(std::string(format) + ".")) continue;
      const std::string name = key.substr(key.find('.') + 1);
      CAPTURE(name);
      const Tensor got = merged.view(name), expected = reference.view(key);
      REQUIRE(got.dtype == DType::f32);
      REQUIRE(got.shape == expected.shape);
      double largest = 0.0, worst = 0.0;
      for (int64_t i = 0; i < got.numel(); ++i) {
        largest = std::max(largest, double(std::abs(expected.ptr<float>()[i])));
        worst = std::max(worst, double(std::abs(got.ptr<float>()[i] - expected.ptr<float>()[i])));
      }
      CAPTURE(worst);
      CHECK(worst <= 1e-6 * largest);
      compared++;
    }
    CHECK(compared == 5);
    const nlohmann::json config = nlohmann::json::parse(std::ifstream(out + "/config.json"));
    CHECK(!config.contains("quantization_config"));
    CHECK(merged_logits(out).size() > 0);  // loads as a plain floating checkpoint
  }
}

// The adapter names its base (base_model_name_or_path): a base whose
// config.json says another model gets a warning; one that differs only in
// how its weights are stored (bitsandbytes' quantization_config and dtype)
// does not.
TEST_CASE("merge warns of an adapter over another model's base, not over its own base saved quantised") {
  const std::string adapter = fresh_dir("own_base_adapter");
  fs::copy(kFixtures + "/llama_lora/adapter", adapter);
  nlohmann::json adapter_config = nlohmann::json::parse(std::ifstream(adapter + "/adapter_config.json"));
  adapter_config["base_model_name_or_path"] = kFixtures + "/llama_gqa";
  std::ofstream(adapter + "/adapter_config.json") << adapter_config.dump(2);
  const std::string other = fresh_dir("other_base");
  fs::copy(kFixtures + "/llama_gqa", other);
  nlohmann::json config = nlohmann::json::parse(std::ifstream(other + "/config.json"));
  config["rms_norm_eps"] = 1e-3;
  std::ofstream(other + "/config.json") << config.dump(2);
  for (const auto& [base, warned] : {std::pair{kFixtures + "/bnb_checkpoint/llama_int8", false}, {other, true}}) {
    CAPTURE(base);
    MergeCommand command;
    command.model = base, command.adapter = adapter, command.out = fresh_dir("warned");
    std::ostringstream log;
    merge_adapter(command, log);
    CHECK((log.str().find("the adapter may not belong to this base") != std::string::npos) == warned);
  }
}

TEST_CASE("merge refuses bad input with one error naming the file, before writing anything") {
  const std::string out = fresh_dir("refused");
  // The adapter of another architecture: its modules are not in this checkpoint.
  CHECK(error_of(command_for("llama_gqa", "gpt_neox_lora", out))
            .find("module \"gpt_neox.layers.0.attention.query_key_value\" has no weight") != std::string::npos);
  // A config.json that says 3 layers over 2 layers' weights: a merged folder transformers cannot load.
  const fs::path three = fs::path(FT_BINARY_DIR) / "merge_config_mismatch";
  fs::create_directories(three);
  nlohmann::json config = nlohmann::json::parse(std::ifstream(kFixtures + "/llama_gqa/config.json"));
  config["num_hidden_layers"] = 3;
  std::ofstream(three / "config.json") << config.dump();
  fs::copy_file(kFixtures + "/llama_gqa/model.safetensors", three / "model.safetensors",
                fs::copy_options::overwrite_existing);
  MergeCommand deeper = command_for("llama_gqa", "llama_lora", out);
  deeper.model = three.string();
  CHECK(error_of(deeper).find("missing tensor \"model.layers.2.input_layernorm.weight\", which " +
                              (three / "config.json").string() + " implies") != std::string::npos);
  // --out may not be MODEL itself.
  CHECK(error_of(command_for("llama_gqa", "llama_lora", kFixtures + "/llama_gqa")).find("--out is MODEL itself") !=
        std::string::npos);
  // No adapter there.
  MergeCommand missing = command_for("llama_gqa", "llama_lora", out);
  missing.adapter = kFixtures + "/llama_gqa";
  CHECK(error_of(missing).find("adapter_config.json") != std::string::npos);
  CHECK(!fs::exists(out));
  // An --out that already holds a checkpoint.
  const std::string taken = fresh_dir("taken");
  std::ostringstream log;
  merge_adapter(command_for("llama_gqa", "llama_lora", taken), log);
  CHECK(error_of(command_for("llama_gqa", "llama_lora", taken)).find("already holds a model (config.json)") !=
        std::string::npos);
  // Another model's folder, however its weights are stored, and a tokenizer merge would write over.
  const std::string pickled = fresh_dir("pickled");
  fs::create_directories(pickled);
  std::ofstream(fs::path(pickled) / "pytorch_model.bin") << "weights";
  CHECK(error_of(command_for("llama_gqa", "llama_lora", pickled)).find("already holds a model (pytorch_model.bin)") !=
        std::string::npos);
  const std::string tokenized = fresh_dir("tokenized");
  fs::create_directories(tokenized);
  std::ofstream(fs::path(tokenized) / "tokenizer.model") << "another tokenizer";
  CHECK(error_of(command_for("llama_gqa", "llama_lora", tokenized)).find("already holds tokenizer.model, which merge "
                                                                         "would replace") != std::string::npos);
  for (const std::string& folder : {pickled, tokenized}) CHECK(!fs::exists(fs::path(folder) / "model.safetensors"));
}

namespace {

// A PEFT adapter folder over a 64-wide Llama fixture: LoRA (r 2) on every q_proj, its modules_to_save, and
// `extra` tensors under the keys PEFT saves them with.
std::string write_adapter(const std::string& name, const std::vector<std::string>& modules_to_save,
                          const std::vector<std::pair<std::string, Shape>>& extra) {
  const std::string folder = fresh_dir(name);
  fs::create_directories(folder);
  const nlohmann::json config = {{"peft_type", "LORA"}, {"task_type", "CAUSAL_LM"}, {"r", 2}, {"lora_alpha", 4},
                                 {"target_modules", {"q_proj"}}, {"modules_to_save", modules_to_save}};
  std::ofstream(folder + "/adapter_config.json") << config.dump();
  std::vector<std::pair<std::string, Shape>> shapes = extra;
  for (int layer = 0; layer < 2; ++layer) {
    const std::string module = "base_model.model.model.layers." + std::to_string(layer) + ".self_attn.q_proj.";
    shapes.push_back({module + "lora_A.weight", {2, 64}});
    shapes.push_back({module + "lora_B.weight", {64, 2}});
  }
  HostAllocator host;
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (size_t t = 0; t < shapes.size(); ++t) {
    Tensor value = Tensor::empty(shapes[t].second, DType::f32, host, MemCategory::weights);
    for (int64_t i = 0; i < value.numel(); ++i) value.ptr<float>()[i] = 0.05f * std::sin(float(7 * i + 3 * t + 1));
    tensors.emplace_back(shapes[t].first, value);
  }
  save_safetensors(folder + "/adapter_model.safetensors", tensors);
  return folder;
}

}  // namespace

TEST_CASE("modules_to_save lm_head over a tied base and embed_tokens: merge and a loaded adapter agree") {
  struct Case {
    const char* base;
    std::vector<std::string> modules_to_save;
    std::string tensor;
  };
  const Case cases[] = {{"llama_tied", {"lm_head"}, "base_model.model.lm_head.weight"},
                        {"llama_gqa", {"embed_tokens"}, "base_model.model.model.embed_tokens.weight"}};
  for (const Case& c : cases) {
    CAPTURE(c.base);
    const std::string adapter =
        write_adapter(std::string("saves_") + c.base, c.modules_to_save, {{c.tensor, {320, 64}}});
    const std::string out = fresh_dir(std::string("merged_") + c.base);
    MergeCommand command = command_for(c.base, "llama_lora", out);
    command.adapter = adapter;
    std::ostringstream log;
    merge_adapter(command, log);
    // Untied (llama_gqa never was tied): the head merged from lm_head is a tensor of its own.
    const nlohmann::json config = nlohmann::json::parse(std::ifstream(out + "/config.json"));
    CHECK(config["tie_word_embeddings"] == false);
    const std::vector<float> merged = merged_logits(out), loaded = merged_logits(kFixtures + "/" + c.base, adapter);
    REQUIRE(merged.size() == loaded.size());
    double worst = 0.0;
    for (size_t i = 0; i < merged.size(); ++i) worst = std::max(worst, double(std::abs(merged[i] - loaded[i])));
    CHECK(worst < 1e-4);
  }
}

TEST_CASE("merge unties a tied base's lm_head that modules_to_save replaces; a tied config beside it is refused") {
  const std::string adapter = write_adapter("tied_head", {"lm_head"}, {{"base_model.model.lm_head.weight", {320, 64}}});
  const std::string out = fresh_dir("tied_config");
  MergeCommand command = command_for("llama_tied", "llama_lora", out);
  command.adapter = adapter;
  std::ostringstream log;
  merge_adapter(command, log);
  // The merged head is its own tensor: transformers 5 unties such a config only with a warning.
  nlohmann::json config = nlohmann::json::parse(std::ifstream(out + "/config.json"));
  CHECK(config["tie_word_embeddings"] == false);
  CHECK(Checkpoint(out).contains("lm_head.weight"));
  config["tie_word_embeddings"] = true;
  std::ofstream(out + "/config.json") << config.dump();
  HostAllocator host;
  CpuBackend backend(host);
  auto model = make_causal_lm(read_model_config(out + "/config.json"), backend, ModelOptions{});
  CHECK_THROWS_WITH_AS(model->load(Checkpoint(out)),
                       (out + "/model.safetensors: tensor \"lm_head.weight\" differs from \"model.embed_tokens.weight\", "
                              "but config.json ties them (tie_word_embeddings: true); transformers then unties them and "
                              "uses both, which this model cannot: set \"tie_word_embeddings\": false in config.json")
                           .c_str(),
                       Error);
}

TEST_CASE("LoRA on an embedding is refused by merge and by a load, with one error naming the tensor") {
  const std::string embedding =
      write_adapter("lora_embedding", {},
                    {{"base_model.model.model.embed_tokens.lora_embedding_A", {2, 320}},
                     {"base_model.model.model.embed_tokens.lora_embedding_B", {64, 2}}});
  const std::string expected = embedding + "/adapter_model.safetensors: tensor "
                               "\"base_model.model.model.embed_tokens.lora_embedding_A\" is LoRA on an embedding, which is "
                               "not supported";
  MergeCommand command = command_for("llama_gqa", "llama_lora", fresh_dir("lora_embedding_out"));
  command.adapter = embedding;
  CHECK(error_of(command).find(expected) != std::string::npos);
  CHECK_THROWS_WITH_AS(merged_logits(kFixtures + "/llama_gqa", embedding), doctest::Contains(expected.c_str()), Error);
}

TEST_CASE("modules_to_save embed_tokens over a tied base is refused by merge and by a load, naming the tensor") {
  // PEFT wraps embed_tokens alone: its tied lm_head keeps the original embedding, which one tied tensor cannot.
  const std::string adapter =
      write_adapter("tied_embedding", {"embed_tokens"}, {{"base_model.model.model.embed_tokens.weight", {320, 64}}});
  const std::string expected = adapter + "/adapter_model.safetensors: tensor "
                               "\"base_model.model.model.embed_tokens.weight\" (modules_to_save) replaces an embedding "
                               "that ";
  const std::string out = fresh_dir("tied_embedding_out");
  MergeCommand command = command_for("llama_tied", "llama_lora", out);
  command.adapter = adapter;
  const std::string error = error_of(command);
  CHECK(error.find(expected) != std::string::npos);
  CHECK(error.find("ties to lm_head, which is not supported") != std::string::npos);
  CHECK(!fs::exists(out));
  CHECK_THROWS_WITH_AS(merged_logits(kFixtures + "/llama_tied", adapter), doctest::Contains(expected.c_str()), Error);
}

TEST_CASE("a modules_to_save module the model has but the file lacks is refused by merge and by a load") {
  // Untied (llama_gqa) and tied (llama_tied) heads: the base's head would stand in for the one the adapter lists.
  // A listed module the model lacks is skipped (PEFT's sequence classifiers list "classifier" and "score").
  for (const char* base : {"llama_gqa", "llama_tied"}) {
    CAPTURE(base);
    const std::string adapter = write_adapter(std::string("unsaved_head_") + base, {"classifier", "lm_head"}, {});
    const std::string expected = adapter + "/adapter_model.safetensors: adapter_config.json's modules_to_save lists "
                                 "\"lm_head\" but the file holds no tensor of it (expected "
                                 "\"base_model.model.lm_head.weight\")";
    const std::string out = fresh_dir(std::string("unsaved_head_out_") + base);
    MergeCommand command = command_for(base, "llama_lora", out);
    command.adapter = adapter;
    CHECK(error_of(command) == expected);
    CHECK(!fs::exists(out));
    CHECK_THROWS_WITH_AS(merged_logits(kFixtures + "/" + base, adapter), expected.c_str(), Error);
  }
  const std::string classifier = write_adapter("unsaved_classifier", {"classifier"}, {});
  MergeCommand command = command_for("llama_gqa", "llama_lora", fresh_dir("unsaved_classifier_out"));
  command.adapter = classifier;
  CHECK(error_of(command).empty());
}

TEST_CASE("unused_tensors names what a checkpoint holds beyond the model its config describes, and nothing else") {
  // Every fixture checkpoint is read whole: float, bitsandbytes' INT8 and NF4 (their constants), a tied head,
  // GPT-NeoX, Qwen2, Mistral, T5 v1.0 and v1.1.
  for (const char* fixture : {"llama_gqa", "llama_tied", "bnb_checkpoint/llama_int8", "nf4/llama_nf4",
                              "gpt_neox_parallel", "qwen2", "mistral", "t5_v1_0", "t5_v1_1"}) {
    CAPTURE(fixture);
    const std::string folder = kFixtures + "/" + fixture;
    CHECK(unused_tensors(Checkpoint(folder), read_model_config(folder + "/config.json"), OutputHead::none).empty());
  }
  // A config cut to one of llama_gqa's two layers reads none of the second's nine tensors.
  nlohmann::json config = nlohmann::json::parse(std::ifstream(kFixtures + "/llama_gqa/config.json"));
  config["num_hidden_layers"] = 1;
  const std::vector<std::string> unused = unused_tensors(Checkpoint(kFixtures + "/llama_gqa"),
                                                         parse_model_config(config.dump(), "cut"), OutputHead::none);
  CHECK(unused.size() == 9);
  for (const std::string& name : unused) CHECK(name.starts_with("model.layers.1."));
  // A score head is read by a reward model, not by a language model; a saved rotary buffer by neither, silently.
  const std::string scored = fresh_dir("scored");
  fs::create_directories(scored);
  fs::copy_file(kFixtures + "/llama_gqa/config.json", scored + "/config.json");
  HostAllocator host;
  std::vector<std::pair<std::string, Tensor>> tensors;
  const Checkpoint base(kFixtures + "/llama_gqa");
  for (const std::string& name : base.names()) tensors.emplace_back(name, base.view(name));
  Tensor score = Tensor::empty({1, 64}, DType::f32, host, MemCategory::weights);
  for (int64_t i = 0; i < score.numel(); ++i) score.ptr<float>()[i] = 0.5f;
  tensors.emplace_back("score.weight", score);
  tensors.emplace_back("model.layers.0.self_attn.rotary_emb.inv_freq", score);  // a buffer older transformers saved
  save_safetensors(scored + "/model.safetensors", tensors);
  const ModelConfig llama = read_model_config(scored + "/config.json");
  CHECK(unused_tensors(Checkpoint(scored), llama, OutputHead::none) == std::vector<std::string>{"score.weight"});
  CHECK(unused_tensors(Checkpoint(scored), llama, OutputHead::score).empty());
}

TEST_CASE("T5's tied copies in a checkpoint are the shared embedding's when equal, and refused when not") {
  // Older transformers saved encoder/decoder embed_tokens and a tied lm_head beside shared.weight.
  HostAllocator host;
  CpuBackend backend(host);
  const std::string t5 = fresh_dir("t5_tied_copies");
  fs::create_directories(t5);
  fs::copy_file(kFixtures + "/t5_v1_0/config.json", t5 + "/config.json");
  const Checkpoint t5_base(kFixtures + "/t5_v1_0");
  std::vector<std::pair<std::string, Tensor>> t5_tensors;
  for (const std::string& name : t5_base.names()) t5_tensors.emplace_back(name, t5_base.view(name));
  for (const char* copy : {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"})
    t5_tensors.emplace_back(copy, t5_base.view("shared.weight"));
  save_safetensors(t5 + "/model.safetensors", t5_tensors);
  CHECK(unused_tensors(Checkpoint(t5), read_model_config(t5 + "/config.json"), OutputHead::none).empty());
  make_language_model(read_model_config(t5 + "/config.json"), backend, ModelOptions{})->load(Checkpoint(t5));
  // A copy of other values is another model (transformers unties it), which a tied model here cannot be.
  Tensor other = Tensor::empty(t5_base.entry("shared.weight").shape, DType::f32, host, MemCategory::weights);
  for (int64_t i = 0; i < other.numel(); ++i) other.ptr<float>()[i] = 0.25f;
  t5_tensors[t5_tensors.size() - 3].second = other;  // encoder.embed_tokens.weight
  save_safetensors(t5 + "/model.safetensors", t5_tensors);
  CHECK_THROWS_WITH_AS(
      make_language_model(read_model_config(t5 + "/config.json"), backend, ModelOptions{})->load(Checkpoint(t5)),
      (t5 + "/model.safetensors: tensor \"encoder.embed_tokens.weight\" differs from \"shared.weight\", but the model "
            "ties them; transformers then unties them and uses both, which this model cannot").c_str(),
      Error);
}

TEST_CASE("GPT-NeoX's head saved as PEFT over transformers 5 saves it (lm_head) replaces embed_out") {
  // transformers 5 calls GPT-NeoX's head lm_head; its checkpoints keep embed_out.weight.
  const std::string adapter = fresh_dir("neox_head");
  fs::create_directories(adapter);
  std::ofstream(adapter + "/adapter_config.json")
      << nlohmann::json{{"peft_type", "LORA"}, {"task_type", "CAUSAL_LM"}, {"r", 2}, {"lora_alpha", 4},
                        {"target_modules", {"query_key_value"}}, {"modules_to_save", {"lm_head"}}}
             .dump();
  HostAllocator host;
  std::vector<std::pair<std::string, Tensor>> tensors;
  const auto add = [&](const std::string& name, const Shape& shape, float scale) {
    Tensor value = Tensor::empty(shape, DType::f32, host, MemCategory::weights);
    for (int64_t i = 0; i < value.numel(); ++i) value.ptr<float>()[i] = scale * std::sin(float(3 * i + 1));
    tensors.emplace_back(name, value);
  };
  for (int layer = 0; layer < 2; ++layer) {
    const std::string module = "base_model.model.gpt_neox.layers." + std::to_string(layer) + ".attention.query_key_value.";
    add(module + "lora_A.weight", {2, 64}, 0.05f);
    add(module + "lora_B.weight", {192, 2}, 0.05f);
  }
  add("base_model.model.lm_head.weight", {320, 64}, 0.5f);
  save_safetensors(adapter + "/adapter_model.safetensors", tensors);
  const std::string out = fresh_dir("neox_head_out");
  MergeCommand command = command_for("gpt_neox_parallel", "llama_lora", out);
  command.adapter = adapter;
  std::ostringstream log;
  merge_adapter(command, log);
  const Checkpoint merged(out);
  CHECK(!merged.contains("lm_head.weight"));
  const Tensor head = merged.view("embed_out.weight");
  const Tensor& saved = tensors.back().second;
  CHECK(std::equal(head.ptr<float>(), head.ptr<float>() + head.numel(), saved.ptr<float>()));
  // A loaded adapter takes the same head: the merged folder's logits are the adapter's over the base.
  const std::vector<float> from_merge = merged_logits(out), loaded = merged_logits(kFixtures + "/gpt_neox_parallel", adapter);
  REQUIRE(from_merge.size() == loaded.size());
  double worst = 0.0;
  for (size_t i = 0; i < loaded.size(); ++i) worst = std::max(worst, double(std::abs(from_merge[i] - loaded[i])));
  CHECK(worst < 1e-4);
}

namespace {

// Largest |logit - PEFT's| over PEFT's largest |logit|, for a case of
// tests/fixtures/merge/variants (scripts/make_merge_variants_fixture.py).
double off_peft(const std::vector<float>& got, const std::string& variant) {
  const Checkpoint reference(kFixtures + "/merge/variants/reference.safetensors");
  const Tensor want = reference.view(variant + ".logits");
  REQUIRE(int64_t(got.size()) == want.numel());
  double largest = 0.0, worst = 0.0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    largest = std::max(largest, double(std::abs(want.ptr<float>()[i])));
    worst = std::max(worst, double(std::abs(got[size_t(i)] - want.ptr<float>()[i])));
  }
  return worst / largest;
}

// A copy of a variant's adapter with tensor `key` scaled by 1.5.
std::string changed_variant(const std::string& variant, const std::string& key) {
  const std::string from = kFixtures + "/merge/variants/" + variant + "/adapter";
  const std::string folder = fresh_dir("changed_" + variant);
  fs::create_directories(folder);
  fs::copy_file(from + "/adapter_config.json", folder + "/adapter_config.json");
  HostAllocator host;
  CpuBackend backend(host);
  const SafetensorsFile file(from + "/adapter_model.safetensors");
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const SafetensorsEntry& entry : file.entries()) {
    Tensor value = Tensor::empty(entry.shape, DType::f32, host, MemCategory::weights);
    backend.copy(value, Tensor::view_of(const_cast<void*>(entry.data), entry.shape, entry.dtype));
    if (entry.name == key)
      for (int64_t i = 0; i < value.numel(); ++i) value.ptr<float>()[i] *= 1.5f;
    tensors.emplace_back(entry.name, value);
  }
  save_safetensors(folder + "/adapter_model.safetensors", tensors);
  return folder;
}

}  // namespace

TEST_CASE("modules PEFT saves beside LoRA give PEFT's logits, merged and loaded") {
  // norms: modules_to_save ["norm"] saves every *norm (PEFT matches the name's end, not a dotted part);
  // neox_norms: a LayerNorm's weight and bias; tied_head: ensure_weight_tying keeps llama_tied's head on the
  // embedding's copy; untied_head: without it PEFT unties the head; head_lora: LoRA on lm_head with the base
  // weight copy PEFT saves beside it.
  const std::pair<const char*, const char*> cases[] = {
      {"norms", "llama_gqa"},          {"neox_norms", "gpt_neox_sequential"}, {"tied_head", "llama_tied"},
      {"untied_head", "llama_tied"}, {"head_lora", "llama_gqa"}};
  for (const auto& [variant, base] : cases) {
    CAPTURE(variant);
    const std::string adapter = kFixtures + "/merge/variants/" + variant + "/adapter";
    const std::string out = fresh_dir(std::string("variant_") + variant);
    MergeCommand command = command_for(base, "llama_lora", out);
    command.adapter = adapter;
    std::ostringstream log;
    merge_adapter(command, log);
    CHECK(off_peft(merged_logits(out), variant) < 1e-5);  // measured <= 6.5e-7
    const nlohmann::json config = nlohmann::json::parse(std::ifstream(out + "/config.json"));
    CHECK(config.value("tie_word_embeddings", false) == (std::string(variant) == "tied_head"));
    if (std::string(variant) == "head_lora") {
      // LoRA on a head is merged only: a loaded model adapts linear modules of its layers.
      CHECK_THROWS_AS(merged_logits(kFixtures + "/" + base, adapter), Error);
      continue;
    }
    CHECK(off_peft(merged_logits(kFixtures + "/" + base, adapter), variant) < 1e-5);
  }
}

TEST_CASE("a saved head or base layer copy that disagrees with what PEFT ties it to is refused, naming the tensor") {
  const std::string tied = changed_variant("tied_head", "base_model.model.lm_head.weight");
  const std::string tied_error = tied + "/adapter_model.safetensors: tensor \"base_model.model.lm_head.weight\" "
                                 "differs from the embedding \"base_model.model.model.embed_tokens.weight\" saved "
                                 "beside it, but adapter_config.json's ensure_weight_tying keeps them tied";
  MergeCommand command = command_for("llama_tied", "llama_lora", fresh_dir("changed_tied_out"));
  command.adapter = tied;
  CHECK(error_of(command) == tied_error);
  CHECK_THROWS_WITH_AS(merged_logits(kFixtures + "/llama_tied", tied), tied_error.c_str(), Error);

  const std::string copy = changed_variant("head_lora", "base_model.model.lm_head.base_layer.weight");
  command = command_for("llama_gqa", "llama_lora", fresh_dir("changed_copy_out"));
  command.adapter = copy;
  const std::string error = error_of(command);
  CHECK(error.find(copy + "/adapter_model.safetensors: tensor \"base_model.model.lm_head.base_layer.weight\" (the "
                   "base weight PEFT saves beside LoRA on an embedding or a head) differs from \"lm_head.weight\" of ") ==
        0);
  CHECK(!fs::exists(command.out));
}
