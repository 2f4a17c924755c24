// What every decoder-only architecture shares: its parameters (base weights
// under their Hugging Face names, LoRA adapters beside them), how linears are
// built (dense or LLM.int8(), wrapped in LoRA when targeted), loading,
// initialisation, the trainable set, and the token upload and LM-head loss
// every step starts and ends with. An architecture adds its layers and its
// forward/backward (llama.h, gpt_neox.h).
#pragma once
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "model/linear.h"
#include "model/model_config.h"
#include "model/model_options.h"
#include "model/parameter.h"

namespace ft {

class Checkpoint;
class LoraLinear;

// A norm's output [N, C] (activation dtype) and the f32 statistics [N] its
// backward reads (mean: LayerNorm only).
struct NormOutput {
  Tensor out, mean, rstd;
};

class CausalLM {
 public:
  virtual ~CausalLM();

  // Copies every base weight from the checkpoint (converting dtype, or
  // quantising to int8); a missing tensor or a shape mismatch is an Error
  // naming it.
  void load(const Checkpoint& checkpoint);
  // Base weights as transformers initialises a new model (normal with
  // std = initializer_range, norms 1), from a seed: for pretraining, or an
  // INT8 base (quantised from those values) to benchmark without weights.
  void init_random(uint64_t seed);
  // Adapters as PEFT's init_lora_weights=True: A kaiming-uniform, B zeros.
  void init_adapters(uint64_t seed);
  // Seeds this step's LoRA dropout masks (each adapter gets its own).
  void set_dropout_seed(uint64_t seed);

  // Gives a gradient buffer (zeroed) to every parameter or adapter whose name
  // satisfies the predicate; the others stay frozen (no buffer at all).
  void set_trainable(const std::function<bool(const std::string&)>& is_trainable);
  void zero_grads();

  // Mean cross-entropy over counted tokens. input_ids and targets are host
  // i32 [B, T]; targets[b, t] is the token position t should predict (-100:
  // ignored). Keeps the logits [B*T, vocab] for last_logits(), whole even
  // with loss_chunk_tokens: generation reads any row of them. An eval forward
  // frees each layer's activations as soon as the layer is done.
  float forward(const Tensor& input_ids, const Tensor& targets);
  // Same loss, then gradients of grad_scale * loss are added to every
  // trainable parameter's grad. Nothing of the step stays allocated.
  float forward_backward(const Tensor& input_ids, const Tensor& targets, float grad_scale = 1.0f);

  const Tensor& last_logits() const { return last_logits_; }
  const ModelConfig& config() const { return config_; }
  Backend& backend() { return backend_; }
  std::deque<Parameter>& parameters() { return parameters_; }  // base weights, HF names
  std::deque<Parameter>& adapters() { return adapters_; }      // e.g. model.layers.0.self_attn.q_proj.lora_A.weight
  const ModelOptions& options() const { return options_; }
  Parameter& parameter(const std::string& name);

 protected:
  // One step of the architecture: the loss, and when grad_scale is given the
  // backward pass too (skipped when no token counts).
  virtual float run_step(const Tensor& input_ids, const Tensor& targets, const float* grad_scale) = 0;
  CausalLM(const ModelConfig& config, Backend& backend, const ModelOptions& options);
  Parameter& add_parameter(const std::string& name, const Shape& shape, DType dtype);
  // A decoder linear named module (e.g. model.layers.0.self_attn.q_proj):
  // dense or LLM.int8(), wrapped in LoRA when a target matches it. With
  // bias, module + ".bias" [out_features] is a parameter too (weight_dtype,
  // also over an int8 weight).
  std::unique_ptr<Linear> make_linear(const std::string& module, int64_t out_features, int64_t in_features,
                                      bool bias = false);
  // Call at the end of a constructor: a LoRA target that matched no module is
  // an Error listing the architecture's linear module names.
  void check_lora_targets(const std::string& module_names) const;
  // Dropout in the adapters is on while training only.
  void set_training(bool training);

  // One step's tokens on the backend: ids, targets and positions (0..T-1 in
  // every row) as i32 [B*T], from host i32 [B, T] input_ids and targets, and
  // how many targets count (are not -100).
  struct StepTokens {
    int64_t batch = 0, seq = 0, counted = 0;
    Tensor ids, targets, positions;
  };
  StepTokens upload_step_tokens(const Tensor& input_ids, const Tensor& targets);

  // What one layer's backward reads from its forward; each architecture
  // derives its own.
  struct SavedActivations {
    virtual ~SavedActivations() = default;
  };
  // Layer `index` of the decoder from its input x [B, T, C], returning what
  // its backward needs. On entry `norm` holds x under the layer's input norm,
  // or is empty for the layer to compute it (layer 0, a recomputation). With
  // out, the layer writes its output [B, T, C] there and, in the same fused
  // op as the residual add that makes it, its norm under the next norm (the
  // next layer's input norm; the final norm after the last layer) into
  // `norm`. A recomputation passes no out: the output is already kept, so
  // the layer stops at what its backward reads, skipping the projections
  // whose outputs only make the layer output (e.g. the MLP's last one).
  // Called again from backward_decoder when the layer was checkpointed, so it
  // must depend on nothing but its arguments, the weights and the step's
  // dropout seeds.
  virtual std::unique_ptr<SavedActivations> forward_layer(size_t index, const Tensor& x, NormOutput& norm,
                                                          Tensor* out, const Tensor& positions) = 0;
  // On entry dresidual holds d(loss)/d(layer output); on exit d(loss)/d(layer input).
  virtual void backward_layer(size_t index, SavedActivations& saved, Tensor& dresidual, const Tensor& x,
                              const Tensor& positions) = 0;

  // One step through the decoder stack.
  struct DecoderStep {
    StepTokens tokens;
    std::vector<Tensor> residuals;  // residuals[i]: input of layer i; back(): output of the last
    std::vector<std::unique_ptr<SavedActivations>> layers;  // null: not kept (eval, or checkpointed)
    NormOutput final_norm;  // residuals.back() under the final norm, made by the last layer
  };
  // Uploads the tokens, embeds them and runs every layer, the last one
  // leaving the final norm's output in step.final_norm. A training step
  // keeps each layer's activations unless options_.activation_checkpointing
  // says per_layer; an eval step (training false) keeps none.
  void forward_decoder(DecoderStep& step, const Tensor& input_ids, const Tensor& targets,
                       const Parameter& embedding, bool training);
  // From dresidual [B, T, C] = d(loss)/d(residuals.back()): every layer's
  // backward, last to first (rerunning the forward of a checkpointed layer
  // first), freeing each layer's tensors as it goes; then the embedding's
  // gradient when it trains.
  void backward_decoder(DecoderStep& step, Tensor& dresidual, Parameter& embedding);

  // The end of every forward: logits = hidden [N, C] lm_head^T and the mean
  // cross-entropy over counted tokens (returned). Eval (dhidden null): the
  // logits [N, V] are kept for last_logits(). Logits, the loss and dlogits
  // are f32 whatever hidden's dtype (the activation dtype); dlogits is
  // rounded to hidden's dtype for the two gradient products. Training: logits are made
  // options_.loss_chunk_tokens rows at a time, each chunk overwritten by its
  // d(grad_scale * loss)/d(logits) and consumed at once -- dhidden [N, C]
  // (hidden's dtype, allocated here unless no token counts) = dlogits lm_head, and
  // lm_head.grad += dlogits^T hidden when it trains -- so no [N, V] tensor
  // exists in a training step with chunking.
  float lm_head_loss(const Tensor& hidden, Parameter& lm_head, const StepTokens& tokens, Tensor* dhidden,
                     float grad_scale);

  ModelConfig config_;
  Backend& backend_;
  ModelOptions options_;
  std::deque<Parameter> parameters_;  // deque: stable addresses for the layers' references
  std::deque<Parameter> adapters_;
  std::vector<LoraLinear*> lora_layers_;
  Tensor last_logits_;
};

// The architecture named by config.model_type.
std::unique_ptr<CausalLM> make_causal_lm(const ModelConfig& config, Backend& backend, const ModelOptions& options);

}  // namespace ft
