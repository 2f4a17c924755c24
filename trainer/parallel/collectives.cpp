#include "trainer/parallel/collectives.h"

#include <cstdlib>
#include <cstring>
#include <sstream>
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
  void max_in_place(Backend&, Allocator&, const std::vector<Tensor*>&) override {}
  double sum(double value) override { return value; }
  std::unique_ptr<Collectives> split(int, int) override { return std::make_unique<SingleProcess>(); }
  void exchange(Backend&, Allocator&, const std::vector<Transfer>& sends,
                const std::vector<Transfer>& receives) override {
    FT_CHECK(sends.empty() && receives.empty(), "a single process has no other rank to exchange tensors with "
             "(start the job with mpirun -np N)");
  }
  void broadcast(Backend&, Allocator&, const std::vector<Tensor*>&, int) override {}
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

void send_double(Collectives& group, Backend& backend, Allocator& host, double value, int to) {
  Tensor bytes = Tensor::empty({int64_t(sizeof value)}, DType::u8, host, MemCategory::workspace);
  std::memcpy(bytes.data, &value, sizeof value);
  group.exchange(backend, host, {{&bytes, to}}, {});
}

double receive_double(Collectives& group, Backend& backend, Allocator& host, int from) {
  double value = 0.0;
  Tensor bytes = Tensor::empty({int64_t(sizeof value)}, DType::u8, host, MemCategory::workspace);
  group.exchange(backend, host, {}, {{&bytes, from}});
  std::memcpy(&value, bytes.data, sizeof value);
  return value;
}

uint64_t broadcast_u64(Collectives& group, uint64_t value, int root) {
  const bool own = group.rank() == root;
  const auto high = uint64_t(group.sum(own ? double(value >> 32) : 0.0));
  const auto low = uint64_t(group.sum(own ? double(value & 0xffffffffu) : 0.0));
  return high << 32 | low;
}

namespace {

// What a rank's tensors are, sent ahead of their bytes: one line per
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

NamedTensors gather_on_rank_zero(Collectives& group, Backend& backend, Allocator& host, NamedTensors mine) {
  if (group.rank() != 0) {
    const std::string description = describe_tensors(mine);
    send_double(group, backend, host, double(description.size()), 0);
    Tensor text = Tensor::empty({int64_t(description.size())}, DType::u8, host, MemCategory::workspace);
    std::memcpy(text.data, description.data(), description.size());
    std::vector<Collectives::Transfer> sends = {{&text, 0}};
    for (auto& [name, tensor] : mine) sends.push_back({&tensor, 0});
    group.exchange(backend, host, sends, {});
    return mine;
  }
  for (int from = 1; from < group.world_size(); ++from) {
    const auto length = int64_t(receive_double(group, backend, host, from));
    Tensor text = Tensor::empty({length}, DType::u8, host, MemCategory::workspace);
    group.exchange(backend, host, {}, {{&text, from}});
    NamedTensors theirs = empty_tensors(std::string(static_cast<const char*>(text.data), size_t(length)), host);
    std::vector<Collectives::Transfer> receives;
    for (auto& [name, tensor] : theirs) receives.push_back({&tensor, from});
    group.exchange(backend, host, {}, receives);
    mine.insert(mine.end(), theirs.begin(), theirs.end());
  }
  return mine;
}

}  // namespace ft
