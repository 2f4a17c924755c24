// Data parallelism across the ranks of `mpirun -np D ./finetune`: every rank
// holds the whole model and trains on its own share of each optimizer step's
// micro-batches; the adapters' gradients (the trainable set: never the frozen
// base) are summed over the ranks before clipping and AdamW, so each rank
// takes the same update a single process would with grad_accum_steps x D.
//
// The split: every rank draws all grad_accum_steps x D micro-batches of the
// step from the same shuffled order (so the loader position, the token count
// that weights each micro-batch, and the dropout seeds are the global ones),
// and rank r trains micro-batches r, r + D, r + 2D, ...
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "trainer/data/data.h"
#include "trainer/optimizer.h"
#include "trainer/parallel/collectives.h"
#include "trainer/train_config.h"
#include "trainer/train_state.h"

namespace ft {

// How world_ranks ranks share the work: parallel.data x parallel.pipeline x
// parallel.tensor, parallel.data 0 taking what the others leave (world_ranks
// / (pipeline x tensor)). Refuses a layout that does not cover the world
// exactly; launched_as says where world_ranks came from in the message
// (e.g. "mpirun -np 4").
struct ParallelLayout {
  int64_t data = 1, pipeline = 1, tensor = 1;
};
ParallelLayout parallel_layout(const TrainConfig& config, int64_t world_ranks, const std::string& launched_as);

// "<config>: parallel.<key>: <value>: ", how a refusal of a layout starts.
std::string parallel_field(const TrainConfig& config, const char* key, int64_t value);

// The data-parallel rank count of a run (parallel_layout over the job's
// ranks): the copies of the model, each parallel.pipeline x parallel.tensor ranks.
int64_t data_parallel_ranks(const TrainConfig& config, const Collectives& collectives);

// Every rank runs the same command: command is this rank's (its config
// file's contents, --set overrides and flags, as text), compared with rank
// 0's. An MPMD launch with other --set per rank trained stages with another
// lr, or hung until parallel.timeout_s when the step counts differed. Every
// rank calls it together; each differing rank's error names its command.
void check_same_command(Collectives& collectives, const std::string& command);

// Refuses a job whose ranks train on different kinds of device (one rank's
// GPU unusable, say), whose gradients could not be summed.
void check_same_device(Collectives& collectives, Backend& backend);

struct RankBatch {
  int64_t index;  // within the step's global micro-batches: step * per_step + index seeds its dropout
  Batch batch;    // padding trimmed
};

struct StepBatches {
  int64_t per_step = 0;        // grad_accum_steps x ranks
  int64_t counted_tokens = 0;  // over all ranks' micro-batches: what each micro-batch's loss is divided by
  int64_t tokens = 0;          // over all ranks' micro-batches, padding trimmed
  std::vector<RankBatch> mine;
};

StepBatches draw_step_batches(DataLoader& loader, Allocator& host, int64_t grad_accum_steps,
                              const Collectives& collectives);

// Sums the trainable parameters' gradients (all of them, also with a
// sharded optimizer state: the clipping norm needs every one) and this
// rank's loss_sum over all ranks; returns the global loss_sum.
double sum_over_ranks(Collectives& collectives, Backend& backend, Allocator& host,
                      const std::vector<Parameter*>& trainable, double loss_sum);

// True on every rank when any rank says so (a stop signal reaches the ranks
// at different steps; they must stop at the same one).
bool any_rank(Collectives& collectives, bool value);
// The signal that stops the job, the same on every rank: SIGTERM when any
// rank got one, else SIGINT when any did, else 0.
int job_stop_signal(Collectives& collectives, int signal);

// What a checkpoint records of the layout: it resumes on as many ranks only
// (the global batch and the data position depend on it).
IdentityField data_parallel_identity(int64_t ranks);
// And the stages (recorded with parallel.pipeline > 1): each holds its layers' state.
IdentityField pipeline_identity(int64_t stages);

}  // namespace ft
