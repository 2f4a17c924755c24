// A PEFT LoRA adapter opened for folding into a checkpoint's original
// weights: W + scaling * B A, summed in f32 and rounded once to the output
// dtype (PEFT's merge_and_unload()). Shared by `finetune merge` (a Hugging
// Face folder) and `finetune export --gguf`. A base saved quantised (INT8 or
// NF4 as bitsandbytes saves them: a QLoRA base such as unsloth's
// "-bnb-4bit" checkpoints) merges into its weights dequantised as the
// kernels dequantise them (bitsandbytes' arithmetic), as unsloth's
// merged_16bit does; PEFT's own merge would quantise the sum again.
#pragma once
#include <map>
#include <set>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "model/peft_adapter.h"
#include "model/quantized_format.h"
#include "model/safetensors.h"

namespace ft {

// Refuses a base with any tensor that is not F32, BF16 or F16 (an INT8 or NF4
// base saved by a run or by bitsandbytes), naming the tensor and its file,
// then `needs` (what the command wanted instead).
void check_float_base(const Checkpoint& base, const std::string& needs);

// Refuses a base whose weights are not the model its config.json describes
// (config_path): a tensor the model has that the checkpoint lacks, or one of
// another shape, named as training would name it (a merged folder or a GGUF
// that says one model and holds another loads nowhere). Returns the model's
// tensor names, for a check of extra tensors.
std::set<std::string> check_base_matches_config(const Checkpoint& base, const std::string& config_path);

// The tensors of base that the model config describes (with the output head
// head) does not read: neither its parameters, a tied copy of one (a tied
// lm_head, T5's embed_tokens: LanguageModel::weightless_modules), a quantised
// weight's constants, nor a recomputed buffer. transformers warns about them
// ("Some weights of the model checkpoint were not used").
std::vector<std::string> unused_tensors(const Checkpoint& base, const ModelConfig& config, OutputHead head);

class AdapterMerge {
 public:
  // Reads folder's adapter_config.json and adapter_model.safetensors (its
  // checksum verified) and checks them against base, whose model config_path
  // describes: every adapted module must be an [out, in] weight of base that
  // A [r, in] and B [out, r] fit, and every tensor of base floating or a
  // weight of the model saved INT8 or NF4 (with its constants beside it);
  // a DoRA magnitude must be [out].
  // Each failure is an Error naming the file.
  AdapterMerge(const std::string& folder, const Checkpoint& base, const std::string& config_path);

  const PeftAdapterConfig& config() const { return config_; }
  const std::map<std::string, LoraPair>& pairs() const { return pairs_; }
  // modules_to_save's tensors (a reward model's score.weight), saved whole:
  // each replaces the base's tensor of that name, or adds one (added_names).
  const std::map<std::string, const SafetensorsEntry*>& saved() const { return saved_; }
  const std::vector<std::string>& added_names() const { return added_; }
  // Tensor `name` (the base's or an added one) in dtype: the saved module's,
  // or the base's (dequantised where saved quantised) with scaling * B A
  // added where the adapter targets it (and, for DoRA, each row rescaled to
  // its magnitude: PEFT's merge).
  Tensor tensor(CpuBackend& be, const std::string& name, DType dtype) const;
  // The base's tensors a merged checkpoint holds, in its order: all but the
  // constants of its quantised weights (their absmax, scales, quant state).
  std::vector<std::string> base_names() const;
  // A base tensor's shape: [out, in] for a weight saved quantised.
  Shape base_shape(const std::string& name) const;
  // Whether the base holds weights saved quantised, and then the dtype of its
  // floating weights (the embeddings': the merged model's dtype).
  bool dequantises() const { return !quantized_.empty(); }
  DType float_dtype() const { return float_dtype_; }

 private:
  struct StoredWeight {
    const QuantizedFormat* format;
    Shape shape;  // [out, in]
  };
  // Reads which of base's weights are saved quantised and which tensors are their constants.
  void read_base_layout(const std::string& config_path);
  // Each base_layer_copies() tensor must be a copy of the base's weight it names.
  void check_base_layer_copies() const;
  // The weight `name` of the base as f32 [out, in].
  Tensor base_weight(CpuBackend& be, const std::string& name) const;
  // DoRA: weight's rows scaled to the norms magnitude [out] gives them.
  void apply_dora_magnitude(CpuBackend& be, Tensor& weight, const SafetensorsEntry& magnitude) const;

  const Checkpoint& base_;
  std::map<std::string, StoredWeight> quantized_;
  std::set<std::string> constants_;
  DType float_dtype_ = DType::f32;
  PeftAdapterConfig config_;
  SafetensorsFile file_;
  std::map<std::string, LoraPair> pairs_;
  std::map<std::string, const SafetensorsEntry*> saved_;
  std::vector<std::string> added_;
};

// Whether config_path ties lm_head to the embedding and adapter's
// modules_to_save adds the untied head (PEFT's modules_to_save=["lm_head"]
// over a tied base): the merged head is then a tensor of its own, and the
// merged config.json says tie_word_embeddings false (transformers infers
// that from the differing tensors only with a warning; the loader here
// refuses a tied config beside a differing head). An adapter that replaces
// a tied base's embedding is an Error naming its tensor.
bool adds_untied_head(const AdapterMerge& adapter, const std::string& config_path);

}  // namespace ft
