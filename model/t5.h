// T5 and FLAN-T5 (transformers' T5ForConditionalGeneration) with Hugging
// Face tensor names, written against the op interface only: an encoder and
// a decoder stack of pre-norm blocks (T5's RMS layer norm, no bias, no mean),
// unscaled attention with a relative position bias that only each stack's
// first block owns (bidirectional buckets in the encoder, causal in the
// decoder), cross-attention from every decoder block to the encoder output,
// and the feed-forward of v1.0 (relu) or v1.1 / FLAN-T5 (gated-gelu). With
// tie_word_embeddings the shared embedding is also the LM head and the
// decoder output is scaled by d_model^-0.5 first.
//
// It shares LanguageModel's parameters, linears (dense, INT8, NF4, LoRA),
// loading, initialisation and loss with the decoder-only models, and runs a
// step of its own. PEFT's default targets (model/families.cpp) are q and v,
// which match the self-attention and the decoder's EncDecAttention alike.
// Every activation of
// a training step is kept (no per-layer checkpointing), and dropout_rate is
// not applied (only LoRA's dropout runs).
#pragma once
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "model/causal_lm.h"

namespace ft {

// config.json's fields of model_type t5 under T5Config's names (model/families.h).
void read_t5_config(const nlohmann::json& config, ModelConfig& result, const std::string& source);

// T5 generation's decoder cache (T5Model::make_decoder_cache) for one row:
// the decoder-only models' KvCache for the self-attention's keys and values
// (per layer [1, capacity, H, D], unrotated), and each decoder layer's
// cross-attention keys and values of the encoder output [1, S, H, D].
struct T5DecoderCache {
  KvCache self;
  std::vector<Tensor> cross_keys, cross_values;
};

class T5Model final : public LanguageModel {
 public:
  // Allocates every weight (uninitialised) and adapter on the backend. LoRA
  // targets that leave no module to adapt, or activation checkpointing, are an Error.
  T5Model(const ModelConfig& config, Backend& backend, const ModelOptions& options = {});
  ~T5Model() override;

  // Mean cross-entropy of the decoder's predictions. encoder_ids: host i32
  // [B, S]; decoder_ids and targets: host i32 [B, T], targets[b, t] the token
  // decoder position t predicts (-100: ignored), i.e. transformers' labels,
  // and decoder_ids = t5_decoder_inputs(labels). Keeps the logits [B*T,
  // vocab] for last_logits(). encoder_lengths (empty: every row whole)
  // gives each encoder row's real tokens, the rest right padding: padded
  // positions are masked as keys of the encoder's self-attention and of
  // the cross-attention, so each row's loss and gradients are the row's alone
  // (transformers' attention_mask).
  float forward(const Tensor& encoder_ids, const Tensor& decoder_ids, const Tensor& targets,
                const std::vector<int32_t>& encoder_lengths = {});
  // Same loss, then gradients of grad_scale * loss are added to every
  // trainable parameter's grad. Nothing of the step stays allocated.
  float forward_backward(const Tensor& encoder_ids, const Tensor& decoder_ids, const Tensor& targets,
                         float grad_scale = 1.0f, const std::vector<int32_t>& encoder_lengths = {});
  // The same on loader rows (t5_rows splits them): LanguageModel's step.
  // position_ids must be null: each row is one example (packing is refused).
  float forward(const Tensor& input_ids, const Tensor& targets, const Tensor* position_ids = nullptr) override;
  float forward_backward(const Tensor& input_ids, const Tensor& targets, float grad_scale = 1.0f,
                         const Tensor* position_ids = nullptr) override;
  T5Model* as_seq2seq() override { return this; }

  // For generation, forward in two halves: encode() runs the encoder and
  // keeps its output until the next encode() or forward(); decode() is
  // forward's decoder half against it (same arguments and logits), so a
  // growing decoder input needs the encoder only once.
  void encode(const Tensor& encoder_ids, const std::vector<int32_t>& encoder_lengths = {});
  float decode(const Tensor& decoder_ids, const Tensor& targets);

  // Generation's decoder with a key/value cache, after encode() of one row
  // ([1, S]): an empty cache for up to capacity_tokens decoder tokens, whose
  // cross-attention keys and values are computed here, once.
  T5DecoderCache make_decoder_cache(int64_t capacity_tokens);
  // Runs one decoder token at position cache.self.lengths_tokens[0] through
  // the same sublayers as decode(), its self-attention over the cached keys
  // and values (Backend::biased_attention_forward with the relative position
  // bias of that one query), appends its keys and values, and leaves its
  // logits [1, vocab] in last_logits(): decode()'s last row for the tokens so
  // far.
  void decode_cached(T5DecoderCache& cache, int32_t token);

  // Online RL on a seq2seq policy (trl's AutoModelForSeq2SeqLMWithValueHead):
  // each decoder position's log p(targets[n]) ([B*T], 0 where the target is
  // -100) from one eval forward of encoder_ids (with encoder_lengths, empty:
  // whole rows) and decoder_ids; head, when given, reads the same forward's
  // decoder output after the final norm (transformers'
  // decoder_hidden_states[-1], where trl's value head sits).
  std::vector<float> token_logps(const Tensor& encoder_ids, const std::vector<int32_t>& encoder_lengths,
                                 const Tensor& decoder_ids, const Tensor& targets, const HiddenHead* head = nullptr);
  // The same in training mode, then the gradients of the loss whose
  // derivative in each token's log-probability gradient() returns, plus the
  // head's, are added to every trainable parameter's grad, through the
  // decoder and the encoder.
  std::vector<float> token_logps_backward(const Tensor& encoder_ids, const std::vector<int32_t>& encoder_lengths,
                                          const Tensor& decoder_ids, const Tensor& targets,
                                          const TokenLogpsGradient& gradient, const HiddenHead* head = nullptr);

 private:
  struct Attention;
  struct FeedForward;
  struct Block;
  struct Stack;
  struct SublayerActivations;
  struct StackRun;

  // The encoder's and decoder's runs of one step on the backend (ids,
  // shapes, the padding mask); returns the decoder's tokens and targets.
  StepTokens start_step(const Tensor& encoder_ids, const std::vector<int32_t>& encoder_lengths,
                        const Tensor& decoder_ids, const Tensor& targets, StackRun& encoder, StackRun& decoder);
  // From dhidden = d(loss)/d(the decoder's final norm output): the decoder's
  // backward, then the encoder's from the cross-attention's gradient.
  void backward_both(StackRun& encoder, StackRun& decoder, Tensor& dhidden);
  // token_logps and token_logps_backward (gradient null: an eval forward).
  std::vector<float> run_heads_step(const Tensor& encoder_ids, const std::vector<int32_t>& encoder_lengths,
                                    const Tensor& decoder_ids, const Tensor& targets,
                                    const TokenLogpsGradient* gradient, const HiddenHead* head);
  // Builds one stack's parameters under prefix ("encoder." or "decoder.").
  void add_stack(Stack& stack, const std::string& prefix, int64_t layers, bool decoder);
  // The stack's relative position bias [T, T, H] for run.seq tokens.
  void relative_bias_forward(const Stack& stack, StackRun& run);
  // Embeds run.ids and runs every sublayer, then the final norm; a decoder
  // attends to encoder_out [B*S, C] of encoder_seq tokens per row.
  void forward_stack(const Stack& stack, StackRun& run, const Tensor* encoder_out, int64_t encoder_seq,
                     bool training);
  // From dfinal = d(loss)/d(the final norm's output), every sublayer's
  // backward, last to first, then the bias table's and embedding's
  // gradients when they train. A decoder adds d(loss)/d(encoder_out) into
  // dencoder_out.
  void backward_stack(const Stack& stack, StackRun& run, const Tensor& dfinal, const Tensor* encoder_out,
                      Tensor* dencoder_out);
  // key_lengths: the encoder's padding mask (Backend::biased_attention_forward), or null.
  Tensor attention_forward(const Attention& attention, SublayerActivations& saved, const Tensor& kv_input,
                           int64_t batch, int64_t seq, int64_t kv_seq, const Tensor* bias,
                           const Tensor* key_lengths, bool causal);
  // dnorm (overwritten) = d(loss)/d(the sublayer's normed input) from dy;
  // cross-attention adds its key/value input's gradient into dkv_input instead.
  void attention_backward(const Attention& attention, SublayerActivations& saved, const Tensor& dy, Tensor& dnorm,
                          const Tensor& kv_input, Tensor* dkv_input, const Tensor* bias, Tensor* dbias,
                          const Tensor* key_lengths, bool causal);
  // encoder_lengths checked against encoder_ids [B, S] and uploaded as i32 [B]; empty stays empty.
  Tensor upload_encoder_lengths(const Tensor& encoder_ids, const std::vector<int32_t>& encoder_lengths);
  // One query row's attention [1, C] from normed [1, C] over keys and values [1, L, H, D].
  Tensor cached_attention(const Attention& attention, const Tensor& normed, const Tensor& keys, const Tensor& values,
                          const Tensor* bias);
  Tensor feed_forward_forward(const FeedForward& ff, SublayerActivations& saved);
  void feed_forward_backward(const FeedForward& ff, SublayerActivations& saved, const Tensor& dy, Tensor& dnorm);

  std::unique_ptr<Stack> encoder_, decoder_;
  Tensor encoded_;  // encode()'s output [B*S, C]
  Tensor encoded_lengths_;  // its rows' lengths i32 [B], or empty: whole rows
  int64_t encoded_batch_ = 0, encoded_seq_ = 0;
};

// transformers' _shift_right: the decoder's inputs for labels host i32
// [B, T]: decoder_start_token_id, then labels[:, :-1] with -100 replaced by
// pad_id.
Tensor t5_decoder_inputs(const Tensor& labels, int64_t decoder_start_token_id, int64_t pad_id, HostAllocator& host);

// Seq2seq rows as the data loader makes them (tokenize_seq2seq_example,
// trainer/data/data.h): a row is the encoder's tokens followed by the
// labels, the labels its counted targets. t5_rows splits host i32 [B, T]
// input_ids and targets back: the encoder tokens of row b are input_ids[b,
// 0..p] where targets[b, p] is the row's first counted target (right-padded
// with pad_id, with their lengths for the padding mask); its labels are the
// counted targets from p (-100 padding), and decoder_ids
// t5_decoder_inputs(labels).
struct T5Rows {
  Tensor encoder_ids;                    // [B, S]
  std::vector<int32_t> encoder_lengths;  // per row, >= 1 (an empty row: one pad token)
  Tensor labels;                         // [B, T]
  Tensor decoder_ids;
};
T5Rows t5_rows(const Tensor& input_ids, const Tensor& targets, int64_t decoder_start_token_id, int32_t pad_id,
               HostAllocator& host);

// transformers' T5Attention._relative_position_bucket for key_pos - query_pos.
int32_t t5_relative_position_bucket(int64_t relative_position, bool bidirectional, int64_t num_buckets,
                                    int64_t max_distance);

}  // namespace ft
