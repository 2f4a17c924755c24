// Sums of gradients held in GPU memory over NCCL (collectives_nccl.cpp, built
// when the CUDA toolkit has NCCL), for MpiCollectives, which sets the
// communicator up by broadcasting rank 0's unique id over MPI.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/tensor.h"

namespace ft {

class DeviceSum {
 public:
  virtual ~DeviceSum() = default;
  // Replaces each f32 device tensor by its sum over all ranks. A sum not done
  // after timeout_s (0: never) is an Error naming who_am_i.
  virtual void sum_in_place(const std::vector<Tensor*>& tensors, int64_t timeout_s, const std::string& who_am_i) = 0;
};

size_t nccl_unique_id_bytes();
std::vector<char> nccl_unique_id();  // on rank 0
std::unique_ptr<DeviceSum> make_nccl_sum(const std::vector<char>& unique_id, int rank, int world_size);

}  // namespace ft
