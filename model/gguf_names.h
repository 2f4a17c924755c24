// How llama.cpp names a family's architecture, tensors and layout in GGUF
// (gguf-py's constants.py and tensor_mapping.py, convert_hf_to_gguf.py).
// Each family of model/families.cpp points at one GgufArchitecture, or at
// none when llama.cpp cannot run it.
#pragma once
#include <string>

namespace ft {

// Which tensor names and hyper-parameter keys a family's GGUF uses.
enum class GgufLayout {
  llama,     // RMSNorm, q/k/v/o projections, gated MLP (Llama, Mistral, Qwen2)
  gpt_neox,  // LayerNorm, one fused query_key_value, dense MLP, parallel residual
};

struct GgufArchitecture {
  const char* name;  // general.architecture, e.g. "gptneox"
  GgufLayout layout;
  // llama.cpp's llama architecture rotates adjacent feature pairs, transformers rotates
  // the two halves of each head: convert_hf_to_gguf.py reorders the rows of
  // q_proj and k_proj (weights and biases) to match. Qwen2 runs in llama.cpp
  // with the halves layout (NEOX rope) and keeps the rows as they are.
  bool permute_rope_rows;
  // Llama-3's rope_type "llama3" as a rope_freqs tensor of per-frequency
  // divisors (only llama.cpp's llama graph reads one).
  bool rope_freqs;
};

// llama.cpp's tokenizer names that are spelled like model_type values, so
// they are defined in model/families.cpp, the one file that spells those:
// tokenizer.ggml.model of a SentencePiece vocabulary, and the pre-tokenizers
// (tokenizer.ggml.pre) of byte-level BPEs by their Split regex.
extern const char* const kGgufSentencePieceModel;
struct GgufPreTokenizer {
  const char* split_regex;
  const char* name;
};
extern const GgufPreTokenizer kGgufSplitPreTokenizers[2];

// The GGUF name of a Hugging Face tensor name ("model.layers.3.mlp.up_proj.weight"
// -> "blk.3.ffn_up.weight"); "" when layout has none.
std::string gguf_tensor_name(GgufLayout layout, const std::string& hf_name);

}  // namespace ft
