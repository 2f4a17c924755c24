#include "model/llama.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "kernels/error.h"

namespace ft {

using nlohmann::json;

namespace {

// The Llama layer's fields around those of the family it serves (variant):
// biases, or a sliding window.
void read_llama_layer_config(const json& config, ModelConfig& result, const std::string& source,
                             void (*read_variant)(const json&, ModelConfig&, const std::string&)) {
  read_decoder_fields(config, result, source);
  result.num_key_value_heads =
      optional_value<int64_t>(config, "num_key_value_heads", result.num_attention_heads, source);
  // Only a derived head_dim needs hidden_size to split evenly; an explicit one may not (e.g. Gemma).
  bool explicit_head_dim = config.contains("head_dim") && !config["head_dim"].is_null();
  FT_CHECK(explicit_head_dim || result.hidden_size % result.num_attention_heads == 0, source,
           ": hidden_size (", result.hidden_size, ") must be a multiple of num_attention_heads (",
           result.num_attention_heads, ") when head_dim is not given");
  result.head_dim =
      optional_value<int64_t>(config, "head_dim", result.hidden_size / result.num_attention_heads, source);
  result.rms_norm_eps = optional_value<float>(config, "rms_norm_eps", result.rms_norm_eps, source);
  result.rope_theta = optional_value<float>(config, "rope_theta", result.rope_theta, source);
  read_rope(config, result, source);
  read_variant(config, result, source);
  result.hidden_act = optional_value<std::string>(config, "hidden_act", result.hidden_act, source);
  FT_CHECK(result.hidden_act == "silu", source, ": hidden_act \"", result.hidden_act,
           "\" is not supported for ", result.model_type, " (expected \"silu\")");
  FT_CHECK(result.rotary_pct == 1.0, source, ": rope_parameters.partial_rotary_factor ", result.rotary_pct,
           " is not supported for ", result.model_type, " (expected 1)");
  check_decoder_fields(result, source);
}

void read_llama_variant(const json& config, ModelConfig& result, const std::string& source) {
  result.attention_bias = optional_value<bool>(config, "attention_bias", false, source);
  result.o_proj_bias = result.attention_bias;
  result.mlp_bias = optional_value<bool>(config, "mlp_bias", false, source);
}

void read_qwen2_variant(const json& config, ModelConfig& result, const std::string& source) {
  // Qwen2Attention: q/k/v always with bias, o_proj and the MLP without.
  result.attention_bias = true;
  // As Qwen2Config: with use_sliding_window (and a sliding_window, 4096 when
  // absent), layers from max_window_layers on attend within the window
  // (layer_types says so where given). Such a layer is refused rather than run
  // as full attention; released Qwen2/2.5 checkpoints attend fully everywhere.
  const bool window = optional_value<bool>(config, "use_sliding_window", false, source) &&
                      !(config.contains("sliding_window") && config["sliding_window"].is_null());
  const int64_t full_layers = optional_value<int64_t>(config, "max_window_layers", 28, source);
  const bool listed = config.contains("layer_types") && config["layer_types"].is_array();
  const bool sliding =
      listed ? std::count(config["layer_types"].begin(), config["layer_types"].end(), "sliding_attention") > 0
             : window && full_layers < result.num_hidden_layers;
  FT_CHECK(!sliding, source, ": ",
           listed ? "layer_types holds \"sliding_attention\""
                  : "use_sliding_window true with max_window_layers " + std::to_string(full_layers) +
                        " below num_hidden_layers " + std::to_string(result.num_hidden_layers),
           ": layers attending within sliding_window are not supported for ", result.model_type,
           " (expected every layer attending fully)");
  if (!config.contains("max_position_embeddings")) result.max_position_embeddings = 32768;  // Qwen2Config's default
}

// No biases, every layer in the window. As MistralConfig: an absent
// sliding_window is 4096, null is none.
void read_mistral_variant(const json& config, ModelConfig& result, const std::string& source) {
  result.sliding_window =
      config.contains("sliding_window") ? optional_value<int64_t>(config, "sliding_window", 0, source) : 4096;
  const bool given = config.contains("sliding_window") && !config["sliding_window"].is_null();
  FT_CHECK(!given || result.sliding_window > 0, source, ": sliding_window must be a positive integer or null, got ",
           result.sliding_window);
  if (!config.contains("max_position_embeddings")) result.max_position_embeddings = 131072;  // MistralConfig's
}

}  // namespace

void read_llama_config(const json& config, ModelConfig& result, const std::string& source) {
  read_llama_layer_config(config, result, source, read_llama_variant);
}

void read_qwen2_config(const json& config, ModelConfig& result, const std::string& source) {
  read_llama_layer_config(config, result, source, read_qwen2_variant);
}

void read_mistral_config(const json& config, ModelConfig& result, const std::string& source) {
  read_llama_layer_config(config, result, source, read_mistral_variant);
}

struct LlamaModel::Layer {
  NormParameters input_norm, post_attention_norm;
  std::unique_ptr<Linear> q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
};

// What one layer's backward needs from its forward.
struct LlamaModel::LayerActivations final : SavedActivations {
  NormOutput norm1;     // input_layernorm output [N, C] and its f32 rstd [N]
  AttentionActivations attention;
  Tensor residual_mid;  // x + attention block output [N, C]
  NormOutput norm2;     // post_attention_layernorm output and rstd
  Tensor gate, up, act; // MLP [N, I]; not kept when the MLP runs chunked (recomputed)
};

// The MLP's [rows, I] tensors for a block of tokens.
struct LlamaModel::MlpRows {
  Tensor gate, up, act;
};

// PEFT's default target_modules for llama, qwen2 and mistral alike.
LlamaModel::LlamaModel(const ModelConfig& config, Backend& backend, const ModelOptions& options)
    : CausalLM(config, backend, options) {
  const bool qkv_bias = config.attention_bias, o_bias = config.o_proj_bias, mlp_bias = config.mlp_bias;
  const int64_t C = config.hidden_size, I = config.intermediate_size, D = config.head_dim;
  const int64_t q_features = config.num_attention_heads * D, kv_features = config.num_key_value_heads * D;
  const DType dtype = options.weight_dtype;
  const float eps = config.rms_norm_eps;
  // A pipeline stage holds its layers only (null elsewhere), the embedding
  // on the first stage (and the last, when lm_head is tied to it).
  const LayerRange& stage = layers();
  const bool tied = config.tie_word_embeddings;
  const int64_t ranks = tensor_ranks();
  check_tensor_split(config, ranks, "parallel.tensor: " + std::to_string(ranks) + ": ");
  // More ranks than key/value heads: each head on ranks / heads neighbouring
  // ranks, whose query heads all read it.
  const int64_t kv_shares = std::min(config.num_key_value_heads, ranks);
  if (first_stage() || (tied && last_stage()))
    embedding_ = &add_parameter("model.embed_tokens.weight", {config.vocab_size, C}, dtype);
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    if (i < stage.first_layer || i >= stage.end_layer) {
      layers_.push_back(nullptr);
      continue;
    }
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    auto layer = std::make_unique<Layer>();
    layer->input_norm = add_norm(prefix + "input_layernorm", false, eps);
    // Tensor parallel: attention by heads, the MLP by its intermediate features.
    const ParallelLinear column = ParallelLinear::column, row = ParallelLinear::row;
    layer->q_proj = make_linear(prefix + "self_attn.q_proj", q_features, C, qkv_bias, column);
    layer->k_proj = make_linear(prefix + "self_attn.k_proj", kv_features, C, qkv_bias, column, kv_shares);
    layer->v_proj = make_linear(prefix + "self_attn.v_proj", kv_features, C, qkv_bias, column, kv_shares);
    layer->o_proj = make_linear(prefix + "self_attn.o_proj", C, q_features, o_bias, row);
    layer->post_attention_norm = add_norm(prefix + "post_attention_layernorm", false, eps);
    layer->gate_proj = make_linear(prefix + "mlp.gate_proj", I, C, mlp_bias, column);
    layer->up_proj = make_linear(prefix + "mlp.up_proj", I, C, mlp_bias, column);
    layer->down_proj = make_linear(prefix + "mlp.down_proj", C, I, mlp_bias, row);
    weightless_modules_.push_back(prefix + "mlp.act_fn");
    layers_.push_back(std::move(layer));
  }
  if (last_stage()) {
    final_norm_ = add_norm("model.norm", false, eps);
    untied_head_name_ = "lm_head.weight";
    lm_head_ = tied ? embedding_ : &add_parameter(untied_head_name_, {config.vocab_size, C}, dtype);
    if (tied) weightless_modules_.push_back("lm_head");
  }
  weightless_modules_.push_back("model.rotary_emb");
  check_built("q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj");
}

LlamaModel::~LlamaModel() = default;

const NormParameters& LlamaModel::input_norm(size_t index) const { return layers_[index]->input_norm; }

std::unique_ptr<CausalLM::SavedActivations> LlamaModel::forward_layer(size_t index, const Tensor& x,
                                                                      NormOutput& norm, Tensor* out,
                                                                      const TokenLayout& layout) {
  Backend& be = backend_;
  Layer& layer = *layers_[index];
  auto kept = std::make_unique<LayerActivations>();
  LayerActivations& saved = *kept;
  const int64_t B = x.dim(0), T = x.dim(1), N = B * T, C = config_.hidden_size;
  const int64_t Hq = local_heads(), Hkv = local_kv_heads(), D = config_.head_dim;
  const DType act = options_.activation_dtype;
  const Tensor x2d = x.reshaped({N, C});
  saved.norm1 = std::move(norm);  // owned by the saved activations from here: freed with them
  norm = {};

  AttentionActivations& attention = saved.attention;
  const Tensor q = be.empty({B, T, Hq, D}, act, MemCategory::activations);
  const Tensor k = be.empty({B, T, Hkv, D}, act, MemCategory::activations);
  const Tensor v = be.empty({B, T, Hkv, D}, act, MemCategory::activations);
  attention.q = q;
  attention.k = k;
  attention.v = v;
  Tensor q2d = q.reshaped({N, Hq * D}), k2d = k.reshaped({N, Hkv * D}), v2d = v.reshaped({N, Hkv * D});
  {
    const InputShare share(saved.norm1.out, {layer.q_proj.get(), layer.k_proj.get(), layer.v_proj.get()});
    layer.q_proj->forward(be, q2d, saved.norm1.out);
    layer.k_proj->forward(be, k2d, saved.norm1.out);
    layer.v_proj->forward(be, v2d, saved.norm1.out);
  }
  attention_forward(attention, layout);

  Tensor projected = be.empty({N, C}, act, MemCategory::activations);
  layer.o_proj->forward(be, projected, attention.attn.reshaped({N, Hq * D}));
  tensor_sum(projected);
  saved.residual_mid = be.empty({N, C}, act, MemCategory::activations);
  saved.norm2 = add_norm_forward(layer.post_attention_norm, saved.residual_mid, x2d, projected);
  // A recomputation stops before down_proj: backward reads its input (act),
  // and its output only makes the layer output, which is already kept.
  // Chunked, it stops before the MLP: backward recomputes it by chunks.
  if (!mlp_chunked()) {
    MlpRows mlp = mlp_rows(layer, saved.norm2.out, 0, N);
    saved.gate = mlp.gate;
    saved.up = mlp.up;
    saved.act = mlp.act;
  }
  if (!out) return kept;
  if (mlp_chunked()) scan_mlp_inputs(layer, saved.norm2.out, true);
  for (int64_t first = 0, rows = mlp_chunk_rows(N); first < N; first += rows) {
    rows = std::min(rows, N - first);
    Tensor projected_rows = projected.slice_rows(first, rows);
    layer.down_proj->set_first_row(first);
    if (!mlp_chunked()) {
      layer.down_proj->forward(be, projected_rows, saved.act);
      continue;
    }
    MlpRows mlp = mlp_rows(layer, saved.norm2.out, first, rows);
    mlp.gate = mlp.up = Tensor{};  // only act is read from here on
    layer.down_proj->forward(be, projected_rows, mlp.act);
  }
  end_mlp_scans(layer);
  tensor_sum(projected);
  Tensor out2d = out->reshaped({N, C});
  add_next_norm(index, out2d, norm, saved.residual_mid, projected);
  return kept;
}

// gate, up and act = silu(gate) * up for rows [first, first + rows) of the
// MLP input norm2.
LlamaModel::MlpRows LlamaModel::mlp_rows(Layer& layer, const Tensor& norm2, int64_t first, int64_t rows) {
  Backend& be = backend_;
  const int64_t I = config_.intermediate_size / tensor_ranks();
  const DType act = options_.activation_dtype;
  const Tensor x = norm2.slice_rows(first, rows);
  MlpRows mlp{be.empty({rows, I}, act, MemCategory::activations), be.empty({rows, I}, act, MemCategory::activations),
              be.empty({rows, I}, act, MemCategory::activations)};
  layer.gate_proj->set_first_row(first);
  layer.up_proj->set_first_row(first);
  {
    const InputShare share(x, {layer.gate_proj.get(), layer.up_proj.get()});
    layer.gate_proj->forward(be, mlp.gate, x);
    layer.up_proj->forward(be, mlp.up, x);
  }
  be.swiglu_forward(mlp.act, mlp.gate, mlp.up);
  return mlp;
}

// Chunked, the MLP's bases see the whole batch before the chunks
// (Linear::scan_rows): gate and up read norm2, whole already. down_proj's
// input exists a chunk at a time, so where down_proj scans (LLM.int8() with
// outliers) the forward computes the chunks' act once more first: two of
// the MLP's three products again, the price of chunks over such a base.
// One chunk holding every row (a short batch, a decoding step) is the whole
// call already: nothing to scan.
void LlamaModel::scan_mlp_inputs(Layer& layer, const Tensor& norm2, bool with_down_proj) {
  const int64_t N = norm2.rows();
  if (mlp_chunk_rows(N) >= N) return;
  layer.gate_proj->scan_rows(backend_, norm2);
  layer.up_proj->scan_rows(backend_, norm2);
  for (int64_t first = 0, rows = mlp_chunk_rows(N); with_down_proj && layer.down_proj->scans_rows() && first < N;
       first += rows) {
    rows = std::min(rows, N - first);
    MlpRows mlp = mlp_rows(layer, norm2, first, rows);
    mlp.gate = mlp.up = Tensor{};
    layer.down_proj->scan_rows(backend_, mlp.act);
  }
}

void LlamaModel::end_mlp_scans(Layer& layer) {
  layer.gate_proj->end_scan();
  layer.up_proj->end_scan();
  layer.down_proj->end_scan();
}

// ---- backward ------------------------------------------------------------

// The MLP's backward over the rows of mlp, from row `first`: dnorm's rows =
// d(loss)/d(norm2) from dres's (d(loss)/d(MLP output)), and the MLP's
// parameter gradients += those rows' share.
void LlamaModel::mlp_backward_rows(Layer& layer, const MlpRows& mlp, const Tensor& norm2, Tensor& dres,
                                   Tensor& dnorm, int64_t first) {
  Backend& be = backend_;
  const int64_t rows = mlp.act.rows(), I = mlp.act.cols();
  const DType act = options_.activation_dtype;
  const Tensor x = norm2.slice_rows(first, rows), dout = dres.slice_rows(first, rows);
  Tensor dx = dnorm.slice_rows(first, rows);
  Tensor dact = be.empty({rows, I}, act, MemCategory::activations);
  layer.down_proj->set_first_row(first);
  layer.down_proj->backward(be, &dact, dout, mlp.act, false);
  Tensor dgate = be.empty({rows, I}, act, MemCategory::activations);
  Tensor dup = be.empty({rows, I}, act, MemCategory::activations);
  be.swiglu_backward(dgate, dup, dact, mlp.gate, mlp.up);
  layer.gate_proj->set_first_row(first);
  layer.up_proj->set_first_row(first);
  layer.gate_proj->backward(be, &dx, dgate, x, false);
  layer.up_proj->backward(be, &dx, dup, x, true);
}

void LlamaModel::backward_layer(size_t index, SavedActivations& kept, Tensor& dresidual, const Tensor& x,
                                const TokenLayout& layout, bool input_grad) {
  Backend& be = backend_;
  Layer& layer = *layers_[index];
  LayerActivations& saved = static_cast<LayerActivations&>(kept);
  const int64_t B = x.dim(0), T = x.dim(1), N = B * T, C = config_.hidden_size;
  const int64_t Hq = local_heads(), Hkv = local_kv_heads(), D = config_.head_dim;
  const DType act = options_.activation_dtype;
  Tensor dres = dresidual.reshaped({N, C});
  Tensor dnorm = be.empty({N, C}, act, MemCategory::activations);

  // MLP block: out = residual_mid + down(silu(gate(n2)) * up(n2)).
  if (!mlp_chunked()) mlp_backward_rows(layer, {saved.gate, saved.up, saved.act}, saved.norm2.out, dres, dnorm, 0);
  // down_proj's backward reads outliers only to recompute DoRA's forward.
  if (mlp_chunked()) scan_mlp_inputs(layer, saved.norm2.out, uses_dora());
  for (int64_t first = 0, rows = mlp_chunk_rows(N); mlp_chunked() && first < N; first += rows) {
    rows = std::min(rows, N - first);
    mlp_backward_rows(layer, mlp_rows(layer, saved.norm2.out, first, rows), saved.norm2.out, dres, dnorm, first);
  }
  end_mlp_scans(layer);
  tensor_sum(dnorm);  // gate's and up's input gradients from this rank's features
  norm_backward_add(dres, layer.post_attention_norm, dnorm, saved.residual_mid, saved.norm2);
  // The attention block's backward, the layer's peak at long contexts,
  // reads none of the MLP block's activations: freed here, not with the layer.
  saved.gate = saved.up = saved.act = saved.residual_mid = Tensor{};
  saved.norm2 = NormOutput{};

  // Attention block: residual_mid = x + o(attention(rope(q(n1)), rope(k(n1)), v(n1))).
  {
    Tensor dattn = be.empty({B, T, Hq, D}, act, MemCategory::activations);
    Tensor dattn2d = dattn.reshaped({N, Hq * D});
    layer.o_proj->backward(be, &dattn2d, dres, saved.attention.attn.reshaped({N, Hq * D}), false);
    const Tensor dq = be.empty({B, T, Hq, D}, act, MemCategory::activations);
    const Tensor dk = be.empty({B, T, Hkv, D}, act, MemCategory::activations);
    const Tensor dv = be.empty({B, T, Hkv, D}, act, MemCategory::activations);
    attention_backward(saved.attention, dattn, layout, {dq, dk, dv});
    // The MLP's input gradient reaches this block through residual_mid;
    // this block's own reaches only the layer input.
    Tensor* dinput = input_grad || trains(layer.input_norm) ? &dnorm : nullptr;
    layer.q_proj->backward(be, dinput, dq.reshaped({N, Hq * D}), saved.norm1.out, false);
    layer.k_proj->backward(be, dinput, dk.reshaped({N, Hkv * D}), saved.norm1.out, true);
    layer.v_proj->backward(be, dinput, dv.reshaped({N, Hkv * D}), saved.norm1.out, true);
    if (!dinput) return;
    tensor_sum(dnorm);
  }
  norm_backward_add(dres, layer.input_norm, dnorm, x.reshaped({N, C}), saved.norm1);
}

}  // namespace ft
