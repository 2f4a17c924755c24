#include "model/llama.h"

#include <cmath>

#include "kernels/error.h"
#include "model/int8_linear.h"
#include "model/lora_linear.h"
#include "model/safetensors.h"

namespace ft {

struct LlamaModel::Layer {
  Parameter* input_norm = nullptr;
  Parameter* post_attention_norm = nullptr;
  std::unique_ptr<Linear> q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
};

// What one layer's backward needs from its forward.
struct LlamaModel::LayerActivations final : SavedActivations {
  Tensor norm1, rstd1;  // input_layernorm output [N, C] (activation dtype) and its f32 rstd [N]
  Tensor q, k, v;       // after rotary: [B, T, H, D]
  Tensor attn, lse;     // attention output [B, T, Hq, D], log-sum-exp [B, Hq, T]
  Tensor residual_mid;  // x + attention block output [N, C]
  Tensor norm2, rstd2;  // post_attention_layernorm output and rstd
  Tensor gate, up, act; // MLP [N, I]
};

struct LlamaModel::StepActivations : DecoderStep {
  Tensor dnorm;  // d(loss)/d(model.norm output) [N, C], made by a training forward's lm_head_loss
};

LlamaModel::LlamaModel(const ModelConfig& config, Backend& backend, const ModelOptions& options)
    : CausalLM(config, backend, options) {
  FT_CHECK(!config.attention_bias && !config.mlp_bias, "llama: attention_bias / mlp_bias are not supported yet");
  const int64_t C = config.hidden_size, I = config.intermediate_size, D = config.head_dim;
  const int64_t q_features = config.num_attention_heads * D, kv_features = config.num_key_value_heads * D;
  const DType dtype = options.weight_dtype;
  embed_tokens_ = &add_parameter("model.embed_tokens.weight", {config.vocab_size, C}, dtype);
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    auto layer = std::make_unique<Layer>();
    layer->input_norm = &add_parameter(prefix + "input_layernorm.weight", {C}, dtype);
    layer->q_proj = make_linear(prefix + "self_attn.q_proj", q_features, C);
    layer->k_proj = make_linear(prefix + "self_attn.k_proj", kv_features, C);
    layer->v_proj = make_linear(prefix + "self_attn.v_proj", kv_features, C);
    layer->o_proj = make_linear(prefix + "self_attn.o_proj", C, q_features);
    layer->post_attention_norm = &add_parameter(prefix + "post_attention_layernorm.weight", {C}, dtype);
    layer->gate_proj = make_linear(prefix + "mlp.gate_proj", I, C);
    layer->up_proj = make_linear(prefix + "mlp.up_proj", I, C);
    layer->down_proj = make_linear(prefix + "mlp.down_proj", C, I);
    layers_.push_back(std::move(layer));
  }
  final_norm_ = &add_parameter("model.norm.weight", {C}, dtype);
  lm_head_ = config.tie_word_embeddings ? embed_tokens_ : &add_parameter("lm_head.weight", {config.vocab_size, C}, dtype);
  check_lora_targets("q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj");
}

LlamaModel::~LlamaModel() = default;

float LlamaModel::run_step(const Tensor& input_ids, const Tensor& targets, const float* grad_scale) {
  StepActivations step;
  float loss = forward_pass(step, input_ids, targets, grad_scale);
  if (grad_scale && step.tokens.counted > 0) backward_pass(step);
  return loss;
}

// ---- forward -------------------------------------------------------------

// Output and rstd of an RMSNorm of x [N, C].
static NormOutput empty_norm_output(Backend& be, const Tensor& x, DType act) {
  NormOutput norm;
  norm.out = be.empty(x.shape, act, MemCategory::activations);
  norm.rstd = be.empty({x.rows()}, DType::f32, MemCategory::activations);
  return norm;
}

// out = a + b, and norm (allocated here) = out under the next norm: layer
// index + 1's input_layernorm, or model.norm after the last layer.
void LlamaModel::add_next_norm(size_t index, Tensor& out, NormOutput& norm, const Tensor& a, const Tensor& b) {
  const Parameter& weight = index + 1 < layers_.size() ? *layers_[index + 1]->input_norm : *final_norm_;
  norm = empty_norm_output(backend_, a, options_.activation_dtype);
  backend_.add_rmsnorm_forward(out, norm.out, norm.rstd, a, b, weight.value, config_.rms_norm_eps);
}

std::unique_ptr<CausalLM::SavedActivations> LlamaModel::forward_layer(size_t index, const Tensor& x,
                                                                      NormOutput& norm, Tensor* out,
                                                                      const Tensor& positions) {
  Backend& be = backend_;
  Layer& layer = *layers_[index];
  auto kept = std::make_unique<LayerActivations>();
  LayerActivations& saved = *kept;
  const int64_t B = x.dim(0), T = x.dim(1), N = B * T, C = config_.hidden_size;
  const int64_t Hq = config_.num_attention_heads, Hkv = config_.num_key_value_heads, D = config_.head_dim;
  const int64_t I = config_.intermediate_size;
  const DType act = options_.activation_dtype;
  const Tensor x2d = x.reshaped({N, C});

  if (!norm.out.defined()) {
    norm = empty_norm_output(be, x2d, act);
    be.rmsnorm_forward(norm.out, norm.rstd, x2d, layer.input_norm->value, config_.rms_norm_eps);
  }
  saved.norm1 = norm.out;  // owned by the saved activations from here: freed with them
  saved.rstd1 = norm.rstd;
  norm = {};

  saved.q = be.empty({B, T, Hq, D}, act, MemCategory::activations);
  saved.k = be.empty({B, T, Hkv, D}, act, MemCategory::activations);
  saved.v = be.empty({B, T, Hkv, D}, act, MemCategory::activations);
  Tensor q2d = saved.q.reshaped({N, Hq * D}), k2d = saved.k.reshaped({N, Hkv * D}), v2d = saved.v.reshaped({N, Hkv * D});
  layer.q_proj->forward(be, q2d, saved.norm1);
  layer.k_proj->forward(be, k2d, saved.norm1);
  layer.v_proj->forward(be, v2d, saved.norm1);
  Tensor q_heads = saved.q.reshaped({N, Hq, D}), k_heads = saved.k.reshaped({N, Hkv, D});
  be.rope_forward(q_heads, positions, int(D), config_.rope_theta);
  be.rope_forward(k_heads, positions, int(D), config_.rope_theta);

  saved.attn = be.empty({B, T, Hq, D}, act, MemCategory::activations);
  saved.lse = be.empty({B, Hq, T}, DType::f32, MemCategory::activations);
  be.attention_forward(saved.attn, saved.lse, saved.q, saved.k, saved.v, 1.0f / std::sqrt(float(D)));

  Tensor projected = be.empty({N, C}, act, MemCategory::activations);
  layer.o_proj->forward(be, projected, saved.attn.reshaped({N, Hq * D}));
  saved.residual_mid = be.empty({N, C}, act, MemCategory::activations);
  saved.norm2 = be.empty({N, C}, act, MemCategory::activations);
  saved.rstd2 = be.empty({N}, DType::f32, MemCategory::activations);
  be.add_rmsnorm_forward(saved.residual_mid, saved.norm2, saved.rstd2, x2d, projected,
                         layer.post_attention_norm->value, config_.rms_norm_eps);
  saved.gate = be.empty({N, I}, act, MemCategory::activations);
  saved.up = be.empty({N, I}, act, MemCategory::activations);
  saved.act = be.empty({N, I}, act, MemCategory::activations);
  layer.gate_proj->forward(be, saved.gate, saved.norm2);
  layer.up_proj->forward(be, saved.up, saved.norm2);
  be.swiglu_forward(saved.act, saved.gate, saved.up);
  // A recomputation stops here: backward reads down_proj's input (act), and
  // its output only makes the layer output, which is already kept.
  if (!out) return kept;
  layer.down_proj->forward(be, projected, saved.act);
  Tensor out2d = out->reshaped({N, C});
  add_next_norm(index, out2d, norm, saved.residual_mid, projected);
  return kept;
}

float LlamaModel::forward_pass(StepActivations& step, const Tensor& input_ids, const Tensor& targets,
                               const float* grad_scale) {
  forward_decoder(step, input_ids, targets, *embed_tokens_, grad_scale != nullptr);
  const float loss = lm_head_loss(step.final_norm.out, *lm_head_, step.tokens, grad_scale ? &step.dnorm : nullptr,
                                  grad_scale ? *grad_scale : 0.0f);
  step.final_norm.out = Tensor{};  // its backward reads only rstd
  return loss;
}

// ---- backward ------------------------------------------------------------

void LlamaModel::backward_layer(size_t index, SavedActivations& kept, Tensor& dresidual, const Tensor& x,
                                const Tensor& positions) {
  Backend& be = backend_;
  Layer& layer = *layers_[index];
  LayerActivations& saved = static_cast<LayerActivations&>(kept);
  const int64_t B = x.dim(0), T = x.dim(1), N = B * T, C = config_.hidden_size;
  const int64_t Hq = config_.num_attention_heads, Hkv = config_.num_key_value_heads, D = config_.head_dim;
  const int64_t I = config_.intermediate_size;
  const DType act = options_.activation_dtype;
  Tensor dres = dresidual.reshaped({N, C});
  Tensor dnorm = be.empty({N, C}, act, MemCategory::activations);

  // MLP block: out = residual_mid + down(silu(gate(n2)) * up(n2)).
  {
    Tensor dact = be.empty({N, I}, act, MemCategory::activations);
    layer.down_proj->backward(be, dact, dres, saved.act, false);
    Tensor dgate = be.empty({N, I}, act, MemCategory::activations);
    Tensor dup = be.empty({N, I}, act, MemCategory::activations);
    be.swiglu_backward(dgate, dup, dact, saved.gate, saved.up);
    layer.gate_proj->backward(be, dnorm, dgate, saved.norm2, false);
    layer.up_proj->backward(be, dnorm, dup, saved.norm2, true);
  }
  Parameter& norm2 = *layer.post_attention_norm;
  be.rmsnorm_backward_add(dres, norm2.trainable() ? &norm2.grad : nullptr, dnorm, dres, saved.residual_mid,
                          norm2.value, saved.rstd2);

  // Attention block: residual_mid = x + o(attention(rope(q(n1)), rope(k(n1)), v(n1))).
  {
    Tensor dattn = be.empty({B, T, Hq, D}, act, MemCategory::activations);
    Tensor dattn2d = dattn.reshaped({N, Hq * D});
    layer.o_proj->backward(be, dattn2d, dres, saved.attn.reshaped({N, Hq * D}), false);
    Tensor dq = be.empty({B, T, Hq, D}, act, MemCategory::activations);
    Tensor dk = be.empty({B, T, Hkv, D}, act, MemCategory::activations);
    Tensor dv = be.empty({B, T, Hkv, D}, act, MemCategory::activations);
    be.attention_backward(dq, dk, dv, dattn, saved.q, saved.k, saved.v, saved.attn, saved.lse,
                          1.0f / std::sqrt(float(D)));
    Tensor dq_heads = dq.reshaped({N, Hq, D}), dk_heads = dk.reshaped({N, Hkv, D});
    be.rope_backward(dq_heads, positions, int(D), config_.rope_theta);
    be.rope_backward(dk_heads, positions, int(D), config_.rope_theta);
    layer.q_proj->backward(be, dnorm, dq.reshaped({N, Hq * D}), saved.norm1, false);
    layer.k_proj->backward(be, dnorm, dk.reshaped({N, Hkv * D}), saved.norm1, true);
    layer.v_proj->backward(be, dnorm, dv.reshaped({N, Hkv * D}), saved.norm1, true);
  }
  Parameter& norm1 = *layer.input_norm;
  be.rmsnorm_backward_add(dres, norm1.trainable() ? &norm1.grad : nullptr, dnorm, dres, x.reshaped({N, C}),
                          norm1.value, saved.rstd1);
}

void LlamaModel::backward_pass(StepActivations& step) {
  Backend& be = backend_;
  const int64_t N = step.tokens.batch * step.tokens.seq, C = config_.hidden_size;
  Tensor dresidual =
      be.empty({step.tokens.batch, step.tokens.seq, C}, options_.activation_dtype, MemCategory::activations);
  Tensor dresidual2d = dresidual.reshaped({N, C});
  be.rmsnorm_backward(dresidual2d, final_norm_->trainable() ? &final_norm_->grad : nullptr, step.dnorm,
                      step.residuals.back().reshaped({N, C}), final_norm_->value, step.final_norm.rstd);
  step.dnorm = Tensor{};
  backward_decoder(step, dresidual, *embed_tokens_);
}

}  // namespace ft
