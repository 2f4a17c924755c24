// The Llama-family decoder (Llama 2/3, TinyLlama, SmolLM, ...) with Hugging
// Face tensor names, written against the op interface only.
//
// Activations of one step live from forward to the end of backward (or, with
// activation checkpointing, from a layer's recomputation to its backward) and
// are charged to MemCategory::activations; when a step ends they are all freed.
#pragma once
#include <memory>
#include <vector>

#include "model/causal_lm.h"

namespace ft {

// The Llama family's layers on top of CausalLM's shared machinery.
class LlamaModel final : public CausalLM {
 public:
  // Allocates every weight (uninitialised) and adapter on the backend. A LoRA
  // target that matches no module is an Error.
  LlamaModel(const ModelConfig& config, Backend& backend, const ModelOptions& options = {});
  ~LlamaModel() override;


 private:
  float run_step(const Tensor& input_ids, const Tensor& targets, const float* grad_scale) override;
  struct Layer;
  struct LayerActivations;
  struct StepActivations;

  std::unique_ptr<SavedActivations> forward_layer(size_t index, const Tensor& x, NormOutput& norm, Tensor* out,
                                                  const Tensor& positions) override;
  void add_next_norm(size_t index, Tensor& out, NormOutput& norm, const Tensor& a, const Tensor& b);
  void backward_layer(size_t index, SavedActivations& saved, Tensor& dresidual, const Tensor& x,
                      const Tensor& positions) override;
  float forward_pass(StepActivations& step, const Tensor& input_ids, const Tensor& targets, const float* grad_scale);
  void backward_pass(StepActivations& step);

  Parameter* embed_tokens_ = nullptr;
  Parameter* final_norm_ = nullptr;
  Parameter* lm_head_ = nullptr;  // == embed_tokens_ when tied
  std::vector<std::unique_ptr<Layer>> layers_;
};

}  // namespace ft
