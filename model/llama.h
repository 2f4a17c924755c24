// The Llama-family decoder (Llama 2/3, TinyLlama, SmolLM, ...) with Hugging
// Face tensor names, written against the op interface only.
//
// Activations of one step live from forward to the end of backward and are
// charged to MemCategory::activations; when a step ends they are all freed.
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

class LlamaModel {
 public:
  // Allocates every weight (uninitialised) and adapter on the backend. A LoRA
  // target that matches no module is an Error.
  LlamaModel(const ModelConfig& config, Backend& backend, const ModelOptions& options = {});
  ~LlamaModel();

  // Copies every base weight from the checkpoint (converting dtype, or
  // quantising to int8); a missing tensor or a shape mismatch is an Error
  // naming it.
  void load(const Checkpoint& checkpoint);
  // Base weights as transformers initialises a new model (normal with
  // std = initializer_range, norms 1), from a seed: for pretraining.
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
  // ignored). Keeps the logits [B*T, vocab] for last_logits().
  float forward(const Tensor& input_ids, const Tensor& targets);
  // Same loss, then gradients of grad_scale * loss are added to every
  // trainable parameter's grad. Nothing of the step stays allocated.
  float forward_backward(const Tensor& input_ids, const Tensor& targets, float grad_scale = 1.0f);

  const Tensor& last_logits() const { return last_logits_; }
  const ModelConfig& config() const { return config_; }
  Backend& backend() { return backend_; }
  std::deque<Parameter>& parameters() { return parameters_; }  // base weights, HF names
  std::deque<Parameter>& adapters() { return adapters_; }      // lora_A/lora_B, e.g. model.layers.0.self_attn.q_proj.lora_A.weight
  const ModelOptions& options() const { return options_; }
  Parameter& parameter(const std::string& name);

 private:
  struct Layer;
  struct LayerActivations;
  struct StepActivations;

  Parameter& add_parameter(const std::string& name, const Shape& shape, DType dtype);
  std::unique_ptr<Linear> make_linear(const std::string& module, int64_t out_features, int64_t in_features);
  void set_training(bool training);
  void forward_layer(Layer& layer, LayerActivations& saved, const Tensor& x, Tensor& out, const Tensor& positions);
  void backward_layer(Layer& layer, LayerActivations& saved, Tensor& dresidual, const Tensor& x,
                      const Tensor& positions);
  float forward_pass(StepActivations& step, const Tensor& input_ids, const Tensor& targets, bool keep_logits,
                     float* grad_scale);
  void backward_pass(StepActivations& step);

  ModelConfig config_;
  Backend& backend_;
  ModelOptions options_;
  std::deque<Parameter> parameters_;  // deque: stable addresses for the layers' references
  std::deque<Parameter> adapters_;
  std::vector<LoraLinear*> lora_layers_;
  Parameter* embed_tokens_ = nullptr;
  Parameter* final_norm_ = nullptr;
  Parameter* lm_head_ = nullptr;  // == embed_tokens_ when tied
  std::vector<std::unique_ptr<Layer>> layers_;
  Tensor last_logits_;
};

}  // namespace ft
