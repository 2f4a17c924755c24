// Tensor parallelism across the ranks of `mpirun -np D*P*T ./finetune` with
// parallel.tensor: T. The model holds 1/T of every decoder layer and sums
// over its tensor group inside the forward and backward
// (model/tensor_parallel.h); here is what the run adds around it: the group
// over MPI/NCCL, the partial gradients summed, the gradient norm over every
// shard, whole tensors gathered for the adapter and the training state, and
// a shard's slice of a whole tensor on --resume.
//
// Rank r is tensor rank r % T of the T neighbouring ranks that share one
// layer (one node's GPUs: the sums run every layer), of pipeline stage
// (r / T) % P, of data-parallel replica r / (T x P) (pipeline.h's split_ranks).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/model_config.h"
#include "model/parameter.h"
#include "model/tensor_parallel.h"
#include "trainer/parallel/collectives.h"
#include "trainer/train_config.h"
#include "trainer/train_state.h"

namespace ft {

// The model's tensor group over a Collectives group (a split of the world).
class CollectivesTensorGroup final : public TensorParallelGroup {
 public:
  CollectivesTensorGroup(Collectives& group, Allocator& host) : group_(group), host_(host) {}
  int64_t rank() const override { return group_.rank(); }
  int64_t ranks() const override { return group_.world_size(); }

 private:
  void sum_f32(Backend& backend, Tensor& t) override { group_.sum_in_place(backend, host_, {&t}); }
  void max_f32(Backend& backend, Tensor& t) override { group_.max_in_place(backend, host_, {&t}); }
  Collectives& group_;
  Allocator& host_;
};

// Refuses what tensor parallelism does not run (on every rank alike, before
// anything loads), each error naming the field: a model or training mode it
// cannot split (what the planner refuses too), and for a run also what needs
// the whole model in one process.
void check_tensor_parallel_model(const TrainConfig& config, const ModelConfig& model);
void check_tensor_parallel_run(const TrainConfig& config, const ModelConfig& model);

// Sums each partial gradient (Parameter::partial_grad) over the tensor group,
// and each replicated slice's (TensorSlice::replicas) over its holders.
void sum_partial_gradients(Collectives& tensor, Backend& backend, Allocator& host,
                           const std::vector<Parameter*>& trainable);

// The squared gradient norm of the whole model, the same on every rank of
// the group: each sliced gradient's squares summed over the group, each
// replicated one (alike on every rank) counted once.
double tensor_squared_grad_norm(Collectives& tensor, Backend& backend, const std::vector<Parameter*>& trainable);

// The whole tensors on the group's rank 0 (the others get theirs back):
// mine[i] is a slice slices[i] of its tensor (concatenated with the other
// ranks' along the slice's dim) or whole (rank 0's kept).
NamedTensors gather_tensor_shards(Collectives& tensor, Backend& backend, Allocator& host, NamedTensors mine,
                                  const std::vector<TensorSlice>& slices);

// What a checkpoint records: it resumes under as many tensor ranks only.
IdentityField tensor_identity(int64_t ranks);

}  // namespace ft
