// The Llama-family decoder (Llama 2/3, TinyLlama, SmolLM, ...) with Hugging
// Face tensor names, written against the op interface only: RMSNorm,
// q/k/v/o projections with grouped-query attention and rotary embedding, and
// the SwiGLU MLP. The same layer serves model_type qwen2 (q/k/v biases) and
// mistral (sliding-window attention); llama's attention_bias / mlp_bias add
// biases too (ModelConfig says which). CausalLM runs the step around its layers.
#pragma once
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "model/causal_lm.h"

namespace ft {

// config.json's fields of the families this layer serves (model/families.h).
void read_llama_config(const nlohmann::json& config, ModelConfig& result, const std::string& source);
void read_qwen2_config(const nlohmann::json& config, ModelConfig& result, const std::string& source);
void read_mistral_config(const nlohmann::json& config, ModelConfig& result, const std::string& source);

class LlamaModel final : public CausalLM {
 public:
  // Allocates every weight (uninitialised) and adapter on the backend. LoRA
  // targets that leave no module to adapt are an Error.
  LlamaModel(const ModelConfig& config, Backend& backend, const ModelOptions& options = {});
  ~LlamaModel() override;

 private:
  struct Layer;
  struct LayerActivations;

  std::unique_ptr<SavedActivations> forward_layer(size_t index, const Tensor& x, NormOutput& norm, Tensor* out,
                                                  const TokenLayout& layout) override;
  void backward_layer(size_t index, SavedActivations& saved, Tensor& dresidual, const Tensor& x,
                      const TokenLayout& layout, bool input_grad) override;
  const NormParameters& input_norm(size_t index) const override;
  struct MlpRows;
  MlpRows mlp_rows(Layer& layer, const Tensor& norm2, int64_t first, int64_t rows);
  void scan_mlp_inputs(Layer& layer, const Tensor& norm2, bool with_down_proj);
  static void end_mlp_scans(Layer& layer);
  void mlp_backward_rows(Layer& layer, const MlpRows& mlp, const Tensor& norm2, Tensor& dres, Tensor& dnorm,
                         int64_t first);

  std::vector<std::unique_ptr<Layer>> layers_;
};

}  // namespace ft
