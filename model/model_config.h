// Architecture hyper-parameters read from a Hugging Face config.json, and
// the field readers the families' config readers share (model/families.h
// picks the family's reader by model_type).
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "kernels/dtype.h"
#include "model/model_options.h"

namespace ft {

// The config.json at path as a copy saved beside weights of `dtype` holds
// it: its dtype fields ("torch_dtype", "dtype"; "torch_dtype" where it has
// neither) name that dtype, which transformers loads the weights in.
nlohmann::json config_saved_as(const std::string& path, DType dtype);

// Upper bound of every integer field of config.json (sizes, counts, lengths),
// checked before anything multiplies them: 2^24 is far above any released
// model (vocabularies ~256k, hidden sizes ~16k), and products of two such
// fields stay far inside int64.
inline constexpr int64_t kMaxModelConfigInt = int64_t(1) << 24;

// Rotary scaling as transformers' rope_parameters / rope_scaling describe it
// (modeling_rope_utils.py): "default" (none), "linear" (inv_freq / factor),
// "dynamic" (NTK: a larger base once a sequence exceeds
// max_position_embeddings) or "llama3" (per-frequency bands).
struct RopeScaling {
  std::string type = "default";
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  int64_t original_max_position_embeddings = 0;          // llama3
};

// How config.json says the checkpoint's decoder linears are stored: its
// quantization_config, which transformers writes for a model saved quantised
// by bitsandbytes (and quantization.save_base writes too). none: it has none,
// and each tensor's dtype tells (load_parameter).
struct StoredQuantization {
  QuantizedBase format = QuantizedBase::none;
  bool double_quant = false;  // nf4: bnb_4bit_use_double_quant
  std::string source;         // the config.json, for messages
};

struct ModelConfig {
  std::string model_type;  // its family (model/families.h)
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // defaults to num_attention_heads
  int64_t head_dim = 0;             // defaults to hidden_size / num_attention_heads
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 2048;
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;      // gpt_neox: rotary_emb_base
  double rotary_pct = 1.0;          // share of head_dim that is rotated (gpt_neox: default 0.25)
  float layer_norm_eps = 1e-5f;     // gpt_neox's LayerNorm
  float initializer_range = 0.02f;  // std of transformers' normal init
  bool tie_word_embeddings = false;
  RopeScaling rope_scaling;
  bool attention_bias = false;  // q/k/v (and gpt_neox's query_key_value and dense)
  bool o_proj_bias = false;     // llama: attention_bias; qwen2: q/k/v only
  bool mlp_bias = false;
  int64_t sliding_window = 0;   // mistral's attention window in tokens, 0: none
  std::string hidden_act = "silu";  // gpt_neox: "gelu" and the tanh forms
  bool use_parallel_residual = true;  // gpt_neox: x + attn(ln1(x)) + mlp(ln2(x))
  // t5 (transformers' T5Config names in brackets): hidden_size [d_model],
  // intermediate_size [d_ff], num_hidden_layers [num_layers] counts the
  // encoder's layers, num_attention_heads [num_heads], head_dim [d_kv], which
  // need not be hidden_size / heads, rms_norm_eps [layer_norm_epsilon].
  int64_t num_decoder_layers = 0;            // defaults to num_layers
  int64_t relative_attention_num_buckets = 32;
  int64_t relative_attention_max_distance = 128;
  bool gated_ffn = false;                    // feed_forward_proj "gated-gelu" (v1.1, FLAN-T5) vs "relu" (v1.0)
  bool scale_decoder_outputs = false;        // v1.0: decoder output times d_model^-0.5 before the head
  int64_t decoder_start_token_id = 0;        // the decoder's first input token
  StoredQuantization stored_quantization;

  // Rotated features per head: int(head_dim * rotary_pct), as HF computes it.
  int64_t rotary_dim() const { return int64_t(double(head_dim) * rotary_pct); }
  // The longest sequence the model takes: max_position_embeddings, except
  // under dynamic NTK rope, which rescales its base for each longer sequence
  // (as transformers runs it): then only positions' i32 range bounds it.
  int64_t position_limit() const {
    return rope_scaling.type == "dynamic" ? int64_t(INT32_MAX) : max_position_embeddings;
  }
};

// config.json's fields, each checked for its type and range (an Error names
// source and the field). optional_value: T is bool, int64_t (magnitude at
// most kMaxModelConfigInt), float, double (finite in T) or std::string; null
// or absent gives fallback.
int64_t required_int(const nlohmann::json& config, const char* field, const std::string& source);
template <class T>
T optional_value(const nlohmann::json& config, const char* field, T fallback, const std::string& source);
// Rotary settings (rope_theta, partial_rotary_factor, rope_scaling /
// rope_parameters) in every spelling a released config.json uses.
void read_rope(const nlohmann::json& config, ModelConfig& result, const std::string& source);

// config.json's quantization_config, read into result.stored_quantization:
// bitsandbytes' LLM.int8 (load_in_8bit) or 4-bit NF4 (load_in_4bit,
// bnb_4bit_quant_type "nf4", bnb_4bit_quant_storage "uint8"); anything else
// (another quant_method, FP4, another storage dtype, fp16 int8 weights) is an
// Error naming source, the field and the supported values.
void read_quantization_config(const nlohmann::json& config, ModelConfig& result, const std::string& source);

// A decoder-only model's shared fields: hidden_size, intermediate_size,
// num_hidden_layers, num_attention_heads, vocab_size (required),
// max_position_embeddings, initializer_range, tie_word_embeddings.
void read_decoder_fields(const nlohmann::json& config, ModelConfig& result, const std::string& source);
// What every decoder-only config satisfies once its family's fields are read.
void check_decoder_fields(const ModelConfig& result, const std::string& source);

}  // namespace ft
