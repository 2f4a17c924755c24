// The GPT-NeoX decoder (GPT-NeoX-20B, Pythia) with Hugging Face tensor names,
// written against the op interface only. What sets it apart from Llama:
// LayerNorm with bias, biases on every linear, a fused query_key_value
// projection in HF's per-head layout ([heads, 3, head_size] output rows),
// rotary embedding on only the first rotary_pct of each head, GELU MLP, and
// (by default) the parallel residual x + attn(ln1(x)) + mlp(ln2(x)).
//
// Activations of one step live from forward to the end of backward (or, with
// activation checkpointing, from a layer's recomputation to its backward) and
// are charged to MemCategory::activations; when a step ends they are all freed.
#pragma once
#include <memory>
#include <vector>

#include "model/causal_lm.h"

namespace ft {

// A LayerNorm's weight and bias.
struct LayerNormParameters {
  Parameter* weight = nullptr;
  Parameter* bias = nullptr;
};

class GptNeoxModel final : public CausalLM {
 public:
  // Allocates every weight (uninitialised) and adapter on the backend. A LoRA
  // target that matches no module is an Error.
  GptNeoxModel(const ModelConfig& config, Backend& backend, const ModelOptions& options = {});
  ~GptNeoxModel() override;


 private:
  float run_step(const Tensor& input_ids, const Tensor& targets, const float* grad_scale) override;
  struct Layer;
  struct LayerActivations;
  struct StepActivations;

  void forward_attention(Layer& layer, LayerActivations& saved, int64_t B, int64_t T, Tensor* out,
                         const Tensor& positions);
  void forward_mlp(Layer& layer, LayerActivations& saved, Tensor* out);
  std::unique_ptr<SavedActivations> forward_layer(size_t index, const Tensor& x, NormOutput& norm, Tensor* out,
                                                  const Tensor& positions) override;
  void add_next_norm(size_t index, Tensor& out, NormOutput& norm, const Tensor& a, const Tensor& b);
  void backward_attention(Layer& layer, LayerActivations& saved, const Tensor& dout, Tensor& dnorm,
                          const Tensor& positions);
  void backward_mlp(Layer& layer, LayerActivations& saved, const Tensor& dout, Tensor& dnorm);
  void backward_layer(size_t index, SavedActivations& saved, Tensor& dresidual, const Tensor& x,
                      const Tensor& positions) override;
  float forward_pass(StepActivations& step, const Tensor& input_ids, const Tensor& targets, const float* grad_scale);
  void backward_pass(StepActivations& step);

  GeluKind gelu_kind_;
  Parameter* embed_in_ = nullptr;
  LayerNormParameters final_norm_;
  Parameter* embed_out_ = nullptr;  // == embed_in_ when tied
  std::vector<std::unique_ptr<Layer>> layers_;
};

}  // namespace ft
