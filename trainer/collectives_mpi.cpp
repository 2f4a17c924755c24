// The ranks of `mpirun -np N ./finetune` over MPI. Sums are non-blocking
// collectives polled with a short sleep: a waiting rank neither spins a core
// (ranks often share a node's cores with OpenMP threads) nor waits past the
// timeout. A rank that dies ends the job through the launcher (Open MPI's
// mpirun kills the remaining ranks when one exits abnormally); a rank that
// hangs is caught by the timeout of the others.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <iostream>
#include <thread>

#include "kernels/error.h"
#include "trainer/collectives.h"
#include "trainer/collectives_nccl.h"

namespace ft {
namespace {

class MpiCollectives final : public Collectives {
 public:
  MpiCollectives(int* argc, char*** argv) {
    int provided = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);  // only the main thread calls MPI
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local_rank_);
    MPI_Comm_free(&node);
  }
  ~MpiCollectives() override { MPI_Finalize(); }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  int local_rank() const override { return local_rank_; }
  void set_timeout_s(int64_t seconds) override { timeout_s_ = seconds; }

  double sum(double value) override {
    MPI_Request request;
    MPI_Iallreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &request);
    wait({request}, "a sum of the step's figures");
    return value;
  }

  void sum_in_place(Backend& backend, Allocator& host, const std::vector<Tensor*>& tensors) override {
    std::vector<Tensor*> device;
    std::vector<MPI_Request> requests;
    std::vector<std::pair<Tensor*, Tensor>> staged;  // device tensor, its host copy
    for (Tensor* tensor : tensors) {
      FT_CHECK(tensor->dtype == DType::f32, "all-reduce: ", dtype_name(tensor->dtype), " tensor, expected f32 gradients");
      if (tensor->device == Device::cpu) {
        start_sum(tensor->ptr<float>(), tensor->numel(), requests);
      } else if (use_nccl()) {
        device.push_back(tensor);
      } else {
        Tensor copy = Tensor::empty(tensor->shape, DType::f32, host, MemCategory::workspace);
        backend.copy(copy, *tensor);
        start_sum(copy.ptr<float>(), copy.numel(), requests);
        staged.emplace_back(tensor, copy);
      }
    }
    if (!device.empty()) nccl_->sum_in_place(device, timeout_s_, rank_label(*this));
    wait(requests, "the gradient all-reduce");
    for (auto& [tensor, copy] : staged) backend.copy(*tensor, copy);
  }

  [[noreturn]] void abort(int status) override {
    MPI_Abort(MPI_COMM_WORLD, status);
    std::exit(status);  // MPI_Abort does not return; this tells the compiler so
  }

 private:
  // Whether GPU tensors go over NCCL: set up at the first sum of GPU
  // gradients, which every rank reaches together (the trainer checks that
  // all ranks train on the same kind of device).
  bool use_nccl() {
#ifdef FT_HAVE_NCCL
    if (!nccl_) {
      std::vector<char> id = rank_ == 0 ? nccl_unique_id() : std::vector<char>(nccl_unique_id_bytes());
      MPI_Bcast(id.data(), int(id.size()), MPI_BYTE, 0, MPI_COMM_WORLD);
      nccl_ = make_nccl_sum(id, rank_, world_size_);
    }
#endif
    return nccl_ != nullptr;
  }

  // MPI counts are ints: a tensor past INT_MAX elements goes in several pieces.
  void start_sum(float* values, int64_t count, std::vector<MPI_Request>& requests) {
    for (int64_t first = 0; first < count; first += INT_MAX) {
      requests.emplace_back();
      MPI_Iallreduce(MPI_IN_PLACE, values + first, int(std::min<int64_t>(INT_MAX, count - first)), MPI_FLOAT, MPI_SUM,
                     MPI_COMM_WORLD, &requests.back());
    }
  }

  void wait(std::vector<MPI_Request> requests, const char* what) {
    const auto start = std::chrono::steady_clock::now();
    auto pause = std::chrono::microseconds(1);
    for (;;) {
      int done = 0;
      MPI_Testall(int(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE);
      if (done) return;
      const double waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (timeout_s_ > 0 && waited_s > double(timeout_s_)) {
        std::cerr << "error (" << rank_label(*this) << "): " << what << " waited " << timeout_s_
                  << " s for the other ranks (parallel.timeout_s); ending the job\n";
        abort(1);
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

  int rank_ = 0, world_size_ = 1, local_rank_ = 0;
  int64_t timeout_s_ = 0;
  std::unique_ptr<DeviceSum> nccl_;
};

}  // namespace

std::unique_ptr<Collectives> make_mpi_collectives(int* argc, char*** argv) {
  return std::make_unique<MpiCollectives>(argc, argv);
}

}  // namespace ft
