#include "trainer/collectives.h"

#include <cstdlib>
#include <string>

#include "kernels/error.h"

namespace ft {

#ifdef FT_HAVE_MPI
std::unique_ptr<Collectives> make_mpi_collectives(int* argc, char*** argv);  // collectives_mpi.cpp
#endif

namespace {

class SingleProcess final : public Collectives {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  int local_rank() const override { return 0; }
  void sum_in_place(Backend&, Allocator&, const std::vector<Tensor*>&) override {}
  double sum(double value) override { return value; }
  std::unique_ptr<Collectives> split(int, int) override { return std::make_unique<SingleProcess>(); }
  void exchange(Backend&, Allocator&, const std::vector<Transfer>& sends,
                const std::vector<Transfer>& receives) override {
    FT_CHECK(sends.empty() && receives.empty(), "a single process has no other rank to exchange tensors with "
             "(start the job with mpirun -np N)");
  }
  void set_timeout_s(int64_t) override {}
  [[noreturn]] void abort(int status) override { std::exit(status); }

};

// Launchers announce themselves in the environment: Open MPI's mpirun,
// PMI-1/2 (MPICH's hydra, srun --mpi=pmi2) and PMIx (srun --mpi=pmix,
// prterun). A plain `./finetune` is not initialised as an MPI singleton.
bool started_by_launcher() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

}  // namespace

std::unique_ptr<Collectives> join_world(int* argc, char*** argv) {
#ifdef FT_HAVE_MPI
  if (started_by_launcher()) return make_mpi_collectives(argc, argv);
#else
  (void)argc;
  (void)argv;
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE") ? std::getenv("OMPI_COMM_WORLD_SIZE") : std::getenv("PMI_SIZE");
  FT_CHECK(!started_by_launcher() || (size && std::string(size) == "1"), "started by an MPI launcher (",
           size ? size : "several", " ranks), but this finetune was built without MPI: install libopenmpi-dev "
           "(scripts/deps) and rebuild, or run a single process");
#endif
  return single_process_collectives();
}

int launcher_local_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* value = std::getenv(name)) return std::atoi(value);
  return -1;
}

std::unique_ptr<Collectives> single_process_collectives() { return std::make_unique<SingleProcess>(); }

std::string rank_label(const Collectives& collectives) {
  if (collectives.world_size() == 1) return "";
  return "rank " + std::to_string(collectives.rank()) + " of " + std::to_string(collectives.world_size());
}

}  // namespace ft
