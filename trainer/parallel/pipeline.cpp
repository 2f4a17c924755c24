#include "trainer/parallel/pipeline.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <string_view>

#include "kernels/error.h"
#include "model/families.h"
#include "trainer/parallel/data_parallel.h"
#include "trainer/parallel/tensor_parallel.h"

namespace ft {

RankGroups split_ranks(Collectives& world, int64_t pipeline, int64_t tensor) {
  const int rank = world.rank(), stages = int(pipeline), shares = int(tensor), copy = stages * shares;
  RankGroups groups;
  groups.stages = world.split(rank / copy * shares + rank % shares, rank / shares % stages);
  groups.replicas = world.split(rank % copy, rank / copy);
  groups.tensor = world.split(rank / shares, rank % shares);
  return groups;
}

std::string staged_base_fingerprint(Collectives& stages, const std::string& stage_fingerprint) {
  constexpr std::string_view kPrefix = "xxh3 ";
  FT_CHECK(stage_fingerprint.starts_with(kPrefix) && stage_fingerprint.size() == kPrefix.size() + 16,
           "a stage's base fingerprint \"", stage_fingerprint, "\" is not xxh3 and 16 hex digits");
  const uint64_t mine = std::stoull(stage_fingerprint.substr(kPrefix.size()), nullptr, 16);
  std::string all;
  for (int stage = 0; stage < stages.world_size(); ++stage) {
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(broadcast_u64(stages, mine, stage)));
    all += (stage ? ", stage " : "stage ") + std::to_string(stage) + " xxh3 " + hex;
  }
  return all;
}

void check_pipeline_model(const TrainConfig& config, const std::string& model_type) {
  if (config.parallel.pipeline == 1) return;
  const std::string where = parallel_field(config, "pipeline", config.parallel.pipeline);
  FT_CHECK(model_family(model_type).pipeline, where, "pipeline stages split a decoder-only model's layers; model_type ",
           model_type, " is an encoder-decoder model (run it data parallel)");
  FT_CHECK(config.objective == Objective::sft, where, "the pipeline covers objective: sft");
  FT_CHECK(config.trainable == Trainable::lora, where, "the pipeline trains LoRA adapters (trainable: lora); "
           "full fine-tuning (trainable: all) runs data parallel");
  FT_CHECK(config.offload_base == OffloadTarget::device, where, "the stages split the layers over the devices; "
           "leave offload.base at device");
}

void check_pipeline_run(const TrainConfig& config, const std::string& model_type) {
  check_pipeline_model(config, model_type);
  if (config.parallel.pipeline == 1) return;
  const std::string where = parallel_field(config, "pipeline", config.parallel.pipeline);
  FT_CHECK(config.init == InitMode::pretrained, where, "each stage loads its layers from the checkpoint; init: "
           "random numbers the whole model's tensors, which a stage does not hold (use init: pretrained)");
  FT_CHECK(config.task_metric == TaskMetric::none, where, "task_metric: rouge generates with the whole model, "
           "which no rank holds; set task_metric: none and score the saved adapter with `finetune generate`");
  FT_CHECK(config.quantization.save_base.empty(), where, "quantization.save_base writes the whole quantized "
           "base, which no rank holds; save it from a one-process run");
}

namespace {

// A stage's input or output, or its gradient: [B, T, C] in the activation dtype.
Tensor stage_tensor(CausalLM& model, const Batch& batch) {
  return model.backend().empty({batch.input_ids.dim(0), batch.input_ids.dim(1), model.config().hidden_size},
                               model.options().activation_dtype, MemCategory::activations);
}

// One operation of a stage on a micro-batch: its forward, or its backward.
struct StageOp {
  bool forward = true;
  size_t micro_batch = 0;
};

// 1F1B for stage `stage` of `stages` over `count` micro-batches.
std::vector<StageOp> one_forward_one_backward(int stage, int stages, size_t count) {
  std::vector<StageOp> ops;
  size_t forwards = 0, backwards = 0;
  const size_t warmup = std::min(size_t(stages - 1 - stage), count);
  while (forwards < warmup) ops.push_back({true, forwards++});
  while (forwards < count) {
    ops.push_back({true, forwards++});
    ops.push_back({false, backwards++});
  }
  while (backwards < count) ops.push_back({false, backwards++});
  return ops;
}

// Runs a stage's operations in order. A forward reads its input from the
// previous stage (not on the first) and sends its output to the next (not
// on the last); a backward reads d(output) from the next stage and sends
// d(input) to the previous. Sends complete only when taken, so between two
// operations one exchange both sends the first's result and receives the
// second's input: Megatron-LM's pairing of 1F1B's transfers, in which no
// two stages ever wait on each other. run(op, batch, received) returns what
// the operation sends (undefined: nothing).
template <class Run>
void run_stage_ops(CausalLM& model, Collectives& stages, Allocator& host, const std::vector<StageOp>& ops,
                   const std::vector<const Batch*>& batches, const Run& run) {
  const int stage = stages.rank();
  Tensor result;
  int result_to = 0;
  for (size_t i = 0; i <= ops.size(); ++i) {
    std::vector<Collectives::Transfer> sends, receives;
    if (result.defined()) sends.push_back({&result, result_to});
    Tensor received;
    const bool more = i < ops.size();
    if (more && (ops[i].forward ? !model.first_stage() : !model.last_stage())) {
      received = stage_tensor(model, *batches[ops[i].micro_batch]);
      receives.push_back({&received, ops[i].forward ? stage - 1 : stage + 1});
    }
    if (!sends.empty() || !receives.empty()) stages.exchange(model.backend(), host, sends, receives);
    result = Tensor{};
    if (!more) break;
    result = run(ops[i], *batches[ops[i].micro_batch], std::move(received));
    result_to = ops[i].forward ? stage + 1 : stage - 1;
  }
}

}  // namespace

double pipeline_forward_backward(CausalLM& model, Collectives& stages, Allocator& host,
                                 const std::vector<PipelineMicroBatch>& micro_batches) {
  std::vector<const Batch*> batches;
  for (const PipelineMicroBatch& micro : micro_batches) batches.push_back(micro.batch);
  std::deque<std::unique_ptr<CausalLM::DecoderStep>> in_flight;  // forwarded, not yet backwarded: oldest first
  double loss_sum = 0.0;
  auto run = [&](const StageOp& op, const Batch& batch, Tensor received) {
    const PipelineMicroBatch& micro = micro_batches[op.micro_batch];
    // The same seed for the backward: a checkpointed layer's recomputation draws the same masks.
    model.set_dropout_seed(micro.dropout_seed);
    Tensor output;
    if (op.forward) {
      float loss = 0.0f;
      in_flight.push_back(
          model.stage_forward(batch.input_ids, batch.targets, batch.positions(), std::move(received), &output,
                              micro.grad_scale, &loss));
      loss_sum += double(loss) * double(batch.counted_tokens);
      return model.last_stage() ? Tensor{} : output;
    }
    Tensor dinput = model.stage_backward(*in_flight.front(), std::move(received));
    in_flight.pop_front();
    return dinput;  // undefined on the first stage
  };
  run_stage_ops(model, stages, host,
                one_forward_one_backward(stages.rank(), stages.world_size(), micro_batches.size()), batches, run);
  return model.last_stage() ? loss_sum : 0.0;
}

// Stage s continues the sum of stages 0..s-1; the last one's total reaches
// every stage as a sum to which the others add exact zeros.
double pipeline_squared_grad_norm(Backend& backend, const std::vector<Parameter*>& trainable, Collectives& stages,
                                  Allocator& host, Collectives& tensor) {
  const int stage = stages.rank(), last = stages.world_size() - 1;
  const double before = stage == 0 ? 0.0 : receive_double(stages, backend, host, stage - 1);
  const double through = tensor.world_size() == 1 ? add_squared_gradients(backend, trainable, before)
                                                  : before + tensor_squared_grad_norm(tensor, backend, trainable);
  if (stage < last) send_double(stages, backend, host, through, stage + 1);
  return stages.sum(stage == last ? through : 0.0);
}

EvalLoss pipeline_eval_loss(CausalLM& model, Collectives& stages, Allocator& host, const DataLoader& eval,
                            int64_t max_batches) {
  const std::vector<Batch> batches = eval_batches(eval, max_batches, host);
  std::vector<const Batch*> pointers;
  std::vector<StageOp> forwards;
  for (const Batch& batch : batches) {
    forwards.push_back({true, pointers.size()});
    pointers.push_back(&batch);
  }
  double loss_sum = 0.0;
  int64_t tokens = 0;
  run_stage_ops(model, stages, host, forwards, pointers, [&](const StageOp&, const Batch& batch, Tensor received) {
    Tensor output;
    loss_sum += double(model.stage_eval_forward(batch.input_ids, batch.targets, batch.positions(),
                                                std::move(received), &output)) *
                double(batch.counted_tokens);
    tokens += batch.counted_tokens;
    return output;  // undefined on the last stage
  });
  model.release_logits();
  return eval_loss_of(stages.sum(model.last_stage() ? loss_sum : 0.0), tokens);
}

}  // namespace ft
