// Sums of gradients held in GPU memory, and pipeline stages' tensor
// exchanges, over NCCL (collectives_nccl.cpp, built when the CUDA toolkit has
// NCCL), for MpiCollectives, which sets the communicator up by broadcasting
// rank 0's unique id over MPI.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/tensor.h"
#include "trainer/parallel/collectives.h"

namespace ft {

class DeviceCollectives {
 public:
  virtual ~DeviceCollectives() = default;
  // Replaces each f32 device tensor by its sum (max: its element-wise
  // maximum) over all ranks. One not done after timeout_s (0: never) is an
  // Error naming who_am_i.
  virtual void reduce_in_place(const std::vector<Tensor*>& tensors, bool max, int64_t timeout_s,
                               const std::string& who_am_i) = 0;
  // Collectives::exchange for device tensors: every send and receive in one
  // NCCL group, waited for with the same timeout.
  virtual void exchange(const std::vector<Collectives::Transfer>& sends,
                        const std::vector<Collectives::Transfer>& receives, int64_t timeout_s,
                        const std::string& who_am_i) = 0;
  // Collectives::broadcast for device tensors, in one NCCL group.
  virtual void broadcast(const std::vector<Tensor*>& tensors, int root, int64_t timeout_s,
                         const std::string& who_am_i) = 0;
};

size_t nccl_unique_id_bytes();
std::vector<char> nccl_unique_id();  // on rank 0
std::unique_ptr<DeviceCollectives> make_nccl_collectives(const std::vector<char>& unique_id, int rank, int world_size);

}  // namespace ft
