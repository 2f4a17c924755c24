// What every architecture shares (LanguageModel): its parameters (base
// weights under their Hugging Face names, LoRA adapters beside them), how
// linears are built (dense, LLM.int8() or NF4, wrapped in LoRA when
// targeted), loading, initialisation, the trainable set, the norms and the
// chunked LM-head loss. What every decoder-only architecture shares
// (CausalLM): the whole training step: token upload, embedding, the decoder
// stack with activation bookkeeping and checkpointing, the final norm and the
// loss, forward and backward. A decoder-only architecture adds only its
// parameters and one decoder layer's forward and backward (llama.h,
// gpt_neox.h); the encoder-decoder T5 runs its own step (t5.h).
#pragma once
#include <algorithm>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "model/activation_offload.h"
#include "model/linear.h"
#include "model/model_config.h"
#include "model/model_options.h"
#include "model/output_head.h"
#include "model/parameter.h"
#include "model/tensor_parallel.h"

namespace ft {

class Checkpoint;
class LayerStream;
class LoraLinear;
class CausalLM;
class T5Model;

// Generation's key/value cache: every layer's rotated keys and values of the
// tokens run so far, by row and position (CausalLM::forward_cached).
struct KvCache {
  std::vector<Tensor> keys, values;    // per layer [B, capacity, Hkv, D], activation dtype
  std::vector<int64_t> lengths_tokens;  // per row: positions filled (the next token's position)
  int64_t capacity_tokens() const { return keys.empty() ? 0 : keys[0].dim(1); }
};

// A norm's output [N, C] (activation dtype) and the f32 statistics [N] its
// backward reads (mean: LayerNorm only).
struct NormOutput {
  Tensor out, mean, rstd;
};

// A norm's parameters: RMSNorm (no bias) or LayerNorm (weight and bias).
struct NormParameters {
  Parameter* weight = nullptr;
  Parameter* bias = nullptr;  // null: RMSNorm
  float eps = 0.0f;
};

// Per sequence of the batch -- each row, or with packed rows (position_ids)
// each example and each row's padding tail, in token order: the summed
// log-probability of its counted targets (sum over its tokens t of
// log p(targets[t]), -100 skipped), how many counted, and its batch row.
struct SequenceLogps {
  std::vector<double> logps;
  std::vector<int64_t> counted_tokens;
  std::vector<int64_t> rows;
};
// d(loss)/d(logps[s]) for every sequence, from their log-probabilities.
using LogpsGradient = std::function<std::vector<double>(const SequenceLogps&)>;
// d(loss)/d(token_logps[n]) for every token of the batch ([B*T], batch
// order), from their log-probabilities.
using TokenLogpsGradient = std::function<std::vector<float>(const std::vector<float>& token_logps)>;
// A head other than the LM head over the final norm's output hidden
// [B*T, C] (activation dtype, on the backend): a reward model's score, PPO's
// value head. In a training step dhidden is given, holding the LM head's
// share of d(loss)/d(hidden) (zeros when no LM head runs): the head adds its
// own. Null in an eval step.
using HiddenHead = std::function<void(const Tensor& hidden, Tensor* dhidden)>;

// NEFTune as transformers' neftune_post_forward_hook computes its noise's
// bound: alpha / sqrt(length * hidden_size) in f32 with torch's roundings,
// length the embedding output's sequence dimension (size(1)).
float neftune_noise_magnitude(double alpha, int64_t length, int64_t hidden_size);
// The seed of a micro-batch's embedding noise from the one set_dropout_seed
// takes: a stream apart from its LoRA dropout masks'.
uint64_t embedding_noise_seed(uint64_t dropout_seed);

class LanguageModel {
 public:
  virtual ~LanguageModel();

  // The base weights' fingerprint: xxHash (XXH3-64) over each loaded
  // tensor's name and stored bytes, hashed as load() reads them; "" before
  // load() (random init). A resumed run compares it with its checkpoint's.
  const std::string& base_fingerprint() const { return base_fingerprint_; }
  // Copies every base weight from the checkpoint (converting dtype, or
  // quantising into the base's format unless saved in it,
  // model/quant/formats.h); a missing tensor or a shape mismatch is an
  // Error naming it.
  void load(const Checkpoint& checkpoint);
  // Base weights as transformers initialises a new model (normal with
  // std = initializer_range, norms 1), from a seed: for pretraining, or a
  // quantized base (quantised from those values) to benchmark without weights.
  void init_random(uint64_t seed);
  // Adapters as PEFT's init_lora_weights says (lora.init_lora_weights; by
  // default A kaiming-uniform, B zeros), and DoRA's magnitudes the row norms
  // of W + scaling B A (needs the base loaded).
  void init_adapters(uint64_t seed);
  // Adapter values were written other than by a training step (an adapter
  // loaded): DoRA's weight norms are recomputed at the next forward.
  void adapters_changed();
  bool uses_dora() const { return options_.lora && options_.lora->use_dora; }
  // Seeds this step's LoRA dropout masks (each adapter gets its own) and
  // its NEFTune embedding noise (embedding_noise_seed).
  void set_dropout_seed(uint64_t seed);
  // Every LoRA layer on (the default) or off: off, the model is its base
  // alone, as under PEFT's disable_adapter().
  void set_adapters_enabled(bool enabled);

  // One batch of rows as the data loader makes them for this model's kind
  // (model/families.h), host i32 [B, T]: a decoder-only model's tokens and
  // next-token targets, an encoder-decoder model's encoder tokens followed
  // by its labels (targets: -100 where nothing counts). forward: the mean
  // cross-entropy over the counted targets; forward_backward: the same loss,
  // then the gradients of grad_scale * loss are added to every trainable
  // parameter's grad.
  // position_ids (host i32 [B, T], or null; a decoder-only model's): each
  // token's position within its example, as transformers' position_ids for
  // padding-free packed rows: a row holds several examples, each starting at
  // position 0 and counting up by one. Rope rotates by them and attention
  // never crosses from one example into another. Null: 0..T-1 in every row.
  virtual float forward(const Tensor& input_ids, const Tensor& targets, const Tensor* position_ids = nullptr) = 0;
  virtual float forward_backward(const Tensor& input_ids, const Tensor& targets, float grad_scale = 1.0f,
                                 const Tensor* position_ids = nullptr) = 0;
  // The model as its kind's class, for what only that kind runs (DPO,
  // pipeline stages, generation); null for the other kind.
  virtual CausalLM* as_causal_lm() { return nullptr; }
  virtual T5Model* as_seq2seq() { return nullptr; }

  // Gives a gradient buffer (zeroed) to every parameter or adapter whose name
  // satisfies the predicate; the others stay frozen (no buffer at all).
  void set_trainable(const std::function<bool(const std::string&)>& is_trainable);
  void zero_grads();

  const Tensor& last_logits() const { return last_logits_; }
  // Frees the logits an eval forward kept: an evaluation between training
  // steps must not leave [tokens, vocab] f32 held through the steps after it.
  void release_logits() { last_logits_ = Tensor{}; }
  const ModelConfig& config() const { return config_; }
  // A tied model's lm_head as a parameter of its own named untied_head_name(),
  // holding the embedding's values: PEFT's modules_to_save=["lm_head"] over a
  // tied base replaces them (finetune merge writes that head untied).
  Parameter& untie_head();
  // lm_head's checkpoint name when it is not tied to the embedding ("lm_head.weight"; GPT-NeoX's
  // "embed_out.weight"), "" for a family that always ties it.
  const std::string& untied_head_name() const { return untied_head_name_; }
  // A tensor's name in this family's checkpoints for the name transformers 5
  // and PEFT give it: transformers 5 calls every causal model's head lm_head
  // (GPT-NeoX's embed_out.weight in its checkpoints); other names are kept.
  std::string checkpoint_name(const std::string& name) const {
    return name == "lm_head.weight" && !untied_head_name_.empty() ? untied_head_name_ : name;
  }
  // The last stage's lm_head weight (the embedding's Parameter when tied), else null.
  const Parameter* lm_head() const { return lm_head_; }
  Backend& backend() { return backend_; }
  std::deque<Parameter>& parameters() { return parameters_; }  // base weights, HF names
  std::deque<Parameter>& adapters() { return adapters_; }      // e.g. model.layers.0.self_attn.q_proj.lora_A.weight
  // transformers' modules of this model that hold no weight here (weightless_modules_).
  const std::vector<std::string>& weightless_modules() const { return weightless_modules_; }
  // The linear modules' last names (q_proj, v_proj, ...), each once, in the order built.
  std::vector<std::string> linear_module_leaves() const;
  // Every linear module's name (model.layers.0.self_attn.q_proj), adapted or not, in the order built.
  const std::vector<std::string>& linear_modules() const { return linear_modules_; }
  // options.output_head's parameters (last stage), else undefined.
  const HeadParameters& output_head() const { return output_head_; }
  // Whether load() found the output head in the checkpoint, or a PEFT
  // adapter's modules_to_save set it since.
  bool output_head_loaded() const { return output_head_loaded_; }
  void set_output_head_loaded() { output_head_loaded_ = true; }
  // Initialises the output head when load() found it not in the checkpoint
  // (or there was none): weight normal with std initializer_range, as
  // transformers initialises a new score, bias 0.
  void init_output_head(uint64_t seed);
  // As built: options.lora's empty target_modules replaced by the architecture's default.
  const ModelOptions& options() const { return options_; }
  Parameter& parameter(const std::string& name);
  // The streamed base (options.stream_base), null when every layer is resident.
  const LayerStream* layer_stream() const { return layer_stream_.get(); }
  // The decoder layers this model holds (options.layers, end_layer resolved):
  // the first stage embeds the tokens, the last one owns the loss.
  const LayerRange& layers() const { return options_.layers; }
  bool first_stage() const { return options_.layers.first_layer == 0; }
  bool last_stage() const { return options_.layers.end_layer == config_.num_hidden_layers; }

 protected:
  // options.lora, when given, names its target_modules (make_language_model
  // fills in the family's default).
  LanguageModel(const ModelConfig& config, Backend& backend, const ModelOptions& options);
  // From the backend's allocator, or the given one.
  Parameter& add_parameter(const std::string& name, const Shape& shape, DType dtype, Allocator* allocator = nullptr);
  // name + ".weight" (and name + ".bias" with bias: a LayerNorm), [hidden_size].
  NormParameters add_norm(const std::string& name, bool bias, float eps);
  // A linear named module (e.g. model.layers.0.self_attn.q_proj): dense,
  // LLM.int8() or NF4, wrapped in LoRA when a target matches it. With bias,
  // module + ".bias" [out_features] is a parameter too (weight_dtype, also
  // over an int8 weight).
  // split: how tensor parallelism divides it (model/tensor_parallel.h);
  // out_features and in_features are the whole layer's. shares (column
  // splits): the parts the outputs split into, when fewer than the ranks
  // (GQA's key/value heads): each part is held by ranks / shares
  // neighbouring ranks. 0: one part a rank.
  std::unique_ptr<Linear> make_linear(const std::string& module, int64_t out_features, int64_t in_features,
                                      bool bias = false, ParallelLinear split = ParallelLinear::replicated,
                                      int64_t shares = 0);
  // The ranks of the tensor group (1 without tensor parallelism), and the
  // sum over them of a row-parallel product or a column-parallel input
  // gradient (nothing with one rank).
  int64_t tensor_ranks() const;
  void tensor_sum(Tensor& t);
  // Call at the end of a constructor: embedding_, final_norm_ and lm_head_
  // must be set, and a LoRA target that matched no module, or LoRA options
  // that adapt none, an Error listing module_names, the architecture's
  // linear modules. Starts the layer stream when options.stream_base.
  void check_built(const std::string& module_names);
  void check_targets(const std::string& module_names);
  // Decoder layer `index` is about to run (direction +1 in a forward, -1 in
  // a backward) / has issued its last op: with a streamed base its weights
  // are bound to a device buffer in between (LayerStream).
  void acquire_layer(size_t index, int direction);
  void release_layer(size_t index);

  // Norms for the layers, RMSNorm or LayerNorm by norm.bias; outputs and
  // statistics are allocated here (out in the activation dtype).
  NormOutput norm_forward(const NormParameters& norm, const Tensor& x);
  // sum = a + b (all [N, C]), and the norm of sum, in one fused op.
  NormOutput add_norm_forward(const NormParameters& norm, Tensor& sum, const Tensor& a, const Tensor& b);
  // dresidual += d(loss)/d(x) from dout = d(loss)/d(norm output), fused; the
  // norm's weight (and bias) gradients accumulate when they train.
  void norm_backward_add(Tensor& dresidual, const NormParameters& norm, const Tensor& dout, const Tensor& x,
                         const NormOutput& saved);
  // dx (overwritten) = d(loss)/d(x) from dout; parameter gradients as norm_backward_add.
  void norm_backward(Tensor& dx, const NormParameters& norm, const Tensor& dout, const Tensor& x,
                     const NormOutput& saved);

  // Where a step's tokens sit, on the backend: their rope positions i32
  // [B*T] and, for packed rows, the sequences attention keeps apart
  // (Backend::attention_forward's cu_seqlens; undefined: each row is one).
  struct TokenLayout {
    Tensor positions, cu_seqlens;
  };
  // One step's tokens on the backend: ids, targets and their layout as i32
  // [B*T], from host i32 [B, T] input_ids, targets and position_ids, and how
  // many targets count (are not -100).
  struct StepTokens {
    int64_t batch = 0, seq = 0, counted = 0;
    Tensor ids, targets;
    TokenLayout layout;
  };
  // A host i32 [B, T] tensor as i32 [B*T] on the backend.
  Tensor upload_tokens(const Tensor& host_tokens);
  // ids, targets and the counted targets (no positions) from host i32 [B, T] tensors.
  StepTokens upload_ids_and_targets(const Tensor& input_ids, const Tensor& targets);
  // logits = logits_scale_ * hidden [N, C] lm_head^T and the mean cross-entropy
  // over tokens.targets' counted tokens; with dhidden, the backward too (see
  // causal_lm.cpp).
  float lm_head_loss(const Tensor& hidden, const StepTokens& tokens, Tensor* dhidden, float grad_scale);
  // Per-token log-probabilities through the LM head, loss_chunk_tokens rows
  // at a time; with gradient, dhidden [N, C] too (see causal_lm.cpp).
  std::vector<float> lm_head_token_logps(const Tensor& hidden, const StepTokens& tokens, Tensor* dhidden,
                                         const TokenLogpsGradient* gradient);
  // From a chunk's dlogits (f32, in logits): dhidden_rows = dlogits lm_head,
  // and lm_head.grad += dlogits^T hidden_rows when it trains; logits is freed.
  void lm_head_backward_chunk(Tensor& logits, const Tensor& hidden_rows, Tensor& dhidden_rows);
  // Dropout in the adapters is on while training only.
  void set_training(bool training);
  // NEFTune (options_.neftune_noise_alpha > 0): embedded [B*T, C], the
  // embedding's output in a training step, gets its uniform noise, the bound
  // from length (transformers' L), drawn from the step's seed.
  void add_embedding_noise(Tensor& embedded, int64_t length);
  // A checkpoint holding a tied copy's tensor (weightless_modules_: a tied
  // lm_head, T5's embed_tokens) of other values than the embedding is an Error.
  void check_tied_copies(const Checkpoint& checkpoint) const;

  ModelConfig config_;
  Backend& backend_;
  ModelOptions options_;
  // Set by the architecture's constructor. lm_head_ == embedding_ when tied.
  Parameter* embedding_ = nullptr;
  NormParameters final_norm_;
  Parameter* lm_head_ = nullptr;
  std::string untied_head_name_;  // set by the architecture's constructor (untied_head_name())
  // transformers' modules of this model that hold no weight here (rotary
  // embeddings, activations, dropout, a tied head, T5's embed_tokens), set
  // by the architecture's constructor: PEFT adapts or refuses each when a
  // target_modules pattern matches it, so a pattern matching one is refused.
  std::vector<std::string> weightless_modules_;
  float logits_scale_ = 1.0f;  // T5 with tied embeddings: d_model^-0.5
  // Linears (by module-name suffix) that stay in weight_dtype under a
  // quantized base, set by the architecture's constructor before it builds
  // them: transformers' _keep_in_fp32_modules, which bitsandbytes leaves
  // unconverted (T5's feed-forward output wo).
  std::vector<std::string> unquantized_modules_;

 private:
  std::deque<Parameter> parameters_;  // deque: stable addresses for the layers' references
  std::deque<Parameter> adapters_;
  std::vector<std::string> linear_modules_;  // every make_linear's module, adapted or not
  std::vector<LoraLinear*> lora_layers_;
  uint64_t embedding_noise_seed_ = 0;  // set_dropout_seed's
  Tensor last_logits_;
  std::string base_fingerprint_;
  HeadParameters output_head_;
  bool output_head_loaded_ = false;
  std::unique_ptr<LayerStream> layer_stream_;
  // Layers below this index are streamed (options.stream_base), else 0.
  int64_t streamed_layers() const;
  // Runs fill on p, through device tensors of p's shapes when p's tensors
  // are in host memory the backend's ops cannot write (a streamed layer),
  // copied back to the host after.
  void fill_parameter(Parameter& p, const std::function<void(Parameter&)>& fill);
  void fill_shard(Parameter& p, const std::function<void(Backend&, Parameter&)>& fill_whole);
};

// The model's adapters off for a scope (the reference model of DPO, GRPO
// and PPO: the base under PEFT's disable_adapter()), on again after it,
// also when it throws.
class AdaptersDisabled {
 public:
  explicit AdaptersDisabled(LanguageModel& model) : model_(model) { model_.set_adapters_enabled(false); }
  ~AdaptersDisabled() { model_.set_adapters_enabled(true); }
  AdaptersDisabled(const AdaptersDisabled&) = delete;
  AdaptersDisabled& operator=(const AdaptersDisabled&) = delete;

 private:
  LanguageModel& model_;
};

class CausalLM : public LanguageModel {
 public:
  // Mean cross-entropy over counted tokens. input_ids and targets are host
  // i32 [B, T]; targets[b, t] is the token position t should predict (-100:
  // ignored). Keeps the logits [B*T, vocab] for last_logits(), whole even
  // with loss_chunk_tokens: generation reads any row of them. An eval forward
  // frees each layer's activations as soon as the layer is done.
  float forward(const Tensor& input_ids, const Tensor& targets, const Tensor* position_ids = nullptr) override;
  // Same loss, then gradients of grad_scale * loss are added to every
  // trainable parameter's grad. Nothing of the step stays allocated.
  float forward_backward(const Tensor& input_ids, const Tensor& targets, float grad_scale = 1.0f,
                         const Tensor* position_ids = nullptr) override;
  CausalLM* as_causal_lm() override { return this; }
  // Each sequence's summed log-probability of its counted targets (DPO's
  // sequence log-probs), as an eval forward: nothing kept for a backward.
  SequenceLogps sequence_logps(const Tensor& input_ids, const Tensor& targets, const Tensor* position_ids = nullptr);
  // The same in training mode, then the gradients of the loss whose
  // derivative in each row's log-probability gradient() returns are added to
  // every trainable parameter's grad (a per-row scaled cross-entropy backward).
  SequenceLogps sequence_logps_backward(const Tensor& input_ids, const Tensor& targets,
                                        const LogpsGradient& gradient, const Tensor* position_ids = nullptr);
  // Each token's log p(targets[n]) ([B*T], batch order, 0 where the target is
  // -100), as an eval forward; head, when given, reads the same forward's
  // final hidden states (e.g. PPO's values).
  std::vector<float> token_logps(const Tensor& input_ids, const Tensor& targets, const Tensor* position_ids = nullptr,
                                 const HiddenHead* head = nullptr);
  // The same in training mode, then the gradients of the loss whose
  // derivative in each token's log-probability gradient() returns, plus the
  // head's, are added to every trainable parameter's grad.
  std::vector<float> token_logps_backward(const Tensor& input_ids, const Tensor& targets,
                                          const TokenLogpsGradient& gradient, const Tensor* position_ids = nullptr,
                                          const HiddenHead* head = nullptr);
  // A forward read by head alone (no LM head: a reward model's score); with
  // training, the head's gradient through the model after it.
  void head_step(const Tensor& input_ids, const Tensor* position_ids, bool training, const HiddenHead& head);

  // An empty cache (every row at length 0) for batch rows of up to
  // capacity_tokens positions, allocated on the backend.
  KvCache make_kv_cache(int64_t batch, int64_t capacity_tokens);
  // Runs input_ids (host i32 [B, T]) as the continuation of the cache's rows,
  // token t of row b at position lengths_tokens[b] + t, through the same
  // layers as forward() with attention over the cache (Backend::
  // attention_cached). Every token's keys and values are cached, then row b's
  // length grows by valid_tokens[b] <= T: a right-padded row's padding is
  // overwritten by its next tokens. A row with valid_tokens 0 is idle (a
  // finished row kept so the batch stays rectangular): its tokens run at
  // positions from 0, its cache is no longer meaningful. Returns f32
  // [B, vocab] on the backend: each row's logits after its last valid token.
  Tensor forward_cached(KvCache& cache, const Tensor& input_ids, const std::vector<int64_t>& valid_tokens);

  // Pipeline parallel: one training micro-batch's state on this stage
  // between its forward and its backward (defined below).
  struct DecoderStep;
  // The micro-batch's forward through this model's layers (options.layers).
  // The first stage embeds input_ids; a later one takes input [B, T, C], the
  // previous stage's output (kept as its first layer's checkpoint). A stage
  // before the last moves its output [B, T, C] into *output for the next
  // stage and keeps no copy of it; the last stage computes the loss and its
  // gradient through the LM head (scaled by grad_scale) as forward_backward
  // does and returns the loss (0 on the other stages).
  std::unique_ptr<DecoderStep> stage_forward(const Tensor& input_ids, const Tensor& targets,
                                             const Tensor* position_ids, Tensor input, Tensor* output,
                                             float grad_scale, float* loss);
  // The micro-batch's backward from doutput = d(loss)/d(this stage's output)
  // (received from the next stage; undefined on the last stage): returns
  // d(loss)/d(input) for the previous stage (undefined on the first stage).
  Tensor stage_backward(DecoderStep& step, Tensor doutput);
  // An eval forward through this stage, as forward() computes it: a stage
  // before the last moves its output into *output, the last returns the
  // loss (0 on the others). Nothing is kept for a backward.
  float stage_eval_forward(const Tensor& input_ids, const Tensor& targets, const Tensor* position_ids, Tensor input,
                           Tensor* output);

 protected:
  using LanguageModel::LanguageModel;

  // What one layer's backward reads from its forward; each architecture
  // derives its own.
  struct SavedActivations {
    virtual ~SavedActivations() = default;
  };
  // Layer `index` of the decoder from its input x [B, T, C], returning what
  // its backward needs. On entry `norm` holds x under the layer's input norm
  // (input_norm(index)); the layer takes it. With out, the layer writes its
  // output [B, T, C] there through add_next_norm, which also leaves the
  // output under the next norm in `norm`. A recomputation passes no out: the
  // output is already kept, so the layer stops at what its backward reads,
  // skipping the projections whose outputs only make the layer output (e.g.
  // the MLP's last one). Called again before backward_layer when the layer
  // was checkpointed, so it must depend on nothing but its arguments, the
  // weights and the step's dropout seeds.
  virtual std::unique_ptr<SavedActivations> forward_layer(size_t index, const Tensor& x, NormOutput& norm,
                                                          Tensor* out, const TokenLayout& layout) = 0;
  // On entry dresidual holds d(loss)/d(layer output); on exit d(loss)/d(layer
  // input). Without input_grad (the first layer under a frozen embedding:
  // nothing reads it) the layer skips the input-side products that only make
  // it, and the norm backwards behind them where their parameters do not
  // train; dresidual's exit value is then meaningless.
  virtual void backward_layer(size_t index, SavedActivations& saved, Tensor& dresidual, const Tensor& x,
                              const TokenLayout& layout, bool input_grad) = 0;
  // Whether a norm's weight or bias trains (its backward is then needed for them).
  static bool trains(const NormParameters& norm) {
    return (norm.weight && norm.weight->trainable()) || (norm.bias && norm.bias->trainable());
  }
  // The norm layer `index` applies to its input.
  virtual const NormParameters& input_norm(size_t index) const = 0;
  // With options_.mlp_chunk_tokens the MLP runs over row blocks of this
  // many tokens (the last one shorter), and the layer keeps only its input.
  bool mlp_chunked() const { return options_.mlp_chunk_tokens > 0; }
  int64_t mlp_chunk_rows(int64_t tokens) const {
    return mlp_chunked() ? std::min(options_.mlp_chunk_tokens, tokens) : tokens;
  }

  // The attention heads (and key/value heads) this rank computes: a share
  // of them under tensor parallelism, else all.
  int64_t local_heads() const { return config_.num_attention_heads / tensor_ranks(); }
  // With more ranks than key/value heads each rank holds the one its query heads read.
  int64_t local_kv_heads() const { return std::max<int64_t>(1, config_.num_key_value_heads / tensor_ranks()); }

  // Rotary causal self-attention, as every architecture here computes it.
  struct AttentionActivations {
    // [B, T, H, D] heads (k and v: the key/value heads), q and k rotated:
    // separate projections' outputs, or views of one fused output's columns.
    HeadsView q, k, v;
    Tensor attn, lse;  // output [B, T, Hq, D], log-sum-exp [B, Hq, T]
  };
  // Rotates saved.q and saved.k in place (the first rotary_dim() features of
  // each head), then allocates and computes saved.attn and saved.lse (scale
  // 1/sqrt(head_dim)).
  void attention_forward(AttentionActivations& saved, const TokenLayout& layout);
  // Writes d(loss)/d(q, k, v) as the projections made them (rotation
  // undone) into grads' views (shaped as saved's, every column overwritten),
  // from dattn = d(loss)/d(saved.attn).
  struct AttentionGradients {
    HeadsView dq, dk, dv;
  };
  void attention_backward(const AttentionActivations& saved, const Tensor& dattn, const TokenLayout& layout,
                          const AttentionGradients& grads);

  // out = a + b, and norm = out under the next norm: layer index + 1's
  // input norm, or the final norm after the last layer.
  void add_next_norm(size_t index, Tensor& out, NormOutput& norm, const Tensor& a, const Tensor& b);

 public:
  // One step through this model's decoder layers: index k of residuals and
  // layers is layer options.layers.first_layer + k.
  struct DecoderStep {
    StepTokens tokens;
    std::vector<Tensor> residuals;  // residuals[k]: input of layer k; back(): output of the last
    std::vector<std::unique_ptr<SavedActivations>> layers;  // null: not kept (eval, or checkpointed)
    NormOutput final_norm;  // last stage: residuals.back() under the final norm, made by the last layer
    Tensor dnorm;           // last stage: d(loss)/d(final norm output), made by the loss
  };

 private:
  // The loss, and when grad_scale is given the backward pass too (skipped
  // when no token counts).
  float run_step(const Tensor& input_ids, const Tensor& targets, const Tensor* position_ids,
                 const float* grad_scale);
  std::vector<float> run_heads_step(const Tensor& input_ids, const Tensor& targets, const Tensor* position_ids,
                                    bool training, bool lm_head, const TokenLogpsGradient* gradient,
                                    const HiddenHead* head);
  // Where each sequence starts in host i32 [B, T] rows: every row start, and
  // every restart of position_ids (packed rows).
  static std::vector<int64_t> sequence_starts(const Tensor& targets, const Tensor* position_ids);
  static SequenceLogps sum_by_sequence(const std::vector<float>& token_logps, const Tensor& targets,
                                       const Tensor* position_ids);
  StepTokens upload_step_tokens(const Tensor& input_ids, const Tensor& targets, const Tensor* position_ids);
  // position_ids' layout on the backend (checked: host i32 [B, T], each row
  // 0, 1, ... with a restart at 0 where an example starts), or 0..T-1 per
  // row where it is null.
  TokenLayout upload_layout(const Tensor* position_ids, int64_t B, int64_t T);
  void forward_decoder(DecoderStep& step, const Tensor& input_ids, const Tensor& targets,
                       const Tensor* position_ids, Tensor input, bool training);
  Tensor backward_decoder(DecoderStep& step, Tensor dresidual);
  // Set while forward_cached runs: attention_forward then caches the layer's
  // keys and values and attends over the cache. seq_tokens (the longest
  // active row after the step) sizes the rotary frequencies as forward()'s T.
  struct CachedStep {
    KvCache* cache = nullptr;
    size_t layer = 0;
    int64_t seq_tokens = 0;
    TokenLayout layout;                    // positions i32 [B*T] on the backend; no cu_seqlens
    std::vector<int64_t> first_positions;  // per row: its first token's position (host)
  };
  CachedStep* cached_step_ = nullptr;
  void attend_cached(AttentionActivations& saved);
  // options_.offload_activations: the checkpoints' host buffers, made on
  // the first training step.
  std::unique_ptr<ActivationOffload> activation_offload_;
  ActivationOffload& activation_offload();

 public:
  // Checkpoint offload's pinned host bytes and copies, for the planner (null
  // before the first offloaded step).
  const ActivationOffload* activation_offload_state() const { return activation_offload_.get(); }
};

}  // namespace ft
