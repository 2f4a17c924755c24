#include "trainer/parallel/collectives_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "kernels/error.h"

namespace ft {
namespace {

void check_nccl(ncclResult_t result, const char* what) {
  FT_CHECK(result == ncclSuccess, "NCCL: ", what, " failed: ", ncclGetErrorString(result));
}

// On the legacy default stream, as the CUDA backend's kernels (cuda_backend.h):
// the sums follow the backward pass and precede the optimizer step; a stage's
// sends follow the kernels that made them and its receives precede the
// kernels that read them.
class NcclCollectives final : public DeviceCollectives {
 public:
  NcclCollectives(const ncclUniqueId& id, int rank, int world_size) {
    check_nccl(ncclCommInitRank(&comm_, world_size, id, rank), "ncclCommInitRank");
  }
  ~NcclCollectives() override {
    if (comm_) ncclCommDestroy(comm_);
  }

  void reduce_in_place(const std::vector<Tensor*>& tensors, bool max, int64_t timeout_s,
                       const std::string& who_am_i) override {
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (Tensor* tensor : tensors) {
      float* values = tensor->ptr<float>();
      check_nccl(ncclAllReduce(values, values, size_t(tensor->numel()), ncclFloat32, max ? ncclMax : ncclSum, comm_,
                               cudaStreamLegacy),
                 "ncclAllReduce");
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    wait(timeout_s, who_am_i, max ? "an all-reduce (max)" : "an all-reduce (sum)");
  }

  void exchange(const std::vector<Collectives::Transfer>& sends, const std::vector<Collectives::Transfer>& receives,
                int64_t timeout_s, const std::string& who_am_i) override {
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (const Collectives::Transfer& send : sends)
      check_nccl(ncclSend(send.tensor->data, send.tensor->size_bytes(), ncclUint8, send.rank, comm_, cudaStreamLegacy),
                 "ncclSend");
    for (const Collectives::Transfer& receive : receives)
      check_nccl(ncclRecv(receive.tensor->data, receive.tensor->size_bytes(), ncclUint8, receive.rank, comm_,
                          cudaStreamLegacy),
                 "ncclRecv");
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    wait(timeout_s, who_am_i, "an exchange of tensors between pipeline stages");
  }

  void broadcast(const std::vector<Tensor*>& tensors, int root, int64_t timeout_s,
                 const std::string& who_am_i) override {
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (Tensor* tensor : tensors)
      check_nccl(ncclBroadcast(tensor->data, tensor->data, tensor->size_bytes(), ncclUint8, root, comm_,
                               cudaStreamLegacy),
                 "ncclBroadcast");
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    wait(timeout_s, who_am_i, "a broadcast of the updated parameters");
  }

 private:
  // Polls rather than synchronises, so that a rank that never joins is a
  // timeout (the communicator is aborted) instead of a hang.
  void wait(int64_t timeout_s, const std::string& who_am_i, const char* what) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      const cudaError_t state = cudaStreamQuery(cudaStreamLegacy);
      if (state == cudaSuccess) return;
      FT_CHECK(state == cudaErrorNotReady, who_am_i, ": ", what, " failed: ", cudaGetErrorString(state));
      const double waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (timeout_s > 0 && waited_s > double(timeout_s)) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        fail(who_am_i, ": ", what, " (NCCL) waited ", timeout_s,
             " s for the other ranks (parallel.timeout_s)");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  ncclComm_t comm_ = nullptr;
};

}  // namespace

size_t nccl_unique_id_bytes() { return sizeof(ncclUniqueId); }

std::vector<char> nccl_unique_id() {
  ncclUniqueId id;
  check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  std::vector<char> bytes(sizeof id);
  std::memcpy(bytes.data(), &id, sizeof id);
  return bytes;
}

std::unique_ptr<DeviceCollectives> make_nccl_collectives(const std::vector<char>& unique_id, int rank,
                                                         int world_size) {
  FT_CHECK(unique_id.size() == sizeof(ncclUniqueId), "NCCL: unique id of ", unique_id.size(), " bytes, expected ",
           sizeof(ncclUniqueId));
  ncclUniqueId id;
  std::memcpy(&id, unique_id.data(), sizeof id);
  return std::make_unique<NcclCollectives>(id, rank, world_size);
}

}  // namespace ft
