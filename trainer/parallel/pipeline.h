// Pipeline parallelism across the ranks of `mpirun -np D*P ./finetune` with
// parallel.pipeline: P. Each rank holds one stage, a contiguous share of the
// decoder layers (plan_pipeline's split, balanced by the planner's per-layer
// bytes and FLOPs): the first stage also embeds the tokens, the last runs the
// final norm, the LM head and the loss. Rank r is stage r % P of pipeline
// r / P, so one pipeline's stages are neighbouring ranks (one node's
// devices); the D ranks holding the same stage are data parallel over it
// (data_parallel.h), summing its adapters' gradients among themselves.
//
// Every rank draws the step's micro-batches itself (they are small), so only
// activations [B, T, C] go forward and their gradients backward, in the
// activation dtype. The micro-batches run 1F1B: stage s starts P - 1 - s
// forwards, then alternates one forward and one backward, then drains the
// backwards, so it holds at most P - s micro-batches' activations (with
// activation checkpointing: their layer inputs). Each stage accumulates its
// adapters' gradients in the micro-batches' order and the loss is summed in
// that order on the last stage, exactly as one process does; the gradient
// norm is summed stage after stage in the one process's parameter order. So
// a pipeline trains bit for bit as one process on the CPU.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/causal_lm.h"
#include "trainer/data/data.h"
#include "trainer/evaluate.h"
#include "trainer/optimizer.h"
#include "trainer/parallel/collectives.h"
#include "trainer/train_config.h"

namespace ft {

// With parallel.tensor T, rank r is tensor rank r % T of its stage, the
// stage (r / T) % P of pipeline r / (T x P) (trainer/parallel/tensor_parallel.h).
struct RankGroups {
  std::unique_ptr<Collectives> stages;    // this rank's pipeline: rank() is its stage
  std::unique_ptr<Collectives> replicas;  // the ranks holding this stage's share: rank() is the data-parallel rank
  std::unique_ptr<Collectives> tensor;    // the ranks sharing this stage's layers: rank() is the tensor rank
};
// Every rank of world calls it together (world_size a multiple of pipeline x tensor).
RankGroups split_ranks(Collectives& world, int64_t pipeline, int64_t tensor = 1);

// The base weights' fingerprint of a pipeline whose stages each loaded (and
// hashed) only their layers: every stage's LanguageModel::base_fingerprint,
// in stage order ("stage 0 xxh3 ..., stage 1 xxh3 ..."), the same string on
// every stage. Every stage of stages calls it together.
std::string staged_base_fingerprint(Collectives& stages, const std::string& stage_fingerprint);

// Refuses what a pipeline does not run (before anything is loaded, on every
// rank alike), each error naming the config field: a model or training mode
// stages cannot split (what the planner refuses too), and for a run also
// what needs the whole model in one process (generation, a random init).
void check_pipeline_model(const TrainConfig& config, const std::string& model_type);
void check_pipeline_run(const TrainConfig& config, const std::string& model_type);

struct PipelineMicroBatch {
  const Batch* batch = nullptr;  // padding trimmed, counted_tokens > 0
  uint64_t dropout_seed = 0;
  float grad_scale = 0.0f;  // its share of the step's counted tokens
};
// One step's forwards and backwards of this stage (1F1B), adding the
// gradients of grad_scale x loss to the stage's adapters. Returns the sum of
// loss x counted tokens over the micro-batches on the last stage, 0 on the
// others.
double pipeline_forward_backward(CausalLM& model, Collectives& stages, Allocator& host,
                                 const std::vector<PipelineMicroBatch>& micro_batches);

// The squared global gradient norm, every stage's trainable parameters
// summed in the one-process order, known to every stage; each stage's share
// over its tensor group's shards (tensor_parallel.h) when it has several.
double pipeline_squared_grad_norm(Backend& backend, const std::vector<Parameter*>& trainable, Collectives& stages,
                                  Allocator& host, Collectives& tensor);

// The eval loss through the pipeline, every stage taking part; the result
// on every stage.
EvalLoss pipeline_eval_loss(CausalLM& model, Collectives& stages, Allocator& host, const DataLoader& eval,
                            int64_t max_batches);

}  // namespace ft
