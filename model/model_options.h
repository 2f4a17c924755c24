// How an architecture builds its layers: storage dtype, the frozen base's
// quantized format (LLM.int8() or NF4), and PEFT-style LoRA adapters. Set by
// the trainer from its config; the model knows nothing of YAML.
#pragma once
#include <optional>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/dtype.h"

namespace ft {

class TensorParallelGroup;

// The format every decoder linear of the frozen base is quantized in
// (quantization.mode); none: every weight dense (ModelOptions::weight_dtype).
enum class QuantizedBase { int8, nf4, none };

// Every choice, the most faithful first (16-bit, 8-bit, 4-bit): the order
// the planner prefers them in.
inline constexpr QuantizedBase kQuantizedBases[] = {QuantizedBase::none, QuantizedBase::int8, QuantizedBase::nf4};

// LoRA adapters with PEFT's LoraConfig names and defaults, the one description
// used by the YAML config (lora:), the model and PEFT adapter files.
// How new adapters start, PEFT's init_lora_weights: true (A kaiming-uniform
// as nn.Linear's default, B zero), "gaussian" (A normal with std 1 / r, B
// zero), false (A and B both as nn.Linear's default: the adapter is not a
// no-op at the first step; PEFT keeps it for debugging).
enum class LoraInit { kaiming_uniform, gaussian, random };

struct LoraOptions {
  int64_t r = 8;
  double lora_alpha = 8.0;  // scaling = lora_alpha / r (lora_alpha / sqrt(r) with use_rslora)
  double lora_dropout = 0.0;
  // Which modules carry an adapter, PEFT's fields (lora_targets_module,
  // model/lora_pattern.h). target_modules: names, each matching a module so
  // called or ending in "." + it; empty: PEFT's default for the architecture
  // (Llama: q_proj, v_proj; GPT-NeoX: query_key_value), unless
  // target_modules_regex is set: PEFT's target_modules given as one string,
  // a regular expression the whole module name must match. exclude_modules
  // and exclude_modules_regex: the same two forms, for modules left out
  // whatever the targets say. layers_to_transform: with target names, only
  // the modules of these layer indexes (empty: every layer), the index read
  // after one of layers_pattern's names (empty: the first dotted name
  // followed by a number).
  std::vector<std::string> target_modules;
  std::string target_modules_regex = {};
  std::vector<std::string> exclude_modules = {};
  std::string exclude_modules_regex = {};
  std::vector<int64_t> layers_to_transform = {};
  std::vector<std::string> layers_pattern = {};
  bool use_rslora = false;
  LoraInit init_lora_weights = LoraInit::kaiming_uniform;
  // DoRA (PEFT's use_dora): each adapted linear also trains a magnitude m
  // [out], and y = m / ||W + scaling B A||_row * (x W^T + scaling x A^T B^T)
  // + bias (model/lora_linear.h).
  bool use_dora = false;
  // PEFT's rank_pattern and alpha_pattern: regular expressions over full
  // module names (model.layers.0.self_attn.q_proj) giving a module its own r
  // or lora_alpha. Kept in the order read, as PEFT tries a dict's keys in
  // insertion order and the first match wins (module_lora, model/lora_pattern.h).
  std::vector<std::pair<std::string, int64_t>> rank_pattern = {};
  std::vector<std::pair<std::string, double>> alpha_pattern = {};
};

// What a training step keeps of each decoder layer between forward and backward.
//   none:      everything its backward reads (L layers' activations at once).
//   per_layer: only its input, the residual stream [B, T, C]; backward reruns
//              the layer's forward just before its backward (same ops, same
//              dropout seeds, so the same bits) for one layer's activations
//              at a time, at the cost of a second forward.
enum class ActivationCheckpointing { none, per_layer };

// A pipeline stage's share of the decoder: layers [first_layer, end_layer).
// end_layer 0 stands for every layer (one stage holding the whole model).
struct LayerRange {
  int64_t first_layer = 0, end_layer = 0;
};

// A one-output head over the final hidden states (model/output_head.h).
enum class OutputHead { none, score, value };

struct ModelOptions {
  DType weight_dtype = DType::f32;  // non-quantised weights (embeddings, norms, lm_head, dense linears)
  // Every activation the decoder allocates (residual stream, checkpointed
  // layer inputs, norm outputs, q/k/v, attention and MLP tensors, and their
  // gradients). bf16 halves their memory; ops still reduce and accumulate in
  // f32, and norm statistics, log-sum-exps, logits and losses stay f32.
  DType activation_dtype = DType::f32;
  // Every decoder linear frozen in LLM.int8() or NF4 (QLoRA, as bitsandbytes
  // stores it), or none.
  QuantizedBase quantized_base = QuantizedBase::none;
  float int8_threshold = 6.0f;      // int8: outlier threshold; 0 disables the 16-bit outlier path
  bool nf4_double_quant = true;     // NF4 absmax double-quantised to 8 bits (bnb_4bit_use_double_quant)
  std::optional<LoraOptions> lora;  // none: no adapters
  // LoRA A and B as the model holds them. f32 unless an optimizer keeps
  // their f32 masters elsewhere (offloaded AdamW state): then bf16 under bf16
  // weights, the copy the adapter computes with anyway.
  DType adapter_dtype = DType::f32;
  ActivationCheckpointing activation_checkpointing = ActivationCheckpointing::none;
  // With per_layer checkpointing: each checkpointed layer input in pinned
  // host memory instead of the device's (model/activation_offload.h), for
  // contexts whose checkpoints alone would fill the device. A GPU's option:
  // on the CPU the checkpoints are in host memory already.
  bool offload_activations = false;
  // Layer streaming (model/layer_stream.h), for an int8 or nf4 base: the
  // quantized tensors of decoder layers [0, num_hidden_layers -
  // resident_layers) live in pinned host memory and pass through
  // stream_slots device buffers; the last resident_layers stay on the device
  // (a forward ends and the backward starts on them, so the copies of the
  // first streamed layers of the backward overlap their compute).
  bool stream_base = false;
  int64_t resident_layers = 0;
  int64_t stream_slots = 2;
  // Training steps compute lm_head logits and cross-entropy this many tokens
  // at a time ([chunk, vocab] f32 instead of [tokens, vocab]); 0: all at once.
  int64_t loss_chunk_tokens = 0;
  // The decoder layers' MLP (and its backward) runs this many tokens at a
  // time, so its [tokens, intermediate_size] tensors exist for one chunk
  // only; the layer then keeps only the MLP's input for the backward, which
  // recomputes the rest chunk by chunk. 0: all tokens at once.
  int64_t mlp_chunk_tokens = 0;
  // NEFTune (transformers' neftune_noise_alpha): a training step adds
  // uniform noise in [-m, m] to the token embeddings' output, m = alpha /
  // sqrt(L * hidden_size) (neftune_noise_magnitude in causal_lm.h); eval
  // and generation add none. 0: off.
  double neftune_noise_alpha = 0.0;
  // A one-output head beside the LM head (model/output_head.h): a reward
  // model's score, PPO's value head. Held by the last stage.
  OutputHead output_head = OutputHead::none;
  // Pipeline parallel: the decoder layers this model holds; the embedding
  // only with layer 0, the final norm and lm_head only with the last layer.
  LayerRange layers;
  // Tensor parallel (model/tensor_parallel.h): this rank's group, whose
  // rank picks the share of every decoder layer the model holds; null (or
  // a group of one) holds them whole.
  TensorParallelGroup* tensor_parallel = nullptr;
};

// PEFT's target_modules shorthand for every linear layer but the output head
// (QLoRA's recipe); alone in target_modules, it is replaced by the adapted
// modules' names once the model is built.
inline constexpr const char* kAllLinear = "all-linear";

// PEFT's target_modules rule: a module matches a target when its name equals
// the target or ends with "." + target.
bool module_matches_target(const std::string& module_name, const std::string& target);

}  // namespace ft
