// Architecture hyper-parameters read from a Hugging Face config.json.
#pragma once
#include <cstdint>
#include <string>

namespace ft {

struct ModelConfig {
  std::string model_type;  // "llama" (more architectures come later)
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // defaults to num_attention_heads
  int64_t head_dim = 0;             // defaults to hidden_size / num_attention_heads
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 2048;
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;
  float initializer_range = 0.02f;  // std of transformers' normal init
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  bool mlp_bias = false;
  std::string hidden_act = "silu";

  // Reads and validates path (a config.json). Missing required fields, wrong
  // types and unsupported settings are Errors naming the file and the field.
  static ModelConfig from_json_file(const std::string& path);
  // Same, from JSON text; source names it in messages.
  static ModelConfig from_json_text(const std::string& text, const std::string& source);
};

}  // namespace ft
