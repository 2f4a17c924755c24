#include "model/t5.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "kernels/error.h"
#include "model/safetensors.h"

namespace ft {

using nlohmann::json;

// T5 (transformers' T5Config) under its own field names. v1.0 scales the
// decoder output by d_model^-0.5 before its head, the shared embedding
// (tie_word_embeddings, default true); v1.1 and FLAN-T5 write false and carry
// their own lm_head, unscaled. dropout_rate is not applied: no dropout runs
// in the base model, only LoRA's.
void read_t5_config(const json& config, ModelConfig& result, const std::string& source) {
  result.hidden_size = required_int(config, "d_model", source);
  result.intermediate_size = required_int(config, "d_ff", source);
  result.num_hidden_layers = required_int(config, "num_layers", source);
  result.num_decoder_layers =
      config.contains("num_decoder_layers") && !config["num_decoder_layers"].is_null()
          ? required_int(config, "num_decoder_layers", source)
          : result.num_hidden_layers;
  result.num_attention_heads = required_int(config, "num_heads", source);
  result.num_key_value_heads = result.num_attention_heads;
  result.head_dim = required_int(config, "d_kv", source);
  result.vocab_size = required_int(config, "vocab_size", source);
  result.relative_attention_num_buckets = optional_value<int64_t>(config, "relative_attention_num_buckets", 32, source);
  result.relative_attention_max_distance =
      optional_value<int64_t>(config, "relative_attention_max_distance", 128, source);
  FT_CHECK(result.relative_attention_num_buckets >= 4 && result.relative_attention_max_distance > 0, source,
           ": relative_attention_num_buckets must be at least 4 and relative_attention_max_distance positive, got ",
           result.relative_attention_num_buckets, " and ", result.relative_attention_max_distance);
  result.rms_norm_eps = optional_value<float>(config, "layer_norm_epsilon", 1e-6f, source);
  FT_CHECK(result.rms_norm_eps > 0, source, ": layer_norm_epsilon must be positive, got ", result.rms_norm_eps);
  const std::string ffn = optional_value<std::string>(config, "feed_forward_proj", "relu", source);
  FT_CHECK(ffn == "relu" || ffn == "gated-gelu", source, ": feed_forward_proj \"", ffn,
           "\" is not supported for ", result.model_type, " (expected \"relu\" or \"gated-gelu\")");
  result.gated_ffn = ffn == "gated-gelu";
  result.hidden_act = ffn == "relu" ? "relu" : "gelu_new";
  // transformers 5 writes tie_word_embeddings true for every T5 and keeps
  // v1.0's scaling as scale_decoder_outputs; it ties an unscaled head only
  // when the checkpoint beside config.json has no lm_head.weight of its own
  // (a v1.1 it built from a config). Without a checkpoint (a config for
  // `finetune plan`) an unscaled head is untied, as released v1.1 ones are.
  const bool tie = optional_value<bool>(config, "tie_word_embeddings", true, source);
  result.scale_decoder_outputs = optional_value<bool>(config, "scale_decoder_outputs", tie, source);
  const std::filesystem::path folder = std::filesystem::path(source).parent_path();
  std::error_code error;
  const bool weights = std::filesystem::exists(folder / "model.safetensors", error) ||
                       std::filesystem::exists(folder / "model.safetensors.index.json", error);
  result.tie_word_embeddings =
      result.scale_decoder_outputs || (tie && weights && !Checkpoint(folder.string()).contains("lm_head.weight"));
  // T5's checkpoints set decoder_start_token_id to pad_token_id (0); an
  // absent one falls back to pad_token_id, as T5's documentation describes.
  const int64_t pad = optional_value<int64_t>(config, "pad_token_id", 0, source);
  result.decoder_start_token_id = optional_value<int64_t>(config, "decoder_start_token_id", pad, source);
  FT_CHECK(result.decoder_start_token_id >= 0 && result.decoder_start_token_id < result.vocab_size, source,
           ": decoder_start_token_id ", result.decoder_start_token_id, " is outside the vocabulary [0, ",
           result.vocab_size, ")");
}


// One T5Attention (SelfAttention or EncDecAttention) with the layer norm before it.
struct T5Model::Attention {
  NormParameters norm;
  std::unique_ptr<Linear> q, k, v, o;
};

// DenseReluDense: wi (v1.0) or wi_0 and wi_1 (gated-gelu), then wo.
struct T5Model::FeedForward {
  NormParameters norm;
  std::unique_ptr<Linear> wi_0, wi_1, wo;  // wi_0 holds "wi" when not gated; wi_1 null then
};

struct T5Model::Block {
  Attention self_attention, cross_attention;  // cross: decoder blocks only
  FeedForward feed_forward;
};

struct T5Model::Stack {
  std::vector<Block> blocks;
  Parameter* relative_bias = nullptr;  // block 0's relative_attention_bias [buckets, H]
  NormParameters final_norm;
  bool decoder = false;
  // Encoder blocks: self-attention, feed-forward; decoder blocks add cross-attention between.
  int64_t sublayers_per_block() const { return decoder ? 3 : 2; }
};

// What one sublayer's backward reads from its forward.
struct T5Model::SublayerActivations {
  NormOutput norm;            // the sublayer's input under its layer norm
  Tensor q, k, v, attn, lse;  // attention [B, T, H, D]; cross-attention's k and v over the encoder's tokens
  Tensor gate, up, act;       // feed-forward [N, F]; up only when gated
};

// One stack's pass over a batch.
struct T5Model::StackRun {
  int64_t batch = 0, seq = 0;
  Tensor ids;                     // i32 [B*T]
  Tensor encoder_lengths;         // i32 [B]: the encoder rows' real tokens, or empty: whole rows
  Tensor bucket_ids, bias;        // i32 [T*T] and the relative position bias [T, T, H]
  std::vector<Tensor> residuals;  // residuals[k]: input of sublayer k; back(): output of the last
  std::vector<SublayerActivations> sublayers;
  NormOutput final_norm;          // residuals.back() under the final layer norm
};

T5Model::T5Model(const ModelConfig& config, Backend& backend, const ModelOptions& options)
    : LanguageModel(config, backend, options), encoder_(new Stack), decoder_(new Stack) {
  FT_CHECK(options.activation_checkpointing == ActivationCheckpointing::none,
           "t5: activation checkpointing is not supported (every activation of a step is kept)");
  FT_CHECK(options.mlp_chunk_tokens == 0,
           "t5: mlp_chunk_tokens is not supported (the decoder-only families' MLP runs chunked)");
  // transformers 5 hooks NEFTune on get_input_embeddings(), T5's `shared`,
  // which its forward never calls: each stack embeds through its own
  // embed_tokens module, tied to `shared` by weight only
  // (scripts/make_neftune_fixture.py records it), so there NEFTune adds nothing.
  FT_CHECK(options.neftune_noise_alpha == 0.0,
           "t5: neftune_noise_alpha applies to decoder-only models: transformers' NEFTune hook sits on T5's shared "
           "embedding module, which its encoder and decoder never call, so it adds no noise to a T5");
  const int64_t C = config.hidden_size;
  // As transformers + bitsandbytes quantise a T5 (_keep_in_fp32_modules): the
  // feed-forward output, whose activations are the range-sensitive ones,
  // stays 16/32-bit.
  unquantized_modules_ = {".DenseReluDense.wo"};
  embedding_ = &add_parameter("shared.weight", {config.vocab_size, C}, options.weight_dtype);
  add_stack(*encoder_, "encoder.", config.num_hidden_layers, false);
  add_stack(*decoder_, "decoder.", config.num_decoder_layers, true);
  final_norm_ = decoder_->final_norm;
  if (config.scale_decoder_outputs) logits_scale_ = 1.0f / std::sqrt(float(C));
  if (config.tie_word_embeddings) {
    lm_head_ = embedding_;
    weightless_modules_.push_back("lm_head");
  } else {
    lm_head_ = &add_parameter("lm_head.weight", {config.vocab_size, C}, options.weight_dtype);
  }
  check_built(config.gated_ffn ? "q, k, v, o, wi_0, wi_1, wo" : "q, k, v, o, wi, wo");
}

T5Model::~T5Model() = default;

void T5Model::add_stack(Stack& stack, const std::string& prefix, int64_t layers, bool decoder) {
  const int64_t C = config_.hidden_size, F = config_.intermediate_size;
  const int64_t inner = config_.num_attention_heads * config_.head_dim;
  const float eps = config_.rms_norm_eps;
  stack.decoder = decoder;
  stack.blocks.resize(size_t(layers));
  // Each stack embeds through an embed_tokens module of its own (tied to
  // `shared` by weight), which PEFT adapts as an embedding.
  weightless_modules_.insert(weightless_modules_.end(), {prefix + "embed_tokens", prefix + "dropout"});
  auto add_attention = [&](Attention& attention, const std::string& module) {
    attention.q = make_linear(module + ".q", inner, C);
    attention.k = make_linear(module + ".k", inner, C);
    attention.v = make_linear(module + ".v", inner, C);
    attention.o = make_linear(module + ".o", C, inner);
  };
  for (int64_t i = 0; i < layers; ++i) {
    Block& block = stack.blocks[size_t(i)];
    const std::string layer = prefix + "block." + std::to_string(i) + ".layer.";
    add_attention(block.self_attention, layer + "0.SelfAttention");
    if (i == 0)
      stack.relative_bias =
          &add_parameter(layer + "0.SelfAttention.relative_attention_bias.weight",
                         {config_.relative_attention_num_buckets, config_.num_attention_heads}, options_.weight_dtype);
    block.self_attention.norm = add_norm(layer + "0.layer_norm", false, eps);
    if (decoder) {
      add_attention(block.cross_attention, layer + "1.EncDecAttention");
      block.cross_attention.norm = add_norm(layer + "1.layer_norm", false, eps);
    }
    const std::string ff = layer + (decoder ? "2" : "1");
    FeedForward& feed_forward = block.feed_forward;
    if (config_.gated_ffn) {
      feed_forward.wi_0 = make_linear(ff + ".DenseReluDense.wi_0", F, C);
      feed_forward.wi_1 = make_linear(ff + ".DenseReluDense.wi_1", F, C);
    } else {
      feed_forward.wi_0 = make_linear(ff + ".DenseReluDense.wi", F, C);
    }
    feed_forward.wo = make_linear(ff + ".DenseReluDense.wo", C, F);
    feed_forward.norm = add_norm(ff + ".layer_norm", false, eps);
    // transformers' modules without weights: each sublayer's dropout, the feed-forward's activation and dropout.
    weightless_modules_.insert(weightless_modules_.end(), {layer + "0.dropout", ff + ".dropout",
                                                           ff + ".DenseReluDense.act", ff + ".DenseReluDense.dropout"});
    if (decoder) weightless_modules_.push_back(layer + "1.dropout");
  }
  stack.final_norm = add_norm(prefix + "final_layer_norm", false, eps);
}

int32_t t5_relative_position_bucket(int64_t relative_position, bool bidirectional, int64_t num_buckets,
                                    int64_t max_distance) {
  int64_t bucket = 0;
  if (bidirectional) {
    num_buckets /= 2;
    if (relative_position > 0) bucket += num_buckets;
    relative_position = std::abs(relative_position);
  } else {
    relative_position = -std::min<int64_t>(relative_position, 0);
  }
  const int64_t max_exact = num_buckets / 2;
  if (relative_position < max_exact) return int32_t(bucket + relative_position);
  // In f32 as transformers computes it (a float tensor's log, divided by a
  // double rounded to f32), truncated toward zero: the same bucket edges.
  const float log_ratio = float(std::log(double(max_distance) / double(max_exact)));
  const float scaled =
      std::log(float(relative_position) / float(max_exact)) / log_ratio * float(num_buckets - max_exact);
  const int64_t large = std::min<int64_t>(max_exact + int64_t(scaled), num_buckets - 1);
  return int32_t(bucket + large);
}

Tensor t5_decoder_inputs(const Tensor& labels, int64_t decoder_start_token_id, int64_t pad_id, HostAllocator& host) {
  FT_CHECK(labels.dtype == DType::i32 && labels.ndim() == 2, "t5: labels must be host i32 [B, T], got ",
           dtype_name(labels.dtype), " ", shape_string(labels.shape));
  Tensor inputs = Tensor::empty(labels.shape, DType::i32, host, MemCategory::activations);
  const int64_t B = labels.dim(0), T = labels.dim(1);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int32_t previous = t == 0 ? int32_t(decoder_start_token_id) : labels.ptr<int32_t>()[b * T + t - 1];
      inputs.ptr<int32_t>()[b * T + t] = previous == -100 ? int32_t(pad_id) : previous;
    }
  return inputs;
}

T5Rows t5_rows(const Tensor& input_ids, const Tensor& targets, int64_t decoder_start_token_id, int32_t pad_id,
               HostAllocator& host) {
  FT_CHECK(input_ids.dtype == DType::i32 && input_ids.ndim() == 2 && targets.shape == input_ids.shape &&
               targets.dtype == DType::i32,
           "t5: rows must be host i32 input_ids and targets [B, T], got ", shape_string(input_ids.shape), " and ",
           shape_string(targets.shape));
  const int64_t B = input_ids.dim(0), T = input_ids.dim(1);
  const int32_t* inputs = input_ids.ptr<int32_t>();
  const int32_t* target_ids = targets.ptr<int32_t>();
  std::vector<int64_t> first(size_t(B), T), label_count(size_t(B), 0);  // first counted target, labels
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      if (target_ids[b * T + t] != -100) {
        first[size_t(b)] = std::min(first[size_t(b)], t);
        label_count[size_t(b)] += 1;
      }
  T5Rows out;
  int64_t S = 1, L = 1;
  for (int64_t b = 0; b < B; ++b) {
    out.encoder_lengths.push_back(int32_t(label_count[size_t(b)] ? first[size_t(b)] + 1 : 1));
    S = std::max<int64_t>(S, out.encoder_lengths.back());
    L = std::max(L, label_count[size_t(b)]);
  }
  out.encoder_ids = Tensor::empty({B, S}, DType::i32, host, MemCategory::activations);
  out.labels = Tensor::empty({B, L}, DType::i32, host, MemCategory::activations);
  std::fill_n(out.encoder_ids.ptr<int32_t>(), B * S, pad_id);
  std::fill_n(out.labels.ptr<int32_t>(), B * L, -100);
  for (int64_t b = 0; b < B; ++b) {
    if (label_count[size_t(b)] == 0) continue;  // an empty row: one pad token, no labels
    std::copy_n(inputs + b * T, out.encoder_lengths[size_t(b)], out.encoder_ids.ptr<int32_t>() + b * S);
    std::copy_n(target_ids + b * T + first[size_t(b)], label_count[size_t(b)], out.labels.ptr<int32_t>() + b * L);
  }
  out.decoder_ids = t5_decoder_inputs(out.labels, decoder_start_token_id, pad_id, host);
  return out;
}

// ---- the step --------------------------------------------------------------

namespace {

// The loader's rows split for the encoder and decoder. T5's decoder starts
// from its pad token, which also fills the padding.
T5Rows loader_rows(const ModelConfig& config, const Tensor& input_ids, const Tensor& targets, HostAllocator& host) {
  const int64_t start = config.decoder_start_token_id;
  return t5_rows(input_ids, targets, start, int32_t(start), host);
}

}  // namespace

float T5Model::forward(const Tensor& input_ids, const Tensor& targets, const Tensor* position_ids) {
  FT_CHECK(!position_ids, "t5: position_ids: an encoder-decoder row is one example, never packed");
  HostAllocator host;
  const T5Rows rows = loader_rows(config_, input_ids, targets, host);
  return forward(rows.encoder_ids, rows.decoder_ids, rows.labels, rows.encoder_lengths);
}

float T5Model::forward_backward(const Tensor& input_ids, const Tensor& targets, float grad_scale,
                                const Tensor* position_ids) {
  FT_CHECK(!position_ids, "t5: position_ids: an encoder-decoder row is one example, never packed");
  HostAllocator host;
  const T5Rows rows = loader_rows(config_, input_ids, targets, host);
  return forward_backward(rows.encoder_ids, rows.decoder_ids, rows.labels, grad_scale, rows.encoder_lengths);
}

float T5Model::forward(const Tensor& encoder_ids, const Tensor& decoder_ids, const Tensor& targets,
                       const std::vector<int32_t>& encoder_lengths) {
  encode(encoder_ids, encoder_lengths);
  const float loss = decode(decoder_ids, targets);
  encoded_ = Tensor{};
  encoded_lengths_ = Tensor{};
  return loss;
}

Tensor T5Model::upload_encoder_lengths(const Tensor& encoder_ids, const std::vector<int32_t>& encoder_lengths) {
  if (encoder_lengths.empty()) return Tensor{};
  const int64_t B = encoder_ids.dim(0), S = encoder_ids.dim(1);
  FT_CHECK(int64_t(encoder_lengths.size()) == B, "t5: ", encoder_lengths.size(), " encoder lengths for ", B,
           " encoder rows");
  HostAllocator host;
  Tensor lengths = Tensor::empty({B, 1}, DType::i32, host, MemCategory::activations);
  for (int64_t b = 0; b < B; ++b) {
    FT_CHECK(encoder_lengths[size_t(b)] >= 1 && encoder_lengths[size_t(b)] <= S, "t5: encoder row ", b,
             " has length ", encoder_lengths[size_t(b)], ", expected 1 to ", S);
    lengths.ptr<int32_t>()[b] = encoder_lengths[size_t(b)];
  }
  return upload_tokens(lengths);
}

void T5Model::encode(const Tensor& encoder_ids, const std::vector<int32_t>& encoder_lengths) {
  set_training(false);
  encoded_ = Tensor{};
  StackRun encoder;
  encoder.ids = upload_tokens(encoder_ids);
  encoder.batch = encoder_ids.dim(0);
  encoder.seq = encoder_ids.dim(1);
  encoder.encoder_lengths = upload_encoder_lengths(encoder_ids, encoder_lengths);
  forward_stack(*encoder_, encoder, nullptr, 0, false);
  encoded_ = encoder.final_norm.out;
  encoded_lengths_ = encoder.encoder_lengths;
  encoded_batch_ = encoder.batch;
  encoded_seq_ = encoder.seq;
}

float T5Model::decode(const Tensor& decoder_ids, const Tensor& targets) {
  FT_CHECK(encoded_.data, "t5: decode() needs encode() first");
  set_training(false);
  StackRun decoder;
  const StepTokens tokens = upload_ids_and_targets(decoder_ids, targets);
  FT_CHECK(tokens.batch == encoded_batch_, "t5: decoder_ids ", shape_string(decoder_ids.shape),
           " and the encoded batch of ", encoded_batch_, " rows differ in batch size");
  decoder.ids = tokens.ids;
  decoder.batch = tokens.batch;
  decoder.seq = tokens.seq;
  decoder.encoder_lengths = encoded_lengths_;
  forward_stack(*decoder_, decoder, &encoded_, encoded_seq_, false);
  return lm_head_loss(decoder.final_norm.out, tokens, nullptr, 0.0f);
}

T5DecoderCache T5Model::make_decoder_cache(int64_t capacity_tokens) {
  FT_CHECK(encoded_.data && encoded_batch_ == 1 && !encoded_lengths_.data,
           "t5: make_decoder_cache needs encode() of one whole row first");
  FT_CHECK(capacity_tokens > 0, "t5: make_decoder_cache needs a capacity of at least one token, got ", capacity_tokens);
  Backend& be = backend_;
  const int64_t H = config_.num_attention_heads, D = config_.head_dim, S = encoded_seq_;
  const DType act = options_.activation_dtype;
  T5DecoderCache cache;
  cache.self.lengths_tokens = {0};
  for (const Block& block : decoder_->blocks) {
    cache.self.keys.push_back(be.empty({1, capacity_tokens, H, D}, act, MemCategory::activations));
    cache.self.values.push_back(be.empty({1, capacity_tokens, H, D}, act, MemCategory::activations));
    cache.cross_keys.push_back(be.empty({1, S, H, D}, act, MemCategory::activations));
    cache.cross_values.push_back(be.empty({1, S, H, D}, act, MemCategory::activations));
    Tensor k = cache.cross_keys.back().reshaped({S, H * D}), v = cache.cross_values.back().reshaped({S, H * D});
    const InputShare share(encoded_, {block.cross_attention.k.get(), block.cross_attention.v.get()});
    block.cross_attention.k->forward(be, k, encoded_);
    block.cross_attention.v->forward(be, v, encoded_);
  }
  return cache;
}

void T5Model::decode_cached(T5DecoderCache& cache, int32_t token) {
  Backend& be = backend_;
  const int64_t position = cache.self.lengths_tokens.at(0), L = position + 1;
  const int64_t H = config_.num_attention_heads, D = config_.head_dim, C = config_.hidden_size;
  FT_CHECK(L <= cache.self.capacity_tokens(), "t5: decode_cached at position ", position, " is past the cache's ",
           cache.self.capacity_tokens(), " positions");
  set_training(false);
  HostAllocator host;
  Tensor host_ids = Tensor::empty({1, 1}, DType::i32, host, MemCategory::activations);
  Tensor host_targets = Tensor::empty({1, 1}, DType::i32, host, MemCategory::activations);
  host_ids.ptr<int32_t>()[0] = token;
  host_targets.ptr<int32_t>()[0] = -100;
  const StepTokens tokens = upload_ids_and_targets(host_ids, host_targets);
  // The relative position bias of query `position` against keys 0..position: row `position` of forward's [T, T, H].
  Tensor buckets = Tensor::empty({1, L}, DType::i32, host, MemCategory::activations);
  for (int64_t j = 0; j < L; ++j)
    buckets.ptr<int32_t>()[j] = t5_relative_position_bucket(j - position, false, config_.relative_attention_num_buckets,
                                                             config_.relative_attention_max_distance);
  Tensor bias = be.empty({1, L, H}, options_.activation_dtype, MemCategory::activations);
  Tensor bias_rows = bias.reshaped({L, H});
  be.embedding_forward(bias_rows, upload_tokens(buckets), decoder_->relative_bias->value);

  Tensor x = be.empty({1, C}, options_.activation_dtype, MemCategory::activations);
  be.embedding_forward(x, tokens.ids, embedding_->value);
  auto add_to_x = [&](const Tensor& y) {
    Tensor sum = be.empty({1, C}, options_.activation_dtype, MemCategory::activations);
    be.add(sum, x, y);
    x = sum;
  };
  for (size_t i = 0; i < decoder_->blocks.size(); ++i) {
    const Block& block = decoder_->blocks[i];
    NormOutput norm = norm_forward(block.self_attention.norm, x);
    // The cache's positions as rows [capacity, H*D]: this token's keys and values go to row `position`.
    const Tensor keys = cache.self.keys[i].reshaped({cache.self.capacity_tokens(), H * D});
    const Tensor values = cache.self.values[i].reshaped({cache.self.capacity_tokens(), H * D});
    Tensor k_row = keys.slice_rows(position, 1), v_row = values.slice_rows(position, 1);
    {
      const InputShare share(norm.out, {block.self_attention.k.get(), block.self_attention.v.get()});
      block.self_attention.k->forward(be, k_row, norm.out);
      block.self_attention.v->forward(be, v_row, norm.out);
    }
    add_to_x(cached_attention(block.self_attention, norm.out, keys.slice_rows(0, L).reshaped({1, L, H, D}),
                              values.slice_rows(0, L).reshaped({1, L, H, D}), &bias));
    norm = norm_forward(block.cross_attention.norm, x);
    add_to_x(cached_attention(block.cross_attention, norm.out, cache.cross_keys[i], cache.cross_values[i], nullptr));
    SublayerActivations saved;
    saved.norm = norm_forward(block.feed_forward.norm, x);
    add_to_x(feed_forward_forward(block.feed_forward, saved));
  }
  const NormOutput final_norm = norm_forward(decoder_->final_norm, x);
  lm_head_loss(final_norm.out, tokens, nullptr, 0.0f);
  cache.self.lengths_tokens[0] = L;
}

LanguageModel::StepTokens T5Model::start_step(const Tensor& encoder_ids, const std::vector<int32_t>& encoder_lengths,
                                              const Tensor& decoder_ids, const Tensor& targets, StackRun& encoder,
                                              StackRun& decoder) {
  FT_CHECK(encoder_ids.dim(0) == decoder_ids.dim(0), "t5: encoder_ids ", shape_string(encoder_ids.shape),
           " and decoder_ids ", shape_string(decoder_ids.shape), " differ in batch size");
  encoder.ids = upload_tokens(encoder_ids);
  encoder.batch = encoder_ids.dim(0);
  encoder.seq = encoder_ids.dim(1);
  const StepTokens tokens = upload_ids_and_targets(decoder_ids, targets);
  decoder.ids = tokens.ids;
  decoder.batch = tokens.batch;
  decoder.seq = tokens.seq;
  encoder.encoder_lengths = decoder.encoder_lengths = upload_encoder_lengths(encoder_ids, encoder_lengths);
  return tokens;
}

void T5Model::backward_both(StackRun& encoder, StackRun& decoder, Tensor& dhidden) {
  const Tensor& encoder_out = encoder.final_norm.out;
  Tensor dencoder_out = backend_.empty(encoder_out.shape, options_.activation_dtype, MemCategory::activations);
  backend_.fill(dencoder_out, 0.0f);
  backward_stack(*decoder_, decoder, dhidden, &encoder_out, &dencoder_out);
  dhidden = Tensor{};
  backward_stack(*encoder_, encoder, dencoder_out, nullptr, nullptr);
}

float T5Model::forward_backward(const Tensor& encoder_ids, const Tensor& decoder_ids, const Tensor& targets,
                                float grad_scale, const std::vector<int32_t>& encoder_lengths) {
  set_training(true);
  StackRun encoder, decoder;
  const StepTokens tokens = start_step(encoder_ids, encoder_lengths, decoder_ids, targets, encoder, decoder);
  forward_stack(*encoder_, encoder, nullptr, 0, true);
  forward_stack(*decoder_, decoder, &encoder.final_norm.out, encoder.seq, true);
  Tensor dhidden;  // d(loss)/d(decoder output) [N, C], made by lm_head_loss
  const float loss = lm_head_loss(decoder.final_norm.out, tokens, &dhidden, grad_scale);
  if (tokens.counted == 0) return loss;
  backward_both(encoder, decoder, dhidden);
  return loss;
}

std::vector<float> T5Model::token_logps(const Tensor& encoder_ids, const std::vector<int32_t>& encoder_lengths,
                                        const Tensor& decoder_ids, const Tensor& targets, const HiddenHead* head) {
  return run_heads_step(encoder_ids, encoder_lengths, decoder_ids, targets, nullptr, head);
}

std::vector<float> T5Model::token_logps_backward(const Tensor& encoder_ids, const std::vector<int32_t>& encoder_lengths,
                                                 const Tensor& decoder_ids, const Tensor& targets,
                                                 const TokenLogpsGradient& gradient, const HiddenHead* head) {
  return run_heads_step(encoder_ids, encoder_lengths, decoder_ids, targets, &gradient, head);
}

// As CausalLM::run_heads_step: the LM head's d(loss)/d(hidden) first (zeros
// without a counted target), the head's added to it, then both stacks' backward.
std::vector<float> T5Model::run_heads_step(const Tensor& encoder_ids, const std::vector<int32_t>& encoder_lengths,
                                           const Tensor& decoder_ids, const Tensor& targets,
                                           const TokenLogpsGradient* gradient, const HiddenHead* head) {
  const bool training = gradient != nullptr;
  set_training(training);
  StackRun encoder, decoder;
  const StepTokens tokens = start_step(encoder_ids, encoder_lengths, decoder_ids, targets, encoder, decoder);
  forward_stack(*encoder_, encoder, nullptr, 0, training);
  forward_stack(*decoder_, decoder, &encoder.final_norm.out, encoder.seq, training);
  const Tensor& hidden = decoder.final_norm.out;
  Tensor dhidden;
  const std::vector<float> logps = lm_head_token_logps(hidden, tokens, training ? &dhidden : nullptr, gradient);
  if (training && head && !dhidden.defined()) {
    dhidden = backend_.empty(hidden.shape, hidden.dtype, MemCategory::activations);
    backend_.fill(dhidden, 0.0f);
  }
  if (head) (*head)(hidden, training ? &dhidden : nullptr);
  if (dhidden.defined()) backward_both(encoder, decoder, dhidden);
  return logps;
}

// bias[i, j, :] = table[bucket(j - i)]: an embedding lookup of host-computed bucket ids.
void T5Model::relative_bias_forward(const Stack& stack, StackRun& run) {
  const int64_t T = run.seq, H = config_.num_attention_heads;
  HostAllocator host;
  Tensor buckets = Tensor::empty({T, T}, DType::i32, host, MemCategory::activations);
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < T; ++j)
      buckets.ptr<int32_t>()[i * T + j] =
          t5_relative_position_bucket(j - i, !stack.decoder, config_.relative_attention_num_buckets,
                                      config_.relative_attention_max_distance);
  run.bucket_ids = upload_tokens(buckets);
  run.bias = backend_.empty({T, T, H}, options_.activation_dtype, MemCategory::activations);
  Tensor rows = run.bias.reshaped({T * T, H});
  backend_.embedding_forward(rows, run.bucket_ids, stack.relative_bias->value);
}

void T5Model::forward_stack(const Stack& stack, StackRun& run, const Tensor* encoder_out, int64_t encoder_seq,
                            bool training) {
  Backend& be = backend_;
  const int64_t B = run.batch, T = run.seq, N = B * T, C = config_.hidden_size;
  const DType act = options_.activation_dtype;
  const Tensor* lengths = run.encoder_lengths.data ? &run.encoder_lengths : nullptr;
  relative_bias_forward(stack, run);
  run.residuals.push_back(be.empty({N, C}, act, MemCategory::activations));
  be.embedding_forward(run.residuals[0], run.ids, embedding_->value);
  const int64_t per_block = stack.sublayers_per_block();
  run.sublayers.resize(stack.blocks.size() * size_t(per_block));
  run.residuals.reserve(run.sublayers.size() + 1);  // x below refers into it across push_back
  for (size_t k = 0; k < run.sublayers.size(); ++k) {
    const Block& block = stack.blocks[k / size_t(per_block)];
    const int64_t kind = int64_t(k) % per_block;  // 0 self-attention, then cross-attention (decoder), then feed-forward
    SublayerActivations& saved = run.sublayers[k];
    const Tensor& x = run.residuals[k];
    Tensor y;
    if (kind == 0) {
      saved.norm = norm_forward(block.self_attention.norm, x);
      y = attention_forward(block.self_attention, saved, saved.norm.out, B, T, T, &run.bias,
                            stack.decoder ? nullptr : lengths, stack.decoder);
    } else if (kind == 1 && stack.decoder) {
      saved.norm = norm_forward(block.cross_attention.norm, x);
      y = attention_forward(block.cross_attention, saved, *encoder_out, B, T, encoder_seq, nullptr, lengths, false);
    } else {
      saved.norm = norm_forward(block.feed_forward.norm, x);
      y = feed_forward_forward(block.feed_forward, saved);
    }
    run.residuals.push_back(be.empty({N, C}, act, MemCategory::activations));
    be.add(run.residuals.back(), x, y);
    if (!training) {  // eval: free the sublayer's activations and its input at once
      saved = SublayerActivations{};
      run.residuals[k] = Tensor{};
    }
  }
  run.final_norm = norm_forward(stack.final_norm, run.residuals.back());
}

void T5Model::backward_stack(const Stack& stack, StackRun& run, const Tensor& dfinal, const Tensor* encoder_out,
                             Tensor* dencoder_out) {
  Backend& be = backend_;
  const int64_t N = run.batch * run.seq, C = config_.hidden_size, T = run.seq, H = config_.num_attention_heads;
  const DType act = options_.activation_dtype;
  Tensor dresidual = be.empty({N, C}, act, MemCategory::activations);
  norm_backward(dresidual, stack.final_norm, dfinal, run.residuals.back(), run.final_norm);
  run.final_norm = NormOutput{};
  Tensor dbias;  // d(loss)/d(bias), summed over the layers, when the table trains
  if (stack.relative_bias->trainable()) {
    dbias = be.empty({T, T, H}, DType::f32, MemCategory::activations);
    be.fill(dbias, 0.0f);
  }
  Tensor* dbias_arg = dbias.data ? &dbias : nullptr;
  const Tensor* lengths = run.encoder_lengths.data ? &run.encoder_lengths : nullptr;
  Tensor dnorm = be.empty({N, C}, act, MemCategory::activations);
  const int64_t per_block = stack.sublayers_per_block();
  for (size_t k = run.sublayers.size(); k-- > 0;) {
    const Block& block = stack.blocks[k / size_t(per_block)];
    const int64_t kind = int64_t(k) % per_block;
    SublayerActivations& saved = run.sublayers[k];
    const NormParameters* norm = nullptr;
    if (kind == 0) {
      norm = &block.self_attention.norm;
      attention_backward(block.self_attention, saved, dresidual, dnorm, saved.norm.out, nullptr, &run.bias,
                         dbias_arg, stack.decoder ? nullptr : lengths, stack.decoder);
    } else if (kind == 1 && stack.decoder) {
      norm = &block.cross_attention.norm;
      attention_backward(block.cross_attention, saved, dresidual, dnorm, *encoder_out, dencoder_out, nullptr,
                         nullptr, lengths, false);
    } else {
      norm = &block.feed_forward.norm;
      feed_forward_backward(block.feed_forward, saved, dresidual, dnorm);
    }
    norm_backward_add(dresidual, *norm, dnorm, run.residuals[k], saved.norm);
    saved = SublayerActivations{};
    run.residuals[k + 1] = Tensor{};
  }
  if (dbias.data) {
    const Tensor rows = dbias.reshaped({T * T, H});
    be.embedding_backward(stack.relative_bias->grad, run.bucket_ids, rows);
  }
  if (embedding_->trainable()) be.embedding_backward(embedding_->grad, run.ids, dresidual);
}

// ---- sublayers ---------------------------------------------------------------

Tensor T5Model::attention_forward(const Attention& attention, SublayerActivations& saved, const Tensor& kv_input,
                                  int64_t batch, int64_t seq, int64_t kv_seq, const Tensor* bias,
                                  const Tensor* key_lengths, bool causal) {
  Backend& be = backend_;
  const int64_t H = config_.num_attention_heads, D = config_.head_dim, C = config_.hidden_size;
  const int64_t N = batch * seq, M = batch * kv_seq;
  const DType act = options_.activation_dtype;
  saved.q = be.empty({batch, seq, H, D}, act, MemCategory::activations);
  saved.k = be.empty({batch, kv_seq, H, D}, act, MemCategory::activations);
  saved.v = be.empty({batch, kv_seq, H, D}, act, MemCategory::activations);
  Tensor q2d = saved.q.reshaped({N, H * D}), k2d = saved.k.reshaped({M, H * D}), v2d = saved.v.reshaped({M, H * D});
  {
    // Self-attention's q, k and v read one input; cross-attention's k and v the encoder's.
    const bool self = kv_input.data == saved.norm.out.data;
    const InputShare share(kv_input, {attention.k.get(), attention.v.get(), self ? attention.q.get() : nullptr});
    attention.q->forward(be, q2d, saved.norm.out);
    attention.k->forward(be, k2d, kv_input);
    attention.v->forward(be, v2d, kv_input);
  }
  saved.attn = be.empty({batch, seq, H, D}, act, MemCategory::activations);
  saved.lse = be.empty({batch, H, seq}, DType::f32, MemCategory::activations);
  be.biased_attention_forward(saved.attn, saved.lse, saved.q, saved.k, saved.v, bias, key_lengths, causal);
  Tensor y = be.empty({N, C}, act, MemCategory::activations);
  attention.o->forward(be, y, saved.attn.reshaped({N, H * D}));
  return y;
}

void T5Model::attention_backward(const Attention& attention, SublayerActivations& saved, const Tensor& dy,
                                 Tensor& dnorm, const Tensor& kv_input, Tensor* dkv_input, const Tensor* bias,
                                 Tensor* dbias, const Tensor* key_lengths, bool causal) {
  Backend& be = backend_;
  const int64_t H = config_.num_attention_heads, D = config_.head_dim;
  const int64_t N = saved.q.dim(0) * saved.q.dim(1), M = saved.k.dim(0) * saved.k.dim(1);
  const DType act = options_.activation_dtype;
  Tensor dattn = be.empty(saved.attn.shape, act, MemCategory::activations);
  Tensor dattn2d = dattn.reshaped({N, H * D});
  attention.o->backward(be, &dattn2d, dy, saved.attn.reshaped({N, H * D}), false);
  Tensor dq = be.empty(saved.q.shape, act, MemCategory::activations);
  Tensor dk = be.empty(saved.k.shape, act, MemCategory::activations);
  Tensor dv = be.empty(saved.v.shape, act, MemCategory::activations);
  be.biased_attention_backward(dq, dk, dv, dbias, dattn, saved.q, saved.k, saved.v, saved.attn, saved.lse, bias,
                               key_lengths, causal);
  attention.q->backward(be, &dnorm, dq.reshaped({N, H * D}), saved.norm.out, false);
  // Self-attention's keys and values come from the same normed input; cross-attention's from the encoder.
  Tensor& dkv = dkv_input ? *dkv_input : dnorm;
  attention.k->backward(be, &dkv, dk.reshaped({M, H * D}), kv_input, true);
  attention.v->backward(be, &dkv, dv.reshaped({M, H * D}), kv_input, true);
}

Tensor T5Model::cached_attention(const Attention& attention, const Tensor& normed, const Tensor& keys,
                                 const Tensor& values, const Tensor* bias) {
  Backend& be = backend_;
  const int64_t H = config_.num_attention_heads, D = config_.head_dim, C = config_.hidden_size;
  const DType act = options_.activation_dtype;
  Tensor q = be.empty({1, 1, H, D}, act, MemCategory::activations);
  Tensor q2d = q.reshaped({1, H * D});
  attention.q->forward(be, q2d, normed);
  Tensor attn = be.empty({1, 1, H, D}, act, MemCategory::activations);
  Tensor lse = be.empty({1, H, 1}, DType::f32, MemCategory::activations);
  // Every cached key is visible: they are this query's past and itself (or the encoder's tokens).
  be.biased_attention_forward(attn, lse, q, keys, values, bias, nullptr, false);
  Tensor y = be.empty({1, C}, act, MemCategory::activations);
  attention.o->forward(be, y, attn.reshaped({1, H * D}));
  return y;
}

Tensor T5Model::feed_forward_forward(const FeedForward& ff, SublayerActivations& saved) {
  Backend& be = backend_;
  const int64_t N = saved.norm.out.rows(), F = config_.intermediate_size, C = config_.hidden_size;
  const DType act = options_.activation_dtype;
  saved.gate = be.empty({N, F}, act, MemCategory::activations);
  {
    const InputShare share(saved.norm.out, {ff.wi_0.get(), ff.wi_1.get()});
    ff.wi_0->forward(be, saved.gate, saved.norm.out);
    if (ff.wi_1) {
      saved.up = be.empty({N, F}, act, MemCategory::activations);
      ff.wi_1->forward(be, saved.up, saved.norm.out);
    }
  }
  saved.act = be.empty({N, F}, act, MemCategory::activations);
  const Activation kind = config_.gated_ffn ? Activation::gelu_tanh : Activation::relu;
  be.activation_forward(saved.act, saved.gate, ff.wi_1 ? &saved.up : nullptr, kind);
  Tensor y = be.empty({N, C}, act, MemCategory::activations);
  ff.wo->forward(be, y, saved.act);
  return y;
}

void T5Model::feed_forward_backward(const FeedForward& ff, SublayerActivations& saved, const Tensor& dy,
                                    Tensor& dnorm) {
  Backend& be = backend_;
  const DType act = options_.activation_dtype;
  Tensor dact = be.empty(saved.act.shape, act, MemCategory::activations);
  ff.wo->backward(be, &dact, dy, saved.act, false);
  Tensor dup = ff.wi_1 ? be.empty(saved.up.shape, act, MemCategory::activations) : Tensor{};
  const Activation kind = config_.gated_ffn ? Activation::gelu_tanh : Activation::relu;
  // dact becomes d(loss)/d(gate) in place (the op allows dx to alias dout).
  be.activation_backward(dact, ff.wi_1 ? &dup : nullptr, dact, saved.gate, ff.wi_1 ? &saved.up : nullptr, kind);
  ff.wi_0->backward(be, &dnorm, dact, saved.norm.out, false);
  if (ff.wi_1) ff.wi_1->backward(be, &dnorm, dup, saved.norm.out, true);
}

}  // namespace ft
