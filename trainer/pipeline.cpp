#include "trainer/pipeline.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <sstream>

#include "kernels/error.h"
#include "trainer/plan.h"

namespace ft {

RankGroups split_ranks(Collectives& world, int64_t pipeline) {
  const int rank = world.rank(), stages = int(pipeline);
  RankGroups groups;
  groups.stages = world.split(rank / stages, rank % stages);
  groups.replicas = world.split(rank % stages, rank / stages);
  return groups;
}

namespace {

std::string pipeline_field(const TrainConfig& config) {
  return config.source + ": parallel.pipeline: " + std::to_string(config.parallel.pipeline) + ": ";
}

}  // namespace

void check_pipeline_model(const TrainConfig& config, const std::string& model_type) {
  if (config.parallel.pipeline == 1) return;
  const std::string where = pipeline_field(config);
  FT_CHECK(model_type != "t5", where, "pipeline stages split a decoder-only model's layers; model_type t5 is an "
           "encoder-decoder model (run it data parallel)");
  FT_CHECK(config.objective == Objective::sft, where, "the pipeline covers objective: sft");
  FT_CHECK(config.trainable == Trainable::lora, where, "the pipeline trains LoRA adapters (trainable: lora); "
           "full fine-tuning (trainable: all) runs data parallel");
  FT_CHECK(config.offload_base == OffloadTarget::device, where, "the stages split the layers over the devices; "
           "leave offload.base at device");
}

void check_pipeline_run(const TrainConfig& config, const std::string& model_type) {
  check_pipeline_model(config, model_type);
  if (config.parallel.pipeline == 1) return;
  const std::string where = pipeline_field(config);
  FT_CHECK(config.init == InitMode::pretrained, where, "each stage loads its layers from the checkpoint; init: "
           "random numbers the whole model's tensors, which a stage does not hold (use init: pretrained)");
  FT_CHECK(config.task_metric == TaskMetric::none, where, "task_metric: rouge generates with the whole model, "
           "which no rank holds; set task_metric: none and score the saved adapter with `finetune generate`");
  FT_CHECK(config.quantization.save_base.empty(), where, "quantization.save_base writes the whole quantized "
           "base, which no rank holds; save it from a one-process run");
}

StageLayout pipeline_stage_layout(const TrainConfig& config, int64_t world_ranks, int stage, bool on_gpu) {
  PlanOptions options;
  options.policy = on_gpu ? MemoryPolicy::cuda : MemoryPolicy::cpu;
  options.ranks = world_ranks;
  const PipelinePlan plan = plan_pipeline(config, options);
  StageLayout layout;
  layout.layers = plan.stages[size_t(stage)].layers;
  std::ostringstream text;
  for (size_t s = 0; s < plan.stages.size(); ++s)
    text << (s ? ", " : "") << "stage " << s << ": layers " << plan.stages[s].layers.first_layer << "-"
         << plan.stages[s].layers.end_layer - 1;
  text << "; 1F1B bubble " << std::lround(100.0 * plan.bubble_fraction) << "% of each step";
  layout.description = text.str();
  return layout;
}

namespace {

// A stage's input or output, or its gradient: [B, T, C] in the activation dtype.
Tensor stage_tensor(CausalLM& model, const Batch& batch) {
  return model.backend().empty({batch.input_ids.dim(0), batch.input_ids.dim(1), model.config().hidden_size},
                               model.options().activation_dtype, MemCategory::activations);
}

}  // namespace

double pipeline_forward_backward(CausalLM& model, Collectives& stages, Allocator& host,
                                 const std::vector<PipelineMicroBatch>& micro_batches) {
  Backend& backend = model.backend();
  const int stage = stages.rank();
  const size_t count = micro_batches.size();
  std::deque<std::unique_ptr<CausalLM::DecoderStep>> in_flight;  // forwarded, not yet backwarded: oldest first
  size_t forwards = 0, backwards = 0;
  double loss_sum = 0.0;
  auto forward = [&] {
    const PipelineMicroBatch& micro = micro_batches[forwards++];
    model.set_dropout_seed(micro.dropout_seed);
    Tensor input, output;
    if (!model.first_stage()) {
      input = stage_tensor(model, *micro.batch);
      stages.receive(backend, host, input, stage - 1);
    }
    float loss = 0.0f;
    in_flight.push_back(model.stage_forward(micro.batch->input_ids, micro.batch->targets, std::move(input), &output,
                                            micro.grad_scale, &loss));
    if (!model.last_stage()) stages.send(backend, host, output, stage + 1);
    loss_sum += double(loss) * double(micro.batch->counted_tokens);
  };
  auto backward = [&] {
    const PipelineMicroBatch& micro = micro_batches[backwards++];
    model.set_dropout_seed(micro.dropout_seed);  // a checkpointed layer's recomputation draws the same masks
    Tensor doutput;
    if (!model.last_stage()) {
      doutput = stage_tensor(model, *micro.batch);
      stages.receive(backend, host, doutput, stage + 1);
    }
    Tensor dinput = model.stage_backward(*in_flight.front(), std::move(doutput));
    in_flight.pop_front();
    if (!model.first_stage()) stages.send(backend, host, dinput, stage - 1);
  };
  const size_t warmup = std::min(size_t(stages.world_size() - 1 - stage), count);
  while (forwards < warmup) forward();
  while (forwards < count) {
    forward();
    backward();
  }
  while (backwards < count) backward();
  stages.finish_sends();
  return model.last_stage() ? loss_sum : 0.0;
}

namespace {

// A double between stages, as its 8 bytes.
void send_double(Collectives& stages, Backend& backend, Allocator& host, double value, int to) {
  Tensor bytes = Tensor::empty({int64_t(sizeof value)}, DType::u8, host, MemCategory::workspace);
  std::memcpy(bytes.data, &value, sizeof value);
  stages.send(backend, host, bytes, to);
}

double receive_double(Collectives& stages, Backend& backend, Allocator& host, int from) {
  double value = 0.0;
  Tensor bytes = Tensor::empty({int64_t(sizeof value)}, DType::u8, host, MemCategory::workspace);
  stages.receive(backend, host, bytes, from);
  std::memcpy(&value, bytes.data, sizeof value);
  return value;
}

}  // namespace

// Stage s continues the sum of stages 0..s-1; the last one's total reaches
// every stage as a sum to which the others add exact zeros.
double pipeline_squared_grad_norm(AdamW& optimizer, Collectives& stages, Allocator& host) {
  Backend& backend = optimizer.backend();
  const int stage = stages.rank(), last = stages.world_size() - 1;
  const double before = stage == 0 ? 0.0 : receive_double(stages, backend, host, stage - 1);
  const double through = optimizer.add_squared_gradients(before);
  if (stage < last) send_double(stages, backend, host, through, stage + 1);
  stages.finish_sends();
  return stages.sum(stage == last ? through : 0.0);
}

EvalLoss pipeline_eval_loss(CausalLM& model, Collectives& stages, Allocator& host, const DataLoader& eval,
                            int64_t max_batches) {
  Backend& backend = model.backend();
  const int stage = stages.rank();
  const int64_t batches = max_batches > 0 ? std::min(max_batches, eval.batches_per_epoch()) : eval.batches_per_epoch();
  double loss_sum = 0.0;
  EvalLoss result;
  for (int64_t i = 0; i < batches; ++i) {
    const Batch batch = trim_padding(eval.batch_in_order(i), host);
    if (batch.counted_tokens == 0) continue;
    Tensor input, output;
    if (!model.first_stage()) {
      input = stage_tensor(model, batch);
      stages.receive(backend, host, input, stage - 1);
    }
    const float loss = model.stage_eval_forward(batch.input_ids, batch.targets, std::move(input), &output);
    if (!model.last_stage()) stages.send(backend, host, output, stage + 1);
    loss_sum += double(loss) * double(batch.counted_tokens);
    result.tokens += batch.counted_tokens;
  }
  stages.finish_sends();
  loss_sum = stages.sum(model.last_stage() ? loss_sum : 0.0);
  result.loss = result.tokens ? loss_sum / double(result.tokens) : 0.0;
  result.perplexity = std::exp(result.loss);
  return result;
}

namespace {

// What a stage's tensors are, sent ahead of their bytes: one line per
// tensor, "name dtype-index dim dim ...".
std::string describe_tensors(const NamedTensors& tensors) {
  std::ostringstream text;
  for (const auto& [name, tensor] : tensors) {
    text << name << " " << int(tensor.dtype);
    for (int64_t d : tensor.shape) text << " " << d;
    text << "\n";
  }
  return text.str();
}

NamedTensors empty_tensors(const std::string& description, Allocator& host) {
  NamedTensors tensors;
  std::istringstream lines(description);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string name;
    int dtype = 0;
    fields >> name >> dtype;
    Shape shape;
    for (int64_t d = 0; fields >> d;) shape.push_back(d);
    tensors.emplace_back(name, Tensor::empty(shape, DType(dtype), host, MemCategory::workspace));
  }
  return tensors;
}

}  // namespace

NamedTensors gather_on_first_stage(Collectives& stages, Backend& backend, Allocator& host, NamedTensors mine) {
  if (stages.rank() != 0) {
    const std::string description = describe_tensors(mine);
    send_double(stages, backend, host, double(description.size()), 0);
    Tensor text = Tensor::empty({int64_t(description.size())}, DType::u8, host, MemCategory::workspace);
    std::memcpy(text.data, description.data(), description.size());
    stages.send(backend, host, text, 0);
    for (auto& [name, tensor] : mine) stages.send(backend, host, tensor, 0);
    stages.finish_sends();
    return mine;
  }
  for (int from = 1; from < stages.world_size(); ++from) {
    const auto length = int64_t(receive_double(stages, backend, host, from));
    Tensor text = Tensor::empty({length}, DType::u8, host, MemCategory::workspace);
    stages.receive(backend, host, text, from);
    NamedTensors theirs = empty_tensors(std::string(static_cast<const char*>(text.data), size_t(length)), host);
    for (auto& [name, tensor] : theirs) {
      stages.receive(backend, host, tensor, from);
      mine.emplace_back(name, tensor);
    }
  }
  return mine;
}

}  // namespace ft
