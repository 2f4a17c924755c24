// kernels/cuda/cuda_device.h for builds without nvcc: there is never a device.
#include "kernels/cuda/cuda_device.h"

#include "kernels/error.h"

namespace ft {

namespace {
const char* kWhy = "this build has no CUDA backend (nvcc was not found when it was configured)";
}

int cuda_device_count(std::string* why, bool* runtime_failed) {
  *why = kWhy;
  if (runtime_failed) *runtime_failed = false;
  return 0;
}

std::string cuda_device_description() { return kWhy; }

size_t cuda_device_bytes_in_use() { fail(kWhy); }

std::unique_ptr<Allocator> make_cuda_caching_allocator(size_t) { fail(kWhy); }

std::unique_ptr<Backend> make_cuda_backend(Allocator&) { fail(kWhy); }

}  // namespace ft
