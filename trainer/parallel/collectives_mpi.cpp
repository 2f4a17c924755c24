// The ranks of `mpirun -np N ./finetune` over MPI. Sums are non-blocking
// collectives polled with a short sleep: a waiting rank neither spins a core
// (ranks often share a node's cores with OpenMP threads) nor waits past the
// timeout. A rank that dies ends the job through the launcher (Open MPI's
// mpirun kills the remaining ranks when one exits abnormally); a rank that
// hangs is caught by the timeout of the others. Tensors between pipeline
// stages go as bytes (device tensors through host memory).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "kernels/error.h"
#include "trainer/parallel/collectives.h"
#include "trainer/parallel/collectives_nccl.h"

namespace ft {
namespace {

class MpiCollectives final : public Collectives {
 public:
  MpiCollectives(int* argc, char*** argv) {
    int provided = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);  // only the main thread calls MPI
    owns_mpi_ = true;
    join(MPI_COMM_WORLD);
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local_rank_);
    MPI_Comm_free(&node);
  }
  // A group split from a world: messages name the rank in the whole job.
  MpiCollectives(MPI_Comm comm, int local_rank, std::string who_am_i, int64_t timeout_s)
      : local_rank_(local_rank), timeout_s_(timeout_s) {
    join(comm);
    who_am_i_ = std::move(who_am_i);
  }
  ~MpiCollectives() override {
    if (!owns_mpi_) {
      nccl_.reset();
      MPI_Comm_free(&comm_);
      return;
    }
    MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  int local_rank() const override { return local_rank_; }
  void set_timeout_s(int64_t seconds) override { timeout_s_ = seconds; }

  double sum(double value) override {
    MPI_Request request;
    MPI_Iallreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_SUM, comm_, &request);
    wait({request}, "a sum of the step's figures");
    return value;
  }

  void sum_in_place(Backend& backend, Allocator& host, const std::vector<Tensor*>& tensors) override {
    reduce_in_place(backend, host, tensors, false);
  }

  void max_in_place(Backend& backend, Allocator& host, const std::vector<Tensor*>& tensors) override {
    reduce_in_place(backend, host, tensors, true);
  }

  std::unique_ptr<Collectives> split(int group, int rank_in_group) override {
    MPI_Comm comm;
    MPI_Comm_split(comm_, group, rank_in_group, &comm);
    return std::make_unique<MpiCollectives>(comm, local_rank_, who_am_i_, timeout_s_);
  }

  // Host tensors over MPI, device tensors over NCCL where the build has it
  // (else through host copies and MPI). Sends are synchronous (MPI_Issend:
  // complete once received), as NCCL's are, so the CPU runs check the
  // pairing a GPU run relies on.
  void exchange(Backend& backend, Allocator& host, const std::vector<Transfer>& sends,
                const std::vector<Transfer>& receives) override {
    std::vector<Transfer> device_sends, device_receives;
    std::vector<MPI_Request> requests;
    std::vector<Tensor> sent;                                 // what the requests read: held until they complete
    std::vector<std::pair<Tensor*, Tensor>> landed;           // a device tensor, its host landing
    for (const Transfer& send : sends) {
      if (send.tensor->device != Device::cpu && use_nccl()) {
        device_sends.push_back(send);
        continue;
      }
      sent.push_back(on_host(backend, host, *send.tensor));
      start_transfer(sent.back(), send.rank, true, requests);
    }
    for (const Transfer& receive : receives) {
      Tensor& tensor = *receive.tensor;
      if (tensor.device != Device::cpu && use_nccl()) {
        device_receives.push_back(receive);
        continue;
      }
      if (tensor.device != Device::cpu)
        landed.emplace_back(&tensor, Tensor::empty(tensor.shape, tensor.dtype, host, MemCategory::workspace));
      start_transfer(tensor.device == Device::cpu ? tensor : landed.back().second, receive.rank, false, requests);
    }
    if (!device_sends.empty() || !device_receives.empty())
      nccl_->exchange(device_sends, device_receives, timeout_s_, who_am_i_);
    wait(requests, "an exchange of tensors between pipeline stages");
    for (auto& [tensor, landing] : landed) backend.copy(*tensor, landing);
  }

  void broadcast(Backend& backend, Allocator& host, const std::vector<Tensor*>& tensors, int root) override {
    std::vector<Tensor*> device;
    std::vector<MPI_Request> requests;
    std::vector<std::pair<Tensor*, Tensor>> staged;  // a device tensor, its host copy
    for (Tensor* tensor : tensors) {
      if (tensor->device == Device::cpu) {
        start_broadcast(*tensor, root, requests);
      } else if (use_nccl()) {
        device.push_back(tensor);
      } else {
        staged.emplace_back(tensor, on_host(backend, host, *tensor));
        start_broadcast(staged.back().second, root, requests);
      }
    }
    if (!device.empty()) nccl_->broadcast(device, root, timeout_s_, who_am_i_);
    wait(requests, "a broadcast of the updated parameters");
    if (rank_ != root)
      for (auto& [tensor, copy] : staged) backend.copy(*tensor, copy);
  }

  [[noreturn]] void abort(int status) override {
    MPI_Abort(MPI_COMM_WORLD, status);  // the whole job, also from a group
    std::exit(status);  // MPI_Abort does not return; this tells the compiler so
  }

 private:
  // Whether GPU tensors go over NCCL: set up at the first sum of GPU
  // gradients, which every rank reaches together (the trainer checks that
  // all ranks train on the same kind of device), or at a pipeline stage's
  // first exchange, which carries activations on every stage before any
  // other collective of the stages.
  bool use_nccl() {
#ifdef FT_HAVE_NCCL
    if (!nccl_) {
      std::vector<char> id = rank_ == 0 ? nccl_unique_id() : std::vector<char>(nccl_unique_id_bytes());
      MPI_Bcast(id.data(), int(id.size()), MPI_BYTE, 0, comm_);
      nccl_ = make_nccl_collectives(id, rank_, world_size_);
    }
#endif
    return nccl_ != nullptr;
  }

  // Host tensors over MPI, device tensors over NCCL where the build has it
  // (else through host copies and MPI); max: the element-wise maximum.
  void reduce_in_place(Backend& backend, Allocator& host, const std::vector<Tensor*>& tensors, bool max) {
    std::vector<Tensor*> device;
    std::vector<MPI_Request> requests;
    std::vector<std::pair<Tensor*, Tensor>> staged;  // device tensor, its host copy
    for (Tensor* tensor : tensors) {
      FT_CHECK(tensor->dtype == DType::f32, "all-reduce: ", dtype_name(tensor->dtype), " tensor, expected f32");
      if (tensor->device == Device::cpu) {
        start_reduce(tensor->ptr<float>(), tensor->numel(), max, requests);
      } else if (use_nccl()) {
        device.push_back(tensor);
      } else {
        Tensor copy = Tensor::empty(tensor->shape, DType::f32, host, MemCategory::workspace);
        backend.copy(copy, *tensor);
        start_reduce(copy.ptr<float>(), copy.numel(), max, requests);
        staged.emplace_back(tensor, copy);
      }
    }
    if (!device.empty()) nccl_->reduce_in_place(device, max, timeout_s_, who_am_i_);
    wait(requests, max ? "an all-reduce (max)" : "an all-reduce (sum)");
    for (auto& [tensor, copy] : staged) backend.copy(*tensor, copy);
  }

  // MPI counts are ints: a tensor past INT_MAX elements goes in several pieces.
  void start_reduce(float* values, int64_t count, bool max, std::vector<MPI_Request>& requests) {
    for (int64_t first = 0; first < count; first += INT_MAX) {
      requests.emplace_back();
      MPI_Iallreduce(MPI_IN_PLACE, values + first, int(std::min<int64_t>(INT_MAX, count - first)), MPI_FLOAT,
                     max ? MPI_MAX : MPI_SUM, comm_, &requests.back());
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
        std::cerr << "error (" + who_am_i_ + "): " + std::string(what) + " waited " + std::to_string(timeout_s_) +
                         " s for the other ranks (parallel.timeout_s); ending the job\n";
        abort(1);
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

  void join(MPI_Comm comm) {
    comm_ = comm;
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &world_size_);
    who_am_i_ = rank_label(*this);
  }

  // A send's bytes are in host memory: the tensor itself, or a copy of a
  // device tensor, which the send then holds.
  static Tensor on_host(Backend& backend, Allocator& host, const Tensor& tensor) {
    if (tensor.device == Device::cpu) return tensor;
    Tensor copy = Tensor::empty(tensor.shape, tensor.dtype, host, MemCategory::workspace);
    backend.copy(copy, tensor);
    return copy;
  }

  // MPI counts are ints: a message past INT_MAX bytes goes in several pieces.
  template <class Piece>
  static void for_each_piece(const Tensor& tensor, const Piece& piece) {
    char* bytes = static_cast<char*>(tensor.data);
    for (size_t first = 0; first < tensor.size_bytes(); first += size_t(INT_MAX))
      piece(bytes + first, int(std::min<size_t>(size_t(INT_MAX), tensor.size_bytes() - first)));
  }

  void start_transfer(const Tensor& tensor, int rank, bool send, std::vector<MPI_Request>& requests) {
    for_each_piece(tensor, [&](char* bytes, int count) {
      requests.emplace_back();
      if (send) MPI_Issend(bytes, count, MPI_BYTE, rank, 0, comm_, &requests.back());
      else MPI_Irecv(bytes, count, MPI_BYTE, rank, 0, comm_, &requests.back());
    });
  }

  void start_broadcast(const Tensor& tensor, int root, std::vector<MPI_Request>& requests) {
    for_each_piece(tensor, [&](char* bytes, int count) {
      requests.emplace_back();
      MPI_Ibcast(bytes, count, MPI_BYTE, root, comm_, &requests.back());
    });
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owns_mpi_ = false;  // the world: MPI_Finalize at the end; a group frees its communicator
  int rank_ = 0, world_size_ = 1, local_rank_ = 0;
  int64_t timeout_s_ = 0;
  std::string who_am_i_;  // "rank 1 of 4" in the whole job, for messages
  std::unique_ptr<DeviceCollectives> nccl_;
};

}  // namespace

std::unique_ptr<Collectives> make_mpi_collectives(int* argc, char*** argv) {
  return std::make_unique<MpiCollectives>(argc, argv);
}

}  // namespace ft
