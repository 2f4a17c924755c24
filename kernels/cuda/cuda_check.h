// Status checks for every CUDA runtime and cuBLASLt call: a failure throws
// ft::Error naming the call and its file:line, so a bad launch or an
// out-of-memory is reported where it happened, not at the next sync.
#pragma once
#include "kernels/error.h"
#include "kernels/launch.h"

namespace ft {

inline void cuda_check(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess)
    fail("CUDA error: ", call, " failed: ", cudaGetErrorString(status), " (", file, ":", line, ")");
}

}  // namespace ft

#define FT_CUDA_CHECK(call) ::ft::cuda_check((call), #call, __FILE__, __LINE__)
// After ft::launch: launch errors (bad configuration, too much shared memory)
// surface through cudaGetLastError.
#define FT_CUDA_CHECK_LAUNCH() ::ft::cuda_check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
