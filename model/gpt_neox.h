// The GPT-NeoX decoder (GPT-NeoX-20B, Pythia) with Hugging Face tensor names,
// written against the op interface only. What sets it apart from Llama:
// LayerNorm with bias, biases on every linear, a fused query_key_value
// projection in HF's per-head layout ([heads, 3, head_size] output rows),
// rotary embedding on only the first rotary_pct of each head, GELU MLP, and
// (by default) the parallel residual x + attn(ln1(x)) + mlp(ln2(x)).
//
// CausalLM runs the step around its layers.
#pragma once
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "model/causal_lm.h"

namespace ft {

// config.json's fields of model_type gpt_neox (model/families.h).
void read_gpt_neox_config(const nlohmann::json& config, ModelConfig& result, const std::string& source);

class GptNeoxModel final : public CausalLM {
 public:
  // Allocates every weight (uninitialised) and adapter on the backend. LoRA
  // targets that leave no module to adapt are an Error.
  GptNeoxModel(const ModelConfig& config, Backend& backend, const ModelOptions& options = {});
  ~GptNeoxModel() override;

 private:
  struct Layer;
  struct LayerActivations;

  void forward_attention(Layer& layer, LayerActivations& saved, int64_t B, int64_t T, Tensor* out,
                         const TokenLayout& layout);
  void forward_mlp(Layer& layer, LayerActivations& saved, Tensor* out);
  Tensor mlp_hidden(Layer& layer, const Tensor& norm2, int64_t first, int64_t rows);
  Tensor mlp_activation(const Tensor& h);
  void mlp_output_rows(Layer& layer, const Tensor& h, Tensor& out_rows, int64_t first);
  void scan_mlp_inputs(Layer& layer, const Tensor& norm2, bool with_output_layer);
  static void end_mlp_scans(Layer& layer);
  std::unique_ptr<SavedActivations> forward_layer(size_t index, const Tensor& x, NormOutput& norm, Tensor* out,
                                                  const TokenLayout& layout) override;
  void backward_attention(Layer& layer, LayerActivations& saved, const Tensor& dout, Tensor* dnorm,
                          const TokenLayout& layout);
  void backward_mlp(Layer& layer, LayerActivations& saved, const Tensor& dout, Tensor* dnorm);
  void backward_mlp_rows(Layer& layer, const Tensor& h, const Tensor& norm2, const Tensor& dout, Tensor* dnorm,
                         int64_t first);
  void backward_layer(size_t index, SavedActivations& saved, Tensor& dresidual, const Tensor& x,
                      const TokenLayout& layout, bool input_grad) override;
  const NormParameters& input_norm(size_t index) const override;

  GeluKind gelu_kind_;
  std::vector<std::unique_ptr<Layer>> layers_;
};

}  // namespace ft
