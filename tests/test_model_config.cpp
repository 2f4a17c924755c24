// Reading and validating Hugging Face config.json files.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/error.h"
#include "model/families.h"
#include "model/model_config.h"

using namespace ft;
using nlohmann::json;

namespace {

const char* kSource = "models/tiny/config.json";

// A TinyLlama-shaped config with grouped-query attention (32 query heads share 4 key/value heads).
json gqa_config() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
    "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
    "rope_scaling": null, "tie_word_embeddings": false, "hidden_act": "silu",
    "attention_bias": false, "torch_dtype": "bfloat16"})");
}

// The message of the Error parsing config throws ("" when it throws none).
std::string error_of(const json& config) {
  try {
    parse_model_config(config.dump(), kSource);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

// Parsing config fails with a message naming the source and containing phrase.
void check_rejected(const json& config, const std::string& phrase) {
  std::string message = error_of(config);
  CAPTURE(message);
  CHECK(message.find(kSource) != std::string::npos);
  CHECK(message.find(phrase) != std::string::npos);
}

json with(json config, const std::string& field, const json& value) {
  config[field] = value;
  return config;
}

}  // namespace

TEST_CASE("parses a llama config with grouped-query attention") {
  ModelConfig config = parse_model_config(gqa_config().dump(), kSource);
  CHECK(config.model_type == "llama");
  CHECK(config.hidden_size == 2048);
  CHECK(config.intermediate_size == 5632);
  CHECK(config.num_hidden_layers == 22);
  CHECK(config.num_attention_heads == 32);
  CHECK(config.num_key_value_heads == 4);
  CHECK(config.head_dim == 64);
  CHECK(config.vocab_size == 32000);
  CHECK(config.max_position_embeddings == 2048);
  CHECK(config.rms_norm_eps == 1e-5f);
  CHECK(config.rope_theta == 10000.0f);
  CHECK(!config.tie_word_embeddings);
  CHECK(config.hidden_act == "silu");
}

TEST_CASE("optional fields take their defaults") {
  json minimal = {{"model_type", "llama"}, {"hidden_size", 64},       {"intermediate_size", 128},
                  {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"vocab_size", 100}};
  ModelConfig config = parse_model_config(minimal.dump(), kSource);
  CHECK(config.num_key_value_heads == 4);  // no GQA unless asked for
  CHECK(config.head_dim == 16);            // hidden_size / num_attention_heads
  CHECK(config.max_position_embeddings == 2048);
  CHECK(config.rms_norm_eps == 1e-6f);
  CHECK(config.rope_theta == 10000.0f);
  CHECK(!config.tie_word_embeddings);
  CHECK(!config.attention_bias);
  CHECK(!config.mlp_bias);
  CHECK(config.hidden_act == "silu");
  // null means "use the default", as transformers writes it.
  CHECK(parse_model_config(with(minimal, "num_key_value_heads", nullptr).dump(), kSource).num_key_value_heads == 4);
  // An explicit head_dim wins over the derived one.
  CHECK(parse_model_config(with(minimal, "head_dim", 32).dump(), kSource).head_dim == 32);
}

TEST_CASE("reads from a file and names it in errors") {
  std::string pattern = std::string(FT_BINARY_DIR) + "/model_config_test_XXXXXX";
  REQUIRE(mkdtemp(pattern.data()) != nullptr);
  std::string path = pattern + "/config.json";
  std::ofstream(path) << gqa_config().dump(2);
  CHECK(read_model_config(path).num_key_value_heads == 4);
  std::ofstream(path) << with(gqa_config(), "model_type", "gpt2").dump();
  std::string message;
  try {
    read_model_config(path);
  } catch (const Error& error) {
    message = error.what();
  }
  CHECK(message == path + ": model_type \"gpt2\" is not supported (supported model_type values: \"llama\", "
                          "\"qwen2\", \"mistral\", \"gpt_neox\", \"t5\")");
  std::filesystem::remove_all(pattern);
  CHECK_THROWS_WITH_AS(read_model_config(path), doctest::Contains("cannot open model config"), Error);
}

TEST_CASE("each missing required field is named") {
  for (const char* field : {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size"}) {
    CAPTURE(field);
    json config = gqa_config();
    config.erase(field);
    check_rejected(config, std::string("missing required field \"") + field + "\"");
  }
  json config = gqa_config();
  config.erase("model_type");
  check_rejected(config, "missing required field \"model_type\"");
}

TEST_CASE("fields of the wrong type are refused") {
  check_rejected(with(gqa_config(), "hidden_size", "2048"), "field \"hidden_size\" must be a positive integer");
  check_rejected(with(gqa_config(), "hidden_size", 2048.5), "field \"hidden_size\" must be a positive integer");
  check_rejected(with(gqa_config(), "vocab_size", 0), "field \"vocab_size\" must be a positive integer");
  check_rejected(with(gqa_config(), "num_hidden_layers", -2), "field \"num_hidden_layers\" must be a positive integer");
  check_rejected(with(gqa_config(), "model_type", 7), "missing required field \"model_type\"");
  // Types nlohmann would otherwise convert silently (true -> 1, 4.5 -> 4).
  check_rejected(with(gqa_config(), "num_key_value_heads", true), "field \"num_key_value_heads\" has the wrong type");
  check_rejected(with(gqa_config(), "num_key_value_heads", 4.5), "field \"num_key_value_heads\" has the wrong type");
  check_rejected(with(gqa_config(), "rms_norm_eps", "1e-5"), "field \"rms_norm_eps\" has the wrong type");
  check_rejected(with(gqa_config(), "rope_theta", false), "field \"rope_theta\" has the wrong type");
  check_rejected(with(gqa_config(), "tie_word_embeddings", 0), "field \"tie_word_embeddings\" has the wrong type");
  check_rejected(with(gqa_config(), "hidden_act", 1), "field \"hidden_act\" has the wrong type");
  check_rejected(with(gqa_config(), "max_position_embeddings", 0), "max_position_embeddings must be positive");
  check_rejected(with(gqa_config(), "rms_norm_eps", 0), "rms_norm_eps and rope_theta must be positive");
  // rope_theta as an integer is common in real configs (e.g. 500000).
  CHECK(parse_model_config(with(gqa_config(), "rope_theta", 500000).dump(), kSource).rope_theta == 500000.0f);
}

TEST_CASE("text that is not a JSON object is refused") {
  CHECK_THROWS_WITH_AS(parse_model_config("{\"model_type\": ", kSource), doctest::Contains("not valid JSON"),
                       Error);
  CHECK_THROWS_WITH_AS(parse_model_config("[1, 2]", kSource), doctest::Contains("expected a JSON object"), Error);
}

TEST_CASE("unsupported settings are refused") {
  check_rejected(with(gqa_config(), "model_type", "gemma"), "model_type \"gemma\" is not supported");
  check_rejected(with(gqa_config(), "hidden_act", "gelu"), "hidden_act \"gelu\" is not supported");
  check_rejected(with(gqa_config(), "rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}),
                 "rope_scaling.rope_type \"yarn\" is not supported (expected \"default\", \"linear\", \"dynamic\" or "
                 "\"llama3\")");
  check_rejected(with(gqa_config(), "rope_scaling", {{"type", "longrope"}}), "rope_scaling.type \"longrope\"");
  check_rejected(with(gqa_config(), "rope_scaling", {{"type", "linear"}}), "rope_scaling.factor is required");
  check_rejected(with(gqa_config(), "rope_scaling", {{"rope_type", "linear"}, {"factor", -2.0}}),
                 "rope_scaling.factor must be positive");
  check_rejected(with(gqa_config(), "rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}}),
                 "rope_scaling.high_freq_factor is required");
  // Qwen2's window applies from max_window_layers on (transformers' layer_types): refused where a layer slides.
  const json sliding_qwen = with(with(gqa_config(), "model_type", "qwen2"), "use_sliding_window", true);
  check_rejected(with(sliding_qwen, "max_window_layers", 1),
                 "use_sliding_window true with max_window_layers 1 below num_hidden_layers 22: layers attending within "
                 "sliding_window are not supported for qwen2");
  CHECK(parse_model_config(sliding_qwen.dump(), kSource).sliding_window == 0);  // 28 >= 22 layers: all attend fully
  check_rejected(with(with(gqa_config(), "model_type", "qwen2"), "layer_types",
                      {"full_attention", "sliding_attention"}),
                 "layer_types holds \"sliding_attention\": layers attending");
  check_rejected(with(with(gqa_config(), "model_type", "mistral"), "sliding_window", 0),
                 "sliding_window must be a positive integer or null");
}

TEST_CASE("rope scaling in every spelling a released config.json uses") {
  // Llama-3.1-8B's config.json (transformers 4.43): top-level rope_theta, rope_scaling with rope_type.
  json llama31 = with(gqa_config(), "rope_theta", 500000.0);
  llama31["rope_scaling"] = {{"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                             {"original_max_position_embeddings", 8192}, {"rope_type", "llama3"}};
  ModelConfig config = parse_model_config(llama31.dump(), kSource);
  CHECK(config.rope_theta == 500000.0f);
  CHECK(config.rope_scaling.type == "llama3");
  CHECK(config.rope_scaling.factor == 8.0);
  CHECK(config.rope_scaling.original_max_position_embeddings == 8192);
  // Older files: {"type": "linear"}; rope_type wins when both are given.
  config = parse_model_config(with(gqa_config(), "rope_scaling", {{"type", "linear"}, {"factor", 2.0}}).dump(),
                                       kSource);
  CHECK((config.rope_scaling.type == "linear" && config.rope_scaling.factor == 2.0));
  config = parse_model_config(
      with(gqa_config(), "rope_scaling", {{"type", "yarn"}, {"rope_type", "dynamic"}, {"factor", 2.0}}).dump(), kSource);
  CHECK(config.rope_scaling.type == "dynamic");
  // transformers 5: rope_parameters, whose rope_theta beats the top-level one; a non-empty rope_scaling beats it.
  json v5 = with(gqa_config(), "rope_scaling", nullptr);
  v5["rope_parameters"] = {{"rope_type", "linear"}, {"rope_theta", 1000.0}, {"factor", 4.0}};
  config = parse_model_config(v5.dump(), kSource);
  CHECK((config.rope_scaling.type == "linear" && config.rope_scaling.factor == 4.0 && config.rope_theta == 1000.0f));
  v5["rope_scaling"] = {{"type", "dynamic"}, {"factor", 3.0}};
  config = parse_model_config(v5.dump(), kSource);
  CHECK((config.rope_scaling.type == "dynamic" && config.rope_scaling.factor == 3.0 && config.rope_theta == 10000.0f));
  // llama3 without original_max_position_embeddings: max_position_embeddings; a top-level one wins.
  json bare = with(gqa_config(), "rope_scaling",
                   {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}});
  CHECK(parse_model_config(bare.dump(), kSource).rope_scaling.original_max_position_embeddings == 2048);
  CHECK(parse_model_config(with(bare, "original_max_position_embeddings", 4096).dump(), kSource)
            .rope_scaling.original_max_position_embeddings == 4096);
}

TEST_CASE("qwen2 and mistral configure the llama layer") {
  json qwen = with(gqa_config(), "model_type", "qwen2");
  qwen["attention_bias"] = false;  // Qwen2Attention ignores it: q/k/v always have biases
  ModelConfig config = parse_model_config(qwen.dump(), kSource);
  CHECK((config.attention_bias && !config.o_proj_bias && !config.mlp_bias && config.sliding_window == 0));
  config = parse_model_config(with(qwen, "use_sliding_window", false).dump(), kSource);
  CHECK(config.sliding_window == 0);
  json mistral = with(with(gqa_config(), "model_type", "mistral"), "sliding_window", 4096);
  config = parse_model_config(mistral.dump(), kSource);
  CHECK((config.sliding_window == 4096 && !config.attention_bias && !config.o_proj_bias));
  CHECK(parse_model_config(with(mistral, "sliding_window", nullptr).dump(), kSource).sliding_window == 0);
  // Absent fields take MistralConfig's and Qwen2Config's defaults: a 4096 window, 131072 and 32768 positions.
  json bare_mistral = mistral, bare_qwen = qwen;
  bare_mistral.erase("sliding_window");
  bare_mistral.erase("max_position_embeddings");
  bare_qwen.erase("max_position_embeddings");
  config = parse_model_config(bare_mistral.dump(), kSource);
  CHECK((config.sliding_window == 4096 && config.max_position_embeddings == 131072));
  CHECK(parse_model_config(bare_qwen.dump(), kSource).max_position_embeddings == 32768);
  CHECK(parse_model_config(mistral.dump(), kSource).max_position_embeddings ==
        mistral["max_position_embeddings"].get<int64_t>());
  json llama = with(with(gqa_config(), "attention_bias", true), "mlp_bias", true);
  config = parse_model_config(llama.dump(), kSource);
  CHECK((config.attention_bias && config.o_proj_bias && config.mlp_bias));
}

TEST_CASE("head counts that do not divide are refused") {
  check_rejected(with(gqa_config(), "num_key_value_heads", 5),
                 "num_attention_heads (32) must be a multiple of num_key_value_heads (5)");
  check_rejected(with(gqa_config(), "num_key_value_heads", 0), "must be a multiple of num_key_value_heads (0)");
  // 2048 / 24 is not whole: deriving head_dim would silently truncate it.
  check_rejected(with(with(gqa_config(), "num_attention_heads", 24), "num_key_value_heads", 4),
                 "hidden_size (2048) must be a multiple of num_attention_heads (24)");
  check_rejected(with(gqa_config(), "head_dim", 63), "head_dim must be a positive even number");
}

TEST_CASE("transformers 5 rope_parameters carry rope_theta") {
  ModelConfig config = read_model_config(std::string(FT_FIXTURES_DIR) + "/llama_tied/config.json");
  CHECK(config.rope_theta == 500000.0f);
  CHECK_THROWS_WITH_AS(parse_model_config(R"({"model_type": "llama", "hidden_size": 64,
      "intermediate_size": 88, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 320,
      "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0}})", "cfg.json"),
      doctest::Contains("cfg.json: rope_parameters.rope_type \"yarn\" is not supported"), Error);
}
