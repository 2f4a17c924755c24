// The CUDA tests are built twice: against the emulator (tests/emu/, the
// emulated device is always there) and against the real runtime for
// `ctest -L gpu` (tests/gpu/). Built for a real GPU they still run where
// there is none: they say so and exit with kSkipReturnCode, which ctest's
// SKIP_RETURN_CODE reports as skipped rather than failed. Only a missing
// device skips: a CUDA runtime that fails (e.g. "CUDA driver version is
// insufficient for CUDA runtime version") fails the test, loudly.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kernels/cuda/cuda_device.h"

namespace cuda_test {

inline constexpr int kSkipReturnCode = 77;

// Call from a static initialiser that comes before anything touching CUDA.
inline bool exit_skipped_without_cuda_device() {
  std::string why;
  bool runtime_failed = false;
  if (ft::cuda_device_count(&why, &runtime_failed) > 0) return true;
  if (runtime_failed) {
    std::printf("FAILED: the CUDA runtime failed, which is not the same as having no GPU: %s\n", why.c_str());
    std::fflush(stdout);
    std::exit(1);
  }
  std::printf("skipped: no CUDA device found (%s)\n", why.c_str());
  std::fflush(stdout);
  std::exit(kSkipReturnCode);
}

}  // namespace cuda_test
