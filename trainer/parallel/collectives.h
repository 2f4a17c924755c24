// How the ranks of a training job talk to each other: who this process is,
// sums over all ranks (adapter gradients, the loss, a stop request), tensors
// sent from one rank to another (pipeline stages), groups of ranks and ending
// the whole job. `./finetune` alone is a world of one whose sums are the value
// itself; under `mpirun -np N` (or `srun --mpi=pmix`) the build with MPI runs
// N ranks over MPI (collectives_mpi.cpp), and gradients held in GPU memory go
// over NCCL where the build has it (collectives_nccl.cpp), else through host
// memory and MPI.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"

namespace ft {

class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // The rank among those on this node: which of the node's devices is this rank's.
  virtual int local_rank() const = 0;
  // Replaces each f32 tensor (on backend's device) by its sum over all ranks;
  // every rank gets the same values. host is for staging device tensors.
  virtual void sum_in_place(Backend& backend, Allocator& host, const std::vector<Tensor*>& tensors) = 0;
  // The same with the element-wise maximum (exact: every rank, any order,
  // the same values): a tensor-parallel INT8 layer's whole-row scales.
  virtual void max_in_place(Backend& backend, Allocator& host, const std::vector<Tensor*>& tensors) = 0;
  virtual double sum(double value) = 0;
  // The ranks that pass the same group, ranked by rank_in_group, as a world
  // of their own (MPI_Comm_split): one pipeline's stages, or the ranks that
  // hold the same stage. Every rank of this world calls it together.
  virtual std::unique_ptr<Collectives> split(int group, int rank_in_group) = 0;
  // Point to point: sends each tensor (host memory, or backend's device) to
  // its rank and fills each receiving tensor, whose shape and dtype both
  // ranks know, from its rank; returns when all have completed. Tensors
  // from one rank to another arrive in the order they were sent. A send
  // completes only once its receiver takes it (as NCCL's do), so ranks
  // exchanging with each other must pair their exchanges up: a pipeline
  // stage sends an operation's output together with receiving the next
  // operation's input (pipeline.cpp). host stages device tensors when the
  // build has no NCCL.
  struct Transfer {
    Tensor* tensor;
    int rank;
  };
  virtual void exchange(Backend& backend, Allocator& host, const std::vector<Transfer>& sends,
                        const std::vector<Transfer>& receives) = 0;
  // Every rank's tensors (alike in shape and dtype on every rank) get root's
  // values (ZeRO-1: each rank's share of the updated parameters).
  virtual void broadcast(Backend& backend, Allocator& host, const std::vector<Tensor*>& tensors, int root) = 0;
  // A sum that waits longer than this for another rank ends the job with a
  // message naming this rank (0: wait for ever).
  virtual void set_timeout_s(int64_t seconds) = 0;
  // Ends every rank of the job with this exit status (MPI_Abort); a single
  // process just exits.
  [[noreturn]] virtual void abort(int status) = 0;
};

// The world this process was started in: MPI when a launcher started it
// (mpirun, mpiexec, srun: its environment says so) and the build has MPI,
// else a single process. A launcher's world of several ranks with a build
// without MPI is an error: every rank would train the whole job alone.
std::unique_ptr<Collectives> join_world(int* argc, char*** argv);

// The local rank a launcher puts in the environment (Open MPI's mpirun,
// MPICH's hydra, Slurm's srun), readable before MPI starts; -1 when none does.
int launcher_local_rank();

// A world of one: what join_world gives a plain `./finetune`.
std::unique_ptr<Collectives> single_process_collectives();

// "rank 1 of 2" for messages; "" for a single process.
std::string rank_label(const Collectives& collectives);

// A double from one rank to another (exchange of its 8 bytes).
void send_double(Collectives& group, Backend& backend, Allocator& host, double value, int to);
double receive_double(Collectives& group, Backend& backend, Allocator& host, int from);

// root's value on every rank of group, as two sums of its 32-bit halves (a
// double carries each exactly; the other ranks add 0). Every rank calls it.
uint64_t broadcast_u64(Collectives& group, uint64_t value, int root);

// Every rank's named f32 host tensors on rank 0, in rank order (the others
// get theirs back): one adapter or training state written from the shares
// of pipeline stages or of a sharded optimizer state.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
NamedTensors gather_on_rank_zero(Collectives& group, Backend& backend, Allocator& host, NamedTensors mine);

}  // namespace ft
