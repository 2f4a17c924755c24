#include "model/gpt_neox.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace ft {

using nlohmann::json;

// GPT-NeoX (transformers' GPTNeoXConfig): head_dim is always hidden_size /
// num_attention_heads; checkpoints from transformers 4 carry rotary_pct and
// rotary_emb_base at the top level, transformers 5 writes rope_parameters.
void read_gpt_neox_config(const json& config, ModelConfig& result, const std::string& source) {
  read_decoder_fields(config, result, source);
  FT_CHECK(result.hidden_size % result.num_attention_heads == 0, source, ": hidden_size (", result.hidden_size,
           ") must be a multiple of num_attention_heads (", result.num_attention_heads, ")");
  result.num_key_value_heads = result.num_attention_heads;
  result.head_dim = result.hidden_size / result.num_attention_heads;
  result.rotary_pct = optional_value<double>(config, "rotary_pct", 0.25, source);
  result.rope_theta = optional_value<float>(config, "rotary_emb_base", result.rope_theta, source);
  read_rope(config, result, source);
  result.layer_norm_eps = optional_value<float>(config, "layer_norm_eps", result.layer_norm_eps, source);
  result.use_parallel_residual = optional_value<bool>(config, "use_parallel_residual", true, source);
  result.attention_bias = optional_value<bool>(config, "attention_bias", true, source);
  result.hidden_act = optional_value<std::string>(config, "hidden_act", "gelu", source);
  const std::string& act = result.hidden_act;
  FT_CHECK(act == "gelu" || act == "gelu_new" || act == "gelu_fast" || act == "gelu_pytorch_tanh", source,
           ": hidden_act \"", act, "\" is not supported for ", result.model_type, " (expected \"gelu\", \"gelu_new\", "
           "\"gelu_fast\" or \"gelu_pytorch_tanh\")");
  FT_CHECK(result.rotary_pct > 0.0 && result.rotary_pct <= 1.0 && result.rotary_dim() % 2 == 0 &&
               result.rotary_dim() > 0,
           source, ": rotary_pct ", result.rotary_pct, " must give an even, positive number of rotary features ",
           "per head (head_dim ", result.head_dim, " * rotary_pct = ", double(result.head_dim) * result.rotary_pct, ")");
  FT_CHECK(result.layer_norm_eps > 0, source, ": layer_norm_eps must be positive, got ", result.layer_norm_eps);
  check_decoder_fields(result, source);
}

struct GptNeoxModel::Layer {
  NormParameters input_norm, post_attention_norm;
  std::unique_ptr<Linear> query_key_value, dense, dense_h_to_4h, dense_4h_to_h;
};

// What one layer's backward needs from its forward.
struct GptNeoxModel::LayerActivations final : SavedActivations {
  NormOutput norm1;            // input_layernorm output [N, C] and its f32 statistics [N]
  AttentionActivations attention;
  Tensor residual_mid;         // sequential residual only: x + attention block output [N, C]
  NormOutput norm2;            // post_attention_layernorm output and statistics
  Tensor h;                    // dense_h_to_4h output [N, I], before GELU
};

GptNeoxModel::GptNeoxModel(const ModelConfig& config, Backend& backend, const ModelOptions& options)
    : CausalLM(config, backend, options) {
  gelu_kind_ = config.hidden_act == "gelu" ? GeluKind::erf : GeluKind::tanh;
  const int64_t C = config.hidden_size, I = config.intermediate_size, V = config.vocab_size;
  const DType dtype = options.weight_dtype;
  const float eps = config.layer_norm_eps;
  // A pipeline stage holds its layers only (null elsewhere), the embedding
  // on the first stage (and the last, when lm_head is tied to it).
  const LayerRange& stage = layers();
  const bool tied = config.tie_word_embeddings;
  const int64_t ranks = tensor_ranks();
  check_tensor_split(config, ranks, "parallel.tensor: " + std::to_string(ranks) + ": ");
  if (first_stage() || (tied && last_stage()))
    embedding_ = &add_parameter("gpt_neox.embed_in.weight", {V, C}, dtype);
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    if (i < stage.first_layer || i >= stage.end_layer) {
      layers_.push_back(nullptr);
      continue;
    }
    const std::string prefix = "gpt_neox.layers." + std::to_string(i) + ".";
    auto layer = std::make_unique<Layer>();
    layer->input_norm = add_norm(prefix + "input_layernorm", true, eps);
    layer->post_attention_norm = add_norm(prefix + "post_attention_layernorm", true, eps);
    // Tensor parallel: query_key_value's rows are [H, 3, D] (per head q, k,
    // v), so a share of them is a share of the heads.
    const ParallelLinear column = ParallelLinear::column, row = ParallelLinear::row;
    layer->query_key_value =
        make_linear(prefix + "attention.query_key_value", 3 * C, C, config.attention_bias, column);
    layer->dense = make_linear(prefix + "attention.dense", C, C, config.attention_bias, row);
    layer->dense_h_to_4h = make_linear(prefix + "mlp.dense_h_to_4h", I, C, true, column);
    layer->dense_4h_to_h = make_linear(prefix + "mlp.dense_4h_to_h", C, I, true, row);
    for (const char* module : {"mlp.act", "post_attention_dropout", "post_mlp_dropout"})
      weightless_modules_.push_back(prefix + module);
    layers_.push_back(std::move(layer));
  }
  if (last_stage()) {
    final_norm_ = add_norm("gpt_neox.final_layer_norm", true, eps);
    untied_head_name_ = "embed_out.weight";
    lm_head_ = tied ? embedding_ : &add_parameter(untied_head_name_, {V, C}, dtype);
    // transformers 5 calls the head lm_head (embed_out in checkpoints and transformers 4): refused under both.
    weightless_modules_.push_back("lm_head");
    if (tied) weightless_modules_.push_back("embed_out");
  }
  weightless_modules_.insert(weightless_modules_.end(), {"gpt_neox.rotary_emb", "gpt_neox.emb_dropout"});
  check_built("query_key_value, dense, dense_h_to_4h, dense_4h_to_h");
}

GptNeoxModel::~GptNeoxModel() = default;

const NormParameters& GptNeoxModel::input_norm(size_t index) const { return layers_[index]->input_norm; }

// ---- forward -------------------------------------------------------------

// out [N, C] = dense(attention(rope(q), rope(k), v)) with q, k, v from
// query_key_value(saved.norm1). Without out it stops before dense, whose
// output backward does not read.
void GptNeoxModel::forward_attention(Layer& layer, LayerActivations& saved, int64_t B, int64_t T, Tensor* out,
                                     const TokenLayout& layout) {
  Backend& be = backend_;
  const DType act = options_.activation_dtype;
  const int64_t N = B * T, H = local_heads(), D = config_.head_dim;
  Tensor qkv = be.empty({N, 3 * H * D}, act, MemCategory::activations);
  layer.query_key_value->forward(be, qkv, saved.norm1.out);
  // HF's fused layout: each token's 3C outputs are [H, 3, D], per head q then
  // k then v. Rope and attention use them in place (the views keep qkv).
  const Tensor heads = qkv.reshaped({B, T, H, 3 * D});
  AttentionActivations& attention = saved.attention;
  attention.q = HeadsView(heads, 0, D);
  attention.k = HeadsView(heads, D, D);
  attention.v = HeadsView(heads, 2 * D, D);
  attention_forward(attention, layout);
  if (!out) return;
  layer.dense->forward(be, *out, attention.attn.reshaped({N, H * D}));
  tensor_sum(*out);
}

// out [N, C] = dense_4h_to_h(gelu(dense_h_to_4h(saved.norm2))). Without out
// it stops at h: backward recomputes the GELU from h and reads nothing else.
// Chunked, h is not kept either (backward recomputes it by chunks), and the
// MLP runs mlp_chunk_rows tokens at a time.
void GptNeoxModel::forward_mlp(Layer& layer, LayerActivations& saved, Tensor* out) {
  const int64_t N = saved.norm2.out.rows();
  if (!mlp_chunked()) {
    saved.h = mlp_hidden(layer, saved.norm2.out, 0, N);
    if (out) mlp_output_rows(layer, saved.h, *out, 0);
  }
  if (mlp_chunked() && out) scan_mlp_inputs(layer, saved.norm2.out, true);
  for (int64_t first = 0, rows = mlp_chunk_rows(N); mlp_chunked() && out && first < N; first += rows) {
    rows = std::min(rows, N - first);
    Tensor out_rows = out->slice_rows(first, rows);
    mlp_output_rows(layer, mlp_hidden(layer, saved.norm2.out, first, rows), out_rows, first);
  }
  end_mlp_scans(layer);
  if (out) tensor_sum(*out);
}

// Chunked, the MLP's bases see the whole batch before the chunks
// (Linear::scan_rows): dense_h_to_4h reads norm2, whole already.
// dense_4h_to_h's input exists a chunk at a time, so where it scans
// (LLM.int8() with outliers) the forward computes the chunks' GELU output
// once more first: the price of chunks over such a base. One chunk holding
// every row is the whole call already: nothing to scan.
void GptNeoxModel::scan_mlp_inputs(Layer& layer, const Tensor& norm2, bool with_output_layer) {
  const int64_t N = norm2.rows();
  if (mlp_chunk_rows(N) >= N) return;
  layer.dense_h_to_4h->scan_rows(backend_, norm2);
  for (int64_t first = 0, rows = mlp_chunk_rows(N);
       with_output_layer && layer.dense_4h_to_h->scans_rows() && first < N; first += rows) {
    rows = std::min(rows, N - first);
    layer.dense_4h_to_h->scan_rows(backend_, mlp_activation(mlp_hidden(layer, norm2, first, rows)));
  }
}

void GptNeoxModel::end_mlp_scans(Layer& layer) {
  layer.dense_h_to_4h->end_scan();
  layer.dense_4h_to_h->end_scan();
}

// h [rows, I] = dense_h_to_4h(rows [first, first + rows) of norm2).
Tensor GptNeoxModel::mlp_hidden(Layer& layer, const Tensor& norm2, int64_t first, int64_t rows) {
  Tensor h = backend_.empty({rows, config_.intermediate_size / tensor_ranks()}, options_.activation_dtype,
                            MemCategory::activations);
  layer.dense_h_to_4h->set_first_row(first);
  layer.dense_h_to_4h->forward(backend_, h, norm2.slice_rows(first, rows));
  return h;
}

// out_rows = dense_4h_to_h(gelu(h)), h the MLP's hidden rows from row `first`.
void GptNeoxModel::mlp_output_rows(Layer& layer, const Tensor& h, Tensor& out_rows, int64_t first) {
  layer.dense_4h_to_h->set_first_row(first);
  layer.dense_4h_to_h->forward(backend_, out_rows, mlp_activation(h));
}

// gelu(h), the MLP's second layer's input.
Tensor GptNeoxModel::mlp_activation(const Tensor& h) {
  Tensor gelu_out = backend_.empty(h.shape, options_.activation_dtype, MemCategory::activations);
  backend_.gelu_forward(gelu_out, h, gelu_kind_);
  return gelu_out;
}

// Parallel residual: out = (x + attn(ln1(x))) + mlp(ln2(x)).
// Sequential:        mid = x + attn(ln1(x)); out = mid + mlp(ln2(mid)).
std::unique_ptr<CausalLM::SavedActivations> GptNeoxModel::forward_layer(size_t index, const Tensor& x,
                                                                        NormOutput& norm, Tensor* out,
                                                                        const TokenLayout& layout) {
  Backend& be = backend_;
  const DType act = options_.activation_dtype;
  Layer& layer = *layers_[index];
  auto kept = std::make_unique<LayerActivations>();
  LayerActivations& saved = *kept;
  const int64_t B = x.dim(0), T = x.dim(1), N = B * T, C = config_.hidden_size;
  const bool parallel = config_.use_parallel_residual;
  const Tensor x2d = x.reshaped({N, C});
  saved.norm1 = std::move(norm);  // owned by the saved activations from here: freed with them
  norm = {};
  // A recomputation (no out) computes only what backward reads: not the MLP
  // output, nor the parallel form's attention output, which only make the
  // layer output (already kept). The sequential form's makes mid.
  Tensor attn_out;
  if (out || !parallel) attn_out = be.empty({N, C}, act, MemCategory::activations);
  forward_attention(layer, saved, B, T, attn_out.defined() ? &attn_out : nullptr, layout);
  if (parallel) {
    saved.norm2 = norm_forward(layer.post_attention_norm, x2d);
  } else {
    saved.residual_mid = be.empty({N, C}, act, MemCategory::activations);
    saved.norm2 = add_norm_forward(layer.post_attention_norm, saved.residual_mid, x2d, attn_out);
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

// ---- backward ------------------------------------------------------------

// dnorm (overwritten; null: not wanted) = d(loss)/d(saved.norm2) from dout =
// d(loss)/d(mlp output).
void GptNeoxModel::backward_mlp(Layer& layer, LayerActivations& saved, const Tensor& dout, Tensor* dnorm) {
  const int64_t N = dout.rows();
  if (!mlp_chunked()) backward_mlp_rows(layer, saved.h, saved.norm2.out, dout, dnorm, 0);
  // dense_4h_to_h's backward reads outliers only to recompute DoRA's forward.
  if (mlp_chunked()) scan_mlp_inputs(layer, saved.norm2.out, uses_dora());
  for (int64_t first = 0, rows = mlp_chunk_rows(N); mlp_chunked() && first < N; first += rows) {
    rows = std::min(rows, N - first);
    backward_mlp_rows(layer, mlp_hidden(layer, saved.norm2.out, first, rows), saved.norm2.out, dout, dnorm, first);
  }
  end_mlp_scans(layer);
  if (dnorm) tensor_sum(*dnorm);  // dense_h_to_4h's input gradient from this rank's features
}

// backward_mlp over the rows of h, from row `first` of norm2, dout and dnorm.
void GptNeoxModel::backward_mlp_rows(Layer& layer, const Tensor& h, const Tensor& norm2, const Tensor& dout,
                                     Tensor* dnorm, int64_t first) {
  Backend& be = backend_;
  const DType act = options_.activation_dtype;
  const int64_t rows = h.rows();
  // GELU is recomputed rather than saved: one cheap elementwise pass instead
  // of an [N, I] activation kept per layer.
  const Tensor gelu_out = mlp_activation(h);
  Tensor dact = be.empty(h.shape, act, MemCategory::activations);
  layer.dense_4h_to_h->set_first_row(first);
  layer.dense_4h_to_h->backward(be, &dact, dout.slice_rows(first, rows), gelu_out, false);
  be.gelu_backward(dact, dact, h, gelu_kind_);
  Tensor dnorm_rows = dnorm ? dnorm->slice_rows(first, rows) : Tensor{};
  layer.dense_h_to_4h->set_first_row(first);
  layer.dense_h_to_4h->backward(be, dnorm ? &dnorm_rows : nullptr, dact, norm2.slice_rows(first, rows), false);
}

// dnorm (overwritten; null: not wanted) = d(loss)/d(saved.norm1) from dout =
// d(loss)/d(attention block output).
void GptNeoxModel::backward_attention(Layer& layer, LayerActivations& saved, const Tensor& dout, Tensor* dnorm,
                                      const TokenLayout& layout) {
  Backend& be = backend_;
  const DType act = options_.activation_dtype;
  const AttentionActivations& attention = saved.attention;
  const int64_t N = attention.q.dim(0) * attention.q.dim(1), D = config_.head_dim, HD = local_heads() * D;
  Tensor dattn = be.empty(attention.attn.shape, act, MemCategory::activations);
  Tensor dattn2d = dattn.reshaped({N, HD});
  layer.dense->backward(be, &dattn2d, dout, attention.attn.reshaped({N, HD}), false);
  // Straight into HF's fused [H, 3, D] layout; the three views cover every column.
  Tensor dqkv = be.empty({N, 3 * HD}, act, MemCategory::activations);
  const Tensor dheads = dqkv.reshaped(attention.q.rows.shape);
  attention_backward(attention, dattn, layout, {HeadsView(dheads, 0, D), HeadsView(dheads, D, D),
                                                    HeadsView(dheads, 2 * D, D)});
  layer.query_key_value->backward(be, dnorm, dqkv, saved.norm1.out, false);
  if (dnorm) tensor_sum(*dnorm);
}

void GptNeoxModel::backward_layer(size_t index, SavedActivations& kept, Tensor& dresidual, const Tensor& x,
                                  const TokenLayout& layout, bool input_grad) {
  Backend& be = backend_;
  const DType act = options_.activation_dtype;
  Layer& layer = *layers_[index];
  LayerActivations& saved = static_cast<LayerActivations&>(kept);
  const int64_t N = x.dim(0) * x.dim(1), C = config_.hidden_size;
  const bool parallel = config_.use_parallel_residual;
  const Tensor x2d = x.reshaped({N, C});
  Tensor dres = dresidual.reshaped({N, C});
  Tensor dnorm = be.empty({N, C}, act, MemCategory::activations);
  // Which input gradients anything reads: the layer input's (input_grad),
  // a training norm's, and, sequential, the MLP's (it reaches mid).
  const bool mlp_input_grad = input_grad || !parallel || trains(layer.post_attention_norm);
  const bool attention_input_grad = input_grad || trains(layer.input_norm);

  backward_mlp(layer, saved, dres, mlp_input_grad ? &dnorm : nullptr);
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
    norm_backward_add(dres, layer.post_attention_norm, dnorm, saved.residual_mid, saved.norm2);
  backward_attention(layer, saved, dres, attention_input_grad ? &dnorm_attention : nullptr, layout);
  if (attention_input_grad) norm_backward_add(dres, layer.input_norm, dnorm_attention, x2d, saved.norm1);
  if (parallel && mlp_input_grad) norm_backward_add(dres, layer.post_attention_norm, dnorm, x2d, saved.norm2);
}

}  // namespace ft
