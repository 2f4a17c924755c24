// finetune export --gguf against llama.cpp's converter: tests/fixtures/gguf/
// (scripts/make_gguf_fixtures.py) holds the GGUF files that the `gguf`
// package's writer, name map and quantisers make of tiny checkpoints under
// convert_hf_to_gguf.py's rules. Our export of the same checkpoint, read back
// with our reader, must hold every metadata entry of the reference with the
// same type and value (ours may add a few, e.g. general.name) and every
// tensor with the same name, shape, type and bytes (Llama-3's rope_freqs,
// computed in f32 by torch there, within 1 ulp). Also: bad input is one Error
// and leaves no file.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kernels/error.h"
#include "model/gguf_file.h"
#include "model/gguf_quant.h"
#include "trainer/cli/merge.h"
#include "trainer/gguf_export.h"
#include "trainer/gguf_special_ids.h"

using namespace ft;
namespace fs = std::filesystem;

namespace {

const std::string kFixtures = FT_FIXTURES_DIR;

std::string fresh_file(const std::string& name) {
  const fs::path path = fs::temp_directory_path() / (std::string(FT_TEST_NAME) + "_" + name + ".gguf");
  fs::remove(path);
  return path.string();
}

GgufExportCommand command_for(const std::string& model, const std::string& tokenizer, const std::string& adapter,
                              GgmlType type, const std::string& out) {
  GgufExportCommand command;
  command.model = kFixtures + "/" + model;
  command.tokenizer = kFixtures + "/" + tokenizer;
  command.adapter = adapter.empty() ? "" : kFixtures + "/" + adapter;
  command.type = type;
  command.out = out;
  return command;
}

bool is_special_id_key(const std::string& key) {
  return key.rfind("tokenizer.ggml.", 0) == 0 && key.size() > 3 && key.compare(key.size() - 3, 3, "_id") == 0;
}

void check_equal_to_reference(const GgufFile& ours, const GgufFile& reference) {
  CHECK(ours.version() == 3);
  for (const auto& [key, value] : reference.metadata()) {
    INFO("metadata ", key);
    REQUIRE(ours.contains(key));
    CHECK(ours.value(key) == value);
  }
  for (const auto& [key, value] : ours.metadata()) {
    INFO("metadata ", key);
    if (is_special_id_key(key)) CHECK(reference.contains(key));  // llama.cpp's defaults stand where the converter writes none
  }
  REQUIRE(ours.tensors().size() == reference.tensors().size());
  for (const GgufFile::TensorInfo& expected : reference.tensors()) {
    INFO("tensor ", expected.name);
    const GgufFile::TensorInfo& got = ours.tensor(expected.name);
    CHECK(got.shape == expected.shape);
    REQUIRE(got.type == expected.type);
    REQUIRE(got.size_bytes == expected.size_bytes);
    if (expected.name == "rope_freqs.weight") {
      const std::vector<float> a = from_ggml(got.data, shape_numel(got.shape), got.type);
      const std::vector<float> b = from_ggml(expected.data, shape_numel(expected.shape), expected.type);
      for (size_t i = 0; i < a.size(); ++i) CHECK(std::fabs(a[i] - b[i]) <= std::fabs(b[i]) * 1.2e-7f);
    } else {
      CHECK(std::memcmp(got.data, expected.data, got.size_bytes) == 0);
    }
  }
}

struct Case {
  const char* reference;
  const char* model;
  const char* tokenizer;
  const char* adapter;
  GgmlType type;
};

}  // namespace

TEST_CASE("export --gguf writes what llama.cpp's converter writes: metadata, tokenizer and tensors") {
  const Case cases[] = {
      // Llama-3 layout: q/k permuted, rope_freqs, tied embeddings, byte-level BPE "llama-bpe", Q8_0.
      {"llama3_tiny_q8_0", "llama3_tiny", "llama3_tiny/tokenizer.json", "", GgmlType::q8_0},
      // Qwen2: q/k/v biases, rows not permuted, untied output, BPE "qwen2", F16.
      {"qwen2_tiny_f16", "qwen2_tiny", "qwen2_tiny/tokenizer.json", "", GgmlType::f16},
      // Llama with GQA, a PEFT adapter merged in, SentencePiece with scores, BF16.
      {"llama_lora_bf16", "llama_gqa", "tokenizer/tokenizer.model", "llama_lora/adapter", GgmlType::bf16},
      // GPT-NeoX: LayerNorm, fused qkv regrouped, Q8_0 with F16 for 176-wide rows.
      {"gpt_neox_q8_0", "gpt_neox_parallel", "tokenizer/tokenizer.model", "", GgmlType::q8_0},
  };
  for (const Case& c : cases) {
    CAPTURE(c.reference);
    const std::string out = fresh_file(c.reference);
    std::ostringstream log;
    export_gguf(command_for(c.model, c.tokenizer, c.adapter, c.type, out), log);
    check_equal_to_reference(GgufFile(out), GgufFile(kFixtures + "/gguf/" + c.reference + ".gguf"));
  }
}

TEST_CASE("special-token ids are the ones llama.cpp's converter picks (gguf-py's SpecialVocab)") {
  const std::string path = kFixtures + "/gguf/special_ids.json";
  std::ifstream file(path);
  const nlohmann::json fixture = nlohmann::json::parse(file);
  const fs::path folder = fs::temp_directory_path() / (std::string(FT_TEST_NAME) + "_special_ids");
  for (const auto& c : fixture["cases"]) {
    CAPTURE(c["name"].get<std::string>());
    fs::remove_all(folder);
    fs::create_directories(folder);
    for (const auto& [name, content] : c["files"].items()) std::ofstream(folder / name) << content.dump();
    std::vector<std::pair<std::string, int64_t>> expected;
    for (const auto& entry : c["expected"]) expected.emplace_back(entry[0], entry[1]);
    const std::string tokenizer = (folder / c["tokenizer"].get<std::string>()).string();
    CHECK(gguf_special_ids(tokenizer, (folder / "config.json").string(), c["vocab_size"]) == expected);
  }
  fs::remove_all(folder);
}

TEST_CASE("Q8_0 blocks follow ggml's reference quantiser: d = max|x| / 127 as F16, codes round half away from 0") {
  std::vector<float> values(64, 0.0f);
  values[0] = -2.54f;  // amax: d = 0.02
  values[1] = 0.03f;   // 1.5 codes: rounds away from zero to 2
  values[2] = -0.01f;  // -0.5 codes: -1
  // The second block is all zeros: d 0, codes 0.
  const std::vector<uint8_t> bytes = to_ggml(values.data(), 64, GgmlType::q8_0);
  REQUIRE(bytes.size() == 68);
  uint16_t d_bits;
  std::memcpy(&d_bits, bytes.data(), 2);
  CHECK(d_bits == f32_to_f16(2.54f / 127.0f));
  CHECK(int8_t(bytes[2]) == -127);
  CHECK(int8_t(bytes[3]) == int8_t(std::round(0.03f * (1.0f / (2.54f / 127.0f)))));
  CHECK(int8_t(bytes[4]) == int8_t(std::round(-0.01f * (1.0f / (2.54f / 127.0f)))));
  for (size_t i = 34; i < 68; ++i) CHECK(bytes[i] == 0);
}

TEST_CASE("export --gguf refuses what llama.cpp cannot read with one error, leaving no file") {
  const std::string out = fresh_file("refused");
  const auto refuses = [&](const GgufExportCommand& command, const std::string& fragment) {
    std::ostringstream log;
    CAPTURE(fragment);
    try {
      export_gguf(command, log);
      FAIL("no error");
    } catch (const Error& error) {
      CHECK(std::string(error.what()).find(fragment) != std::string::npos);
    }
    CHECK(!fs::exists(out));
    CHECK(!fs::exists(out + ".tmp"));
  };
  refuses(command_for("t5_v1_1", "tokenizer/tokenizer.model", "", GgmlType::f16, out),
          "model_type \"t5\" has no llama.cpp architecture");
  refuses(command_for("llama_dynamic_rope", "tokenizer/tokenizer.model", "", GgmlType::f16, out),
          "rope_type \"dynamic\"");
  refuses(command_for("llama_gqa", "tokenizer/tokenizer.model", "gpt_neox_lora/adapter", GgmlType::f16, out),
          "is this the adapter's base model?");
  refuses(command_for("llama_gqa", "tokenizers/mistral/tokenizer.json", "", GgmlType::f16, out),
          "a SentencePiece-style BPE");
  // A pre-tokenizer llama.cpp has no equal of: ByteLevel's add_prefix_space (llama.cpp never adds the space), a
  // Whitespace split (not SentencePiece's: no tokenizer.model to point to).
  const auto edited_tokenizer = [&](const std::string& name, const auto& edit) {
    nlohmann::json tokenizer = nlohmann::json::parse(std::ifstream(kFixtures + "/llama3_tiny/tokenizer.json"));
    edit(tokenizer["pre_tokenizer"]);
    const fs::path folder = fs::path(FT_BINARY_DIR) / "gguf_tokenizers" / name;
    fs::create_directories(folder);
    std::ofstream(folder / "tokenizer.json") << tokenizer.dump();
    GgufExportCommand command = command_for("llama3_tiny", "", "", GgmlType::f16, out);
    command.tokenizer = (folder / "tokenizer.json").string();
    return command;
  };
  refuses(edited_tokenizer("prefix_space", [](nlohmann::json& pre) {
            pre["pretokenizers"][1]["add_prefix_space"] = true;
          }),
          "pre_tokenizer's ByteLevel has add_prefix_space: true (a space put before the text), which no llama.cpp "
          "pre-tokenizer adds");
  refuses(edited_tokenizer("whitespace", [](nlohmann::json& pre) { pre = {{"type", "Whitespace"}}; }),
          "tokenizer.json: pre_tokenizer {\"type\":\"Whitespace\"} has no llama.cpp pre-tokenizer this export knows");
  // A base saved quantised by a run (quantization.save_base) is not the weights llama.cpp wants.
  refuses(command_for("nf4/llama_nf4", "tokenizer/tokenizer.model", "", GgmlType::f16, out),
          "(a quantised base, as quantization.save_base writes); export needs the original F32, BF16 or F16 weights");
  // A config.json that does not describe the weights (llama_gqa's 2 layers of 88-wide MLPs): a GGUF whose
  // block_count or feed_forward_length contradicts its tensors loads nowhere.
  const auto mismatched = [&](const std::string& name, const char* key, int64_t delta) {
    const fs::path folder = fs::path(FT_BINARY_DIR) / "gguf_config_mismatch" / name;
    fs::create_directories(folder);
    nlohmann::json config = nlohmann::json::parse(std::ifstream(kFixtures + "/llama_gqa/config.json"));
    config[key] = config[key].get<int64_t>() + delta;
    std::ofstream(folder / "config.json") << config.dump();
    fs::copy_file(kFixtures + "/llama_gqa/model.safetensors", folder / "model.safetensors",
                  fs::copy_options::overwrite_existing);
    GgufExportCommand command = command_for("llama_gqa", "tokenizer/tokenizer.model", "", GgmlType::f16, out);
    command.model = folder.string();
    return command;
  };
  refuses(mismatched("more_layers", "num_hidden_layers", 1),
          "more_layers: missing tensor \"model.layers.2.input_layernorm.weight\", which");
  refuses(mismatched("fewer_layers", "num_hidden_layers", -1),
          "model.safetensors: tensor \"model.layers.1.input_layernorm.weight\" is not in the model");
  refuses(mismatched("wider_mlp", "intermediate_size", 8), "has shape [88, 64] but config.json implies [96, 64]");
}

TEST_CASE("export --gguf replaces an existing file only with --overwrite, and only a GGUF file") {
  const std::string out = fresh_file("existing");
  GgufExportCommand command = command_for("llama_gqa", "tokenizer/tokenizer.model", "", GgmlType::f16, out);
  std::ostringstream log;
  std::ofstream(out) << "{\"prompt\": \"a data file\"}\n";
  for (bool overwrite : {false, true}) {
    command.overwrite = overwrite;
    CHECK_THROWS_WITH_AS(export_gguf(command, log), doctest::Contains("names an existing file that is not a GGUF"),
                         Error);
    CHECK(std::ifstream(out).get() == '{');
  }
  fs::copy_file(kFixtures + "/gguf/llama3_tiny_q8_0.gguf", out, fs::copy_options::overwrite_existing);
  command.overwrite = false;
  CHECK_THROWS_WITH_AS(export_gguf(command, log), doctest::Contains("give --overwrite to replace it"), Error);
  CHECK(fs::file_size(out) == fs::file_size(kFixtures + "/gguf/llama3_tiny_q8_0.gguf"));
  command.overwrite = true;
  export_gguf(command, log);
  CHECK(GgufFile(out).value("general.name").strings.at(0) == "llama_gqa");
  fs::remove(out);
}

TEST_CASE("our GGUF reader refuses a truncated file naming it") {
  const std::string path = fresh_file("truncated");
  const std::string reference = kFixtures + "/gguf/llama3_tiny_q8_0.gguf";
  fs::copy_file(reference, path);
  fs::resize_file(path, fs::file_size(reference) - 10);
  CHECK_THROWS_WITH_AS(GgufFile{path}, doctest::Contains("runs past the end of the file"), Error);
  fs::remove(path);
}

TEST_CASE("export --gguf of an adapter with modules_to_save writes what exporting its merged folder writes") {
  // The merge is checked against PEFT (test_merge); the adapters are PEFT's
  // (tests/fixtures/merge/variants): norms by name, llama_tied's embedding
  // kept tied by ensure_weight_tying or its head untied (output.weight
  // added), a LayerNorm's weight and bias.
  const std::pair<const char*, const char*> cases[] = {{"norms", "llama_gqa"},
                                                       {"tied_head", "llama_tied"},
                                                       {"untied_head", "llama_tied"},
                                                       {"neox_norms", "gpt_neox_sequential"}};
  for (const auto& [variant, base] : cases) {
    INFO("variant ", variant);
    const std::string adapter = std::string("merge/variants/") + variant + "/adapter";
    // Named as the base, so that general.name agrees.
    const fs::path merged = fs::path(FT_BINARY_DIR) / "gguf_merged" / variant / base;
    fs::remove_all(merged);
    MergeCommand merge;
    merge.model = kFixtures + "/" + base;
    merge.adapter = kFixtures + "/" + adapter;
    merge.out = merged.string();
    std::ostringstream log;
    merge_adapter(merge, log);
    const std::string direct = fresh_file(std::string("direct_") + variant);
    const std::string from_merged = fresh_file(std::string("from_merged_") + variant);
    export_gguf(command_for(base, "tokenizer/tokenizer.model", adapter, GgmlType::f16, direct), log);
    GgufExportCommand command = command_for(base, "tokenizer/tokenizer.model", "", GgmlType::f16, from_merged);
    command.model = merged.string();
    export_gguf(command, log);
    const GgufFile ours(direct);
    check_equal_to_reference(ours, GgufFile(from_merged));
    const auto& tensors = ours.tensors();
    const bool has_output = std::any_of(tensors.begin(), tensors.end(), [](const auto& t) { return t.name == "output.weight"; });
    // llama_tied's head stays the embedding unless PEFT untied it.
    if (std::string(base) == "llama_tied") CHECK(has_output == (std::string(variant) == "untied_head"));
  }
  // A sequence classifier's score head has no place in a GGUF language model.
  const std::string out = fresh_file("score");
  std::ostringstream log;
  CHECK_THROWS_WITH_AS(
      export_gguf(command_for("llama_gqa", "tokenizer/tokenizer.model", "merge/variants/score/adapter", GgmlType::f16, out),
                  log),
      (kFixtures + "/merge/variants/score/adapter: the adapter saves \"score.weight\" whole (modules_to_save: a "
                   "reward model's score head), which a GGUF language model has no place for").c_str(), Error);
  CHECK(!fs::exists(out));
}
