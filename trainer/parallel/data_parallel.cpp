#include "trainer/parallel/data_parallel.h"

#include <csignal>
#include <string>

#include "kernels/checked_mul.h"
#include "kernels/error.h"
#include "model/checksum.h"
#include "trainer/enum_names.h"
#include "trainer/evaluate.h"

namespace ft {

ParallelLayout parallel_layout(const TrainConfig& config, int64_t world_ranks, const std::string& launched_as) {
  ParallelLayout layout;
  layout.pipeline = config.parallel.pipeline;
  layout.tensor = config.parallel.tensor;
  const int64_t copy = layout.pipeline * layout.tensor;  // the ranks holding one copy of the model
  const std::string tensor = layout.tensor > 1 ? " x parallel.tensor " + std::to_string(layout.tensor) : "";
  FT_CHECK(config.parallel.data > 0 || world_ranks % copy == 0, config.source, ": parallel.pipeline ",
           layout.pipeline, tensor, " must divide the job's ", world_ranks, " ranks (", launched_as,
           "): each data-parallel copy of the model runs on parallel.pipeline",
           layout.tensor > 1 ? " x parallel.tensor" : "", " ranks");
  layout.data = config.parallel.data == 0 ? world_ranks / copy : config.parallel.data;
  FT_CHECK(layout.data * copy == world_ranks, config.source, ": parallel.data ", layout.data,
           " x parallel.pipeline ", layout.pipeline, tensor, " must equal the job's ", world_ranks, " ranks (",
           launched_as, "); leave parallel.data out to use every rank");
  return layout;
}

std::string parallel_field(const TrainConfig& config, const char* key, int64_t value) {
  return config.source + ": parallel." + key + ": " + std::to_string(value) + ": ";
}

int64_t data_parallel_ranks(const TrainConfig& config, const Collectives& collectives) {
  const int64_t world = collectives.world_size();
  FT_CHECK(world == 1 || config.objective == Objective::sft, config.source, ": objective: ",
           enum_name(config.objective), " runs in one process; a job of ", world, " ranks (mpirun -np ", world,
           ": data parallelism, parallel.pipeline, parallel.tensor) covers objective: sft");
  return parallel_layout(config, world, "mpirun -np " + std::to_string(world)).data;
}

void check_same_command(Collectives& collectives, const std::string& command) {
  if (collectives.world_size() == 1) return;
  Checksum checksum;
  checksum.add_text(command);
  const uint64_t mine = checksum.value();
  const bool same = broadcast_u64(collectives, mine, 0) == mine;
  const auto differing = int64_t(collectives.sum(same ? 0.0 : 1.0));
  FT_CHECK(differing == 0, differing, " of the job's ", collectives.world_size(), " ranks run another command than ",
           "rank 0 (config file contents, --set overrides, flags): this rank runs ",
           same && collectives.rank() > 0 ? "rank 0's: " : "", command, "; every rank must run the same finetune command");
}

void check_same_device(Collectives& collectives, Backend& backend) {
  const double on_cpu = collectives.sum(backend.device() == Device::cpu ? 1.0 : 0.0);
  FT_CHECK(on_cpu == 0.0 || on_cpu == double(collectives.world_size()), int64_t(on_cpu), " of the job's ",
           collectives.world_size(), " ranks train on the CPU and the others on a GPU; every rank must use the same "
           "kind of device (set device: cuda or cpu, and one GPU per rank)");
}

StepBatches draw_step_batches(DataLoader& loader, Allocator& host, int64_t grad_accum_steps,
                              const Collectives& collectives) {
  StepBatches step;
  const int64_t ranks = collectives.world_size();
  step.per_step = checked_mul(grad_accum_steps, ranks);
  for (int64_t i = 0; i < step.per_step; ++i) {
    Batch batch = trim_padding(loader.next(), host);
    step.counted_tokens += batch.counted_tokens;
    step.tokens += batch.input_ids.numel();
    if (i % ranks == collectives.rank()) step.mine.push_back({i, std::move(batch)});
  }
  return step;
}

double sum_over_ranks(Collectives& collectives, Backend& backend, Allocator& host,
                      const std::vector<Parameter*>& trainable, double loss_sum) {
  if (collectives.world_size() == 1) return loss_sum;
  std::vector<Tensor*> gradients;
  for (Parameter* p : trainable) gradients.push_back(&p->grad);
  collectives.sum_in_place(backend, host, gradients);
  return collectives.sum(loss_sum);
}

bool any_rank(Collectives& collectives, bool value) { return collectives.sum(value ? 1.0 : 0.0) > 0.0; }

int job_stop_signal(Collectives& collectives, int signal) {
  // Fewer than 1024 ranks: the sum counts the SIGTERMs in its 1024s, the SIGINTs below.
  const double got = collectives.sum(signal == SIGTERM ? 1024.0 : signal == SIGINT ? 1.0 : 0.0);
  return got >= 1024.0 ? SIGTERM : got > 0.0 ? SIGINT : 0;
}

IdentityField data_parallel_identity(int64_t ranks) {
  return {"parallel.data", "the data-parallel ranks (mpirun -np)", std::to_string(ranks), false};
}

IdentityField pipeline_identity(int64_t stages) {
  return {"parallel.pipeline", "the pipeline stages (parallel.pipeline)", std::to_string(stages), false};
}

}  // namespace ft
