#include "model/gguf_names.h"

#include <utility>

namespace ft {
namespace {

// (Hugging Face module, GGUF name); "#" stands for the layer index. The
// .weight / .bias suffix carries over.
using NamePairs = std::pair<const char*, const char*>[];

const NamePairs kLlamaNames = {
    {"model.embed_tokens", "token_embd"},
    {"model.norm", "output_norm"},
    {"lm_head", "output"},
    {"model.layers.#.input_layernorm", "blk.#.attn_norm"},
    {"model.layers.#.self_attn.q_proj", "blk.#.attn_q"},
    {"model.layers.#.self_attn.k_proj", "blk.#.attn_k"},
    {"model.layers.#.self_attn.v_proj", "blk.#.attn_v"},
    {"model.layers.#.self_attn.o_proj", "blk.#.attn_output"},
    {"model.layers.#.post_attention_layernorm", "blk.#.ffn_norm"},
    {"model.layers.#.mlp.gate_proj", "blk.#.ffn_gate"},
    {"model.layers.#.mlp.up_proj", "blk.#.ffn_up"},
    {"model.layers.#.mlp.down_proj", "blk.#.ffn_down"},
    {nullptr, nullptr},
};

const NamePairs kGptNeoxNames = {
    {"gpt_neox.embed_in", "token_embd"},
    {"gpt_neox.final_layer_norm", "output_norm"},
    {"embed_out", "output"},
    {"gpt_neox.layers.#.input_layernorm", "blk.#.attn_norm"},
    {"gpt_neox.layers.#.attention.query_key_value", "blk.#.attn_qkv"},
    {"gpt_neox.layers.#.attention.dense", "blk.#.attn_output"},
    {"gpt_neox.layers.#.post_attention_layernorm", "blk.#.ffn_norm"},
    {"gpt_neox.layers.#.mlp.dense_h_to_4h", "blk.#.ffn_up"},
    {"gpt_neox.layers.#.mlp.dense_4h_to_h", "blk.#.ffn_down"},
    {nullptr, nullptr},
};

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// module matched against pattern, "#" matching a run of digits (returned in layer).
bool matches(const std::string& module, const std::string& pattern, std::string& layer) {
  const size_t hash = pattern.find('#');
  if (hash == std::string::npos) return module == pattern;
  const std::string before = pattern.substr(0, hash), after = pattern.substr(hash + 1);
  if (module.size() <= before.size() + after.size() || module.compare(0, before.size(), before) != 0 ||
      !ends_with(module, after))
    return false;
  layer = module.substr(before.size(), module.size() - before.size() - after.size());
  return layer.find_first_not_of("0123456789") == std::string::npos;
}

}  // namespace

std::string gguf_tensor_name(GgufLayout layout, const std::string& hf_name) {
  std::string suffix;
  for (const char* candidate : {".weight", ".bias"})
    if (ends_with(hf_name, candidate)) suffix = candidate;
  if (suffix.empty()) return "";
  const std::string module = hf_name.substr(0, hf_name.size() - suffix.size());
  const auto* pairs = layout == GgufLayout::llama ? kLlamaNames : kGptNeoxNames;
  for (const auto* pair = pairs; pair->first; ++pair) {
    std::string layer;
    if (!matches(module, pair->first, layer)) continue;
    std::string name = pair->second;
    const size_t hash = name.find('#');
    if (hash != std::string::npos) name.replace(hash, 1, layer);
    return name + suffix;
  }
  return "";
}

}  // namespace ft
