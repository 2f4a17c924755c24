#include "model/gpt_neox.h"

#include <cmath>

#include "kernels/error.h"

namespace ft {

struct GptNeoxModel::Layer {
  LayerNormParameters input_norm, post_attention_norm;
  std::unique_ptr<Linear> query_key_value, dense, dense_h_to_4h, dense_4h_to_h;
};

// What one layer's backward needs from its forward.
struct GptNeoxModel::LayerActivations final : SavedActivations {
  Tensor norm1, mean1, rstd1;  // input_layernorm output [N, C] and its f32 statistics [N]
  Tensor q, k, v;              // [B, T, H, D], q and k after rotary
  Tensor attn, lse;            // attention output [B, T, H, D], log-sum-exp [B, H, T]
  Tensor residual_mid;         // sequential residual only: x + attention block output [N, C]
  Tensor norm2, mean2, rstd2;  // post_attention_layernorm output and statistics
  Tensor h;                    // dense_h_to_4h output [N, I], before GELU
};

struct GptNeoxModel::StepActivations : DecoderStep {
  Tensor dnorm;  // d(loss)/d(final_layer_norm output) [N, C], made by a training forward
};

GptNeoxModel::GptNeoxModel(const ModelConfig& config, Backend& backend, const ModelOptions& options)
    : CausalLM(config, backend, options) {
  gelu_kind_ = config.hidden_act == "gelu" ? GeluKind::erf : GeluKind::tanh;
  const int64_t C = config.hidden_size, I = config.intermediate_size, V = config.vocab_size;
  const DType dtype = options.weight_dtype;
  auto add_norm = [&](const std::string& name) {
    Parameter& weight = add_parameter(name + ".weight", {C}, dtype);
    return LayerNormParameters{&weight, &add_parameter(name + ".bias", {C}, dtype)};
  };
  embed_in_ = &add_parameter("gpt_neox.embed_in.weight", {V, C}, dtype);
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    const std::string prefix = "gpt_neox.layers." + std::to_string(i) + ".";
    auto layer = std::make_unique<Layer>();
    layer->input_norm = add_norm(prefix + "input_layernorm");
    layer->post_attention_norm = add_norm(prefix + "post_attention_layernorm");
    layer->query_key_value = make_linear(prefix + "attention.query_key_value", 3 * C, C, config.attention_bias);
    layer->dense = make_linear(prefix + "attention.dense", C, C, config.attention_bias);
    layer->dense_h_to_4h = make_linear(prefix + "mlp.dense_h_to_4h", I, C, true);
    layer->dense_4h_to_h = make_linear(prefix + "mlp.dense_4h_to_h", C, I, true);
    layers_.push_back(std::move(layer));
  }
  final_norm_ = add_norm("gpt_neox.final_layer_norm");
  embed_out_ = config.tie_word_embeddings ? embed_in_ : &add_parameter("embed_out.weight", {V, C}, dtype);
  check_lora_targets("query_key_value, dense, dense_h_to_4h, dense_4h_to_h");
}

GptNeoxModel::~GptNeoxModel() = default;

float GptNeoxModel::run_step(const Tensor& input_ids, const Tensor& targets, const float* grad_scale) {
  StepActivations step;
  float loss = forward_pass(step, input_ids, targets, grad_scale);
  if (grad_scale && step.tokens.counted > 0) backward_pass(step);
  return loss;
}

// ---- forward -------------------------------------------------------------

// out [N, C] in the activation dtype and its statistics f32 [N].
static void empty_norm_outputs(Backend& be, Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x, DType act) {
  out = be.empty(x.shape, act, MemCategory::activations);
  mean = be.empty({x.rows()}, DType::f32, MemCategory::activations);
  rstd = be.empty({x.rows()}, DType::f32, MemCategory::activations);
}

// out, mean and rstd are allocated here.
static void layer_norm(Backend& be, Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x,
                       const LayerNormParameters& norm, float eps, DType act) {
  empty_norm_outputs(be, out, mean, rstd, x, act);
  be.layernorm_forward(out, mean, rstd, x, norm.weight->value, norm.bias->value, eps);
}

// sum = a + b and out = layer norm of sum in one fused op; out, mean and
// rstd are allocated here.
static void add_layer_norm(Backend& be, Tensor& sum, Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& a,
                           const Tensor& b, const LayerNormParameters& norm, float eps, DType act) {
  empty_norm_outputs(be, out, mean, rstd, a, act);
  be.add_layernorm_forward(sum, out, mean, rstd, a, b, norm.weight->value, norm.bias->value, eps);
}

// out [N, C] = dense(attention(rope(q), rope(k), v)) with q, k, v from
// query_key_value(saved.norm1). Without out it stops before dense, whose
// output backward does not read.
void GptNeoxModel::forward_attention(Layer& layer, LayerActivations& saved, int64_t B, int64_t T, Tensor* out,
                                     const Tensor& positions) {
  Backend& be = backend_;
  const DType act = options_.activation_dtype;
  const int64_t N = B * T, C = config_.hidden_size, H = config_.num_attention_heads, D = config_.head_dim;
  Tensor qkv = be.empty({N, 3 * C}, act, MemCategory::activations);
  layer.query_key_value->forward(be, qkv, saved.norm1);
  // HF's fused layout: each token's 3C outputs are [H, 3, D], per head q then k then v.
  const Tensor qkv_rows = qkv.reshaped({N * H, 3 * D});
  Tensor* parts[3] = {&saved.q, &saved.k, &saved.v};
  for (int part = 0; part < 3; ++part) {
    *parts[part] = be.empty({B, T, H, D}, act, MemCategory::activations);
    Tensor rows = parts[part]->reshaped({N * H, D});
    be.copy_columns(rows, 0, qkv_rows, part * D, D);
  }
  Tensor q_heads = saved.q.reshaped({N, H, D}), k_heads = saved.k.reshaped({N, H, D});
  be.rope_forward(q_heads, positions, int(config_.rotary_dim()), config_.rope_theta);
  be.rope_forward(k_heads, positions, int(config_.rotary_dim()), config_.rope_theta);

  saved.attn = be.empty({B, T, H, D}, act, MemCategory::activations);
  saved.lse = be.empty({B, H, T}, DType::f32, MemCategory::activations);
  be.attention_forward(saved.attn, saved.lse, saved.q, saved.k, saved.v, 1.0f / std::sqrt(float(D)));
  if (out) layer.dense->forward(be, *out, saved.attn.reshaped({N, C}));
}

// out [N, C] = dense_4h_to_h(gelu(dense_h_to_4h(saved.norm2))). Without out
// it stops at h: backward recomputes the GELU from h and reads nothing else.
void GptNeoxModel::forward_mlp(Layer& layer, LayerActivations& saved, Tensor* out) {
  Backend& be = backend_;
  const DType act = options_.activation_dtype;
  const int64_t N = saved.norm2.rows(), I = config_.intermediate_size;
  saved.h = be.empty({N, I}, act, MemCategory::activations);
  layer.dense_h_to_4h->forward(be, saved.h, saved.norm2);
  if (!out) return;
  Tensor gelu_out = be.empty({N, I}, act, MemCategory::activations);
  be.gelu_forward(gelu_out, saved.h, gelu_kind_);
  layer.dense_4h_to_h->forward(be, *out, gelu_out);
}

// out = a + b, and norm (allocated here) = out under the next norm: layer
// index + 1's input_layernorm, or final_layer_norm after the last layer.
void GptNeoxModel::add_next_norm(size_t index, Tensor& out, NormOutput& norm, const Tensor& a, const Tensor& b) {
  const LayerNormParameters& next = index + 1 < layers_.size() ? layers_[index + 1]->input_norm : final_norm_;
  add_layer_norm(backend_, out, norm.out, norm.mean, norm.rstd, a, b, next, config_.layer_norm_eps,
                 options_.activation_dtype);
}

// Parallel residual: out = (x + attn(ln1(x))) + mlp(ln2(x)).
// Sequential:        mid = x + attn(ln1(x)); out = mid + mlp(ln2(mid)).
std::unique_ptr<CausalLM::SavedActivations> GptNeoxModel::forward_layer(size_t index, const Tensor& x,
                                                                        NormOutput& norm, Tensor* out,
                                                                        const Tensor& positions) {
  Backend& be = backend_;
  const DType act = options_.activation_dtype;
  Layer& layer = *layers_[index];
  auto kept = std::make_unique<LayerActivations>();
  LayerActivations& saved = *kept;
  const int64_t B = x.dim(0), T = x.dim(1), N = B * T, C = config_.hidden_size;
  const float eps = config_.layer_norm_eps;
  const bool parallel = config_.use_parallel_residual;
  const Tensor x2d = x.reshaped({N, C});
  if (!norm.out.defined()) layer_norm(be, norm.out, norm.mean, norm.rstd, x2d, layer.input_norm, eps, act);
  saved.norm1 = norm.out;  // owned by the saved activations from here: freed with them
  saved.mean1 = norm.mean;
  saved.rstd1 = norm.rstd;
  norm = {};
  // A recomputation (no out) computes only what backward reads: not the MLP
  // output, nor the parallel form's attention output, which only make the
  // layer output (already kept). The sequential form's makes mid.
  Tensor attn_out;
  if (out || !parallel) attn_out = be.empty({N, C}, act, MemCategory::activations);
  forward_attention(layer, saved, B, T, attn_out.defined() ? &attn_out : nullptr, positions);
  if (parallel) {
    layer_norm(be, saved.norm2, saved.mean2, saved.rstd2, x2d, layer.post_attention_norm, eps, act);
  } else {
    saved.residual_mid = be.empty({N, C}, act, MemCategory::activations);
    add_layer_norm(be, saved.residual_mid, saved.norm2, saved.mean2, saved.rstd2, x2d, attn_out,
                   layer.post_attention_norm, eps, act);
  }
  if (!out) {
    forward_mlp(layer, saved, nullptr);
    return kept;
  }
  Tensor mlp_out = be.empty({N, C}, act, MemCategory::activations);
  forward_mlp(layer, saved, &mlp_out);
  Tensor out2d = out->reshaped({N, C});
  if (parallel) be.add(out2d, x2d, attn_out);
  add_next_norm(index, out2d, norm, parallel ? out2d : saved.residual_mid, mlp_out);
  return kept;
}

float GptNeoxModel::forward_pass(StepActivations& step, const Tensor& input_ids, const Tensor& targets,
                                 const float* grad_scale) {
  forward_decoder(step, input_ids, targets, *embed_in_, grad_scale != nullptr);
  const float loss = lm_head_loss(step.final_norm.out, *embed_out_, step.tokens, grad_scale ? &step.dnorm : nullptr,
                                  grad_scale ? *grad_scale : 0.0f);
  step.final_norm.out = Tensor{};  // its backward reads only the statistics
  return loss;
}

// ---- backward ------------------------------------------------------------

// dx overwritten; the norm's weight and bias gradients accumulate when they train.
static void layer_norm_backward(Backend& be, Tensor& dx, const Tensor& dout, const Tensor& x,
                                LayerNormParameters& norm, const Tensor& mean, const Tensor& rstd) {
  Parameter& w = *norm.weight;
  Parameter& b = *norm.bias;
  be.layernorm_backward(dx, w.trainable() ? &w.grad : nullptr, b.trainable() ? &b.grad : nullptr, dout, x, w.value,
                        mean, rstd);
}

// dresidual += the norm's input gradient, fused; parameter gradients as above.
static void layer_norm_backward_add(Backend& be, Tensor& dresidual, const Tensor& dout, const Tensor& x,
                                    LayerNormParameters& norm, const Tensor& mean, const Tensor& rstd) {
  Parameter& w = *norm.weight;
  Parameter& b = *norm.bias;
  be.layernorm_backward_add(dresidual, w.trainable() ? &w.grad : nullptr, b.trainable() ? &b.grad : nullptr, dout,
                            dresidual, x, w.value, mean, rstd);
}

// dnorm (overwritten) = d(loss)/d(saved.norm2) from dout = d(loss)/d(mlp output).
void GptNeoxModel::backward_mlp(Layer& layer, LayerActivations& saved, const Tensor& dout, Tensor& dnorm) {
  Backend& be = backend_;
  const DType act = options_.activation_dtype;
  const int64_t N = dout.rows(), I = config_.intermediate_size;
  // GELU is recomputed rather than saved: one cheap elementwise pass instead
  // of an [N, I] activation kept per layer.
  Tensor gelu_out = be.empty({N, I}, act, MemCategory::activations);
  be.gelu_forward(gelu_out, saved.h, gelu_kind_);
  Tensor dact = be.empty({N, I}, act, MemCategory::activations);
  layer.dense_4h_to_h->backward(be, dact, dout, gelu_out, false);
  be.gelu_backward(dact, dact, saved.h, gelu_kind_);
  layer.dense_h_to_4h->backward(be, dnorm, dact, saved.norm2, false);
}

// dnorm (overwritten) = d(loss)/d(saved.norm1) from dout = d(loss)/d(attention block output).
void GptNeoxModel::backward_attention(Layer& layer, LayerActivations& saved, const Tensor& dout, Tensor& dnorm,
                                      const Tensor& positions) {
  Backend& be = backend_;
  const DType act = options_.activation_dtype;
  const int64_t B = saved.q.dim(0), T = saved.q.dim(1), N = B * T, C = config_.hidden_size;
  const int64_t H = config_.num_attention_heads, D = config_.head_dim;
  Tensor dattn = be.empty({B, T, H, D}, act, MemCategory::activations);
  Tensor dattn2d = dattn.reshaped({N, C});
  layer.dense->backward(be, dattn2d, dout, saved.attn.reshaped({N, C}), false);
  Tensor dq = be.empty({B, T, H, D}, act, MemCategory::activations);
  Tensor dk = be.empty({B, T, H, D}, act, MemCategory::activations);
  Tensor dv = be.empty({B, T, H, D}, act, MemCategory::activations);
  be.attention_backward(dq, dk, dv, dattn, saved.q, saved.k, saved.v, saved.attn, saved.lse,
                        1.0f / std::sqrt(float(D)));
  Tensor dq_heads = dq.reshaped({N, H, D}), dk_heads = dk.reshaped({N, H, D});
  be.rope_backward(dq_heads, positions, int(config_.rotary_dim()), config_.rope_theta);
  be.rope_backward(dk_heads, positions, int(config_.rotary_dim()), config_.rope_theta);
  // Back into HF's fused [H, 3, D] layout; the three parts cover every column.
  Tensor dqkv = be.empty({N, 3 * C}, act, MemCategory::activations);
  Tensor dqkv_rows = dqkv.reshaped({N * H, 3 * D});
  const Tensor* parts[3] = {&dq, &dk, &dv};
  for (int part = 0; part < 3; ++part) be.copy_columns(dqkv_rows, part * D, parts[part]->reshaped({N * H, D}), 0, D);
  layer.query_key_value->backward(be, dnorm, dqkv, saved.norm1, false);
}

void GptNeoxModel::backward_layer(size_t index, SavedActivations& kept, Tensor& dresidual, const Tensor& x,
                                  const Tensor& positions) {
  Backend& be = backend_;
  const DType act = options_.activation_dtype;
  Layer& layer = *layers_[index];
  LayerActivations& saved = static_cast<LayerActivations&>(kept);
  const int64_t N = x.dim(0) * x.dim(1), C = config_.hidden_size;
  const bool parallel = config_.use_parallel_residual;
  const Tensor x2d = x.reshaped({N, C});
  Tensor dres = dresidual.reshaped({N, C});
  Tensor dnorm = be.empty({N, C}, act, MemCategory::activations);

  backward_mlp(layer, saved, dres, dnorm);
  // Sequential: the attention block's output also reaches the MLP through
  // mid. Parallel: x's gradient through ln2 is added last (after the
  // attention block's, as the unfused order rounded), so the MLP's dnorm
  // waits and the attention block gets a buffer of its own, allocated only
  // now: the MLP backward, with its [N, I] tensors, is the layer's peak and
  // does not need it.
  Tensor dnorm_attention = dnorm;
  if (parallel)
    dnorm_attention = be.empty({N, C}, act, MemCategory::activations);
  else
    layer_norm_backward_add(be, dres, dnorm, saved.residual_mid, layer.post_attention_norm, saved.mean2,
                            saved.rstd2);
  backward_attention(layer, saved, dres, dnorm_attention, positions);
  layer_norm_backward_add(be, dres, dnorm_attention, x2d, layer.input_norm, saved.mean1, saved.rstd1);
  if (parallel)
    layer_norm_backward_add(be, dres, dnorm, x2d, layer.post_attention_norm, saved.mean2, saved.rstd2);
}

void GptNeoxModel::backward_pass(StepActivations& step) {
  Backend& be = backend_;
  const DType act = options_.activation_dtype;
  const int64_t N = step.tokens.batch * step.tokens.seq, C = config_.hidden_size;
  Tensor dresidual = be.empty({step.tokens.batch, step.tokens.seq, C}, act, MemCategory::activations);
  Tensor dresidual2d = dresidual.reshaped({N, C});
  layer_norm_backward(be, dresidual2d, step.dnorm, step.residuals.back().reshaped({N, C}), final_norm_,
                      step.final_norm.mean, step.final_norm.rstd);
  step.dnorm = Tensor{};
  backward_decoder(step, dresidual, *embed_in_);
}

}  // namespace ft
