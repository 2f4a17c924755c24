// kernels/cuda/cuda_device.h for the CUDA builds (nvcc and the emulator).
#include "kernels/cuda/cuda_device.h"

#include <dlfcn.h>

#include <cstdio>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_allocator.h"

namespace ft {
namespace {

// CachingAllocator keeps a reference to its backing allocator; this keeps the
// backing allocator alive beside it.
class OwningCachingAllocator final : public Allocator {
 public:
  explicit OwningCachingAllocator(size_t limit_bytes) : device_(limit_bytes) {}
  Device device() const override { return caching_.device(); }
  void* allocate(size_t bytes, MemCategory category) override { return caching_.allocate(bytes, category); }
  void deallocate(void* ptr, size_t bytes, MemCategory category) override {
    caching_.deallocate(ptr, bytes, category);
  }

 private:
  DeviceAllocator device_;
  CachingAllocator caching_{device_};
};

// Whether an NVIDIA driver is installed at all. Without one the runtime
// answers "CUDA driver version is insufficient for CUDA runtime version",
// which then only means "no GPU here"; with one it is a real failure (a
// driver older than the toolkit).
bool driver_installed() {
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (driver) dlclose(driver);
  return driver != nullptr;
}

}  // namespace

int cuda_device_count(std::string* why, bool* runtime_failed) {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  const bool no_driver = status == cudaErrorInsufficientDriver && !driver_installed();
  if (runtime_failed) *runtime_failed = status != cudaSuccess && status != cudaErrorNoDevice && !no_driver;
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the error so later calls are not blamed
    *why = no_driver ? std::string("no NVIDIA driver installed (libcuda.so.1 not found)")
                     : std::string("cudaGetDeviceCount: ") + cudaGetErrorString(status);
    return 0;
  }
  if (count == 0) *why = "the CUDA runtime reports 0 devices";
  return count;
}

std::string cuda_device_description() {
#if defined(__CUDACC__)
  cudaDeviceProp properties;
  FT_CUDA_CHECK(cudaGetDeviceProperties(&properties, 0));
  const double memory_gib = double(properties.totalGlobalMem) / double(size_t(1) << 30);
  char text[320];
  std::snprintf(text, sizeof text, "%s, %.1f GiB, sm_%d%d", properties.name, memory_gib, properties.major,
                properties.minor);
  return text;
#else
  return "the CUDA emulator (kernels/emu/)";
#endif
}

size_t cuda_device_bytes_in_use() {
#if defined(__CUDACC__)
  size_t free_bytes = 0, total_bytes = 0;
  FT_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return total_bytes - free_bytes;
#else
  return 0;  // the emulator's device has no context
#endif
}

std::unique_ptr<Allocator> make_cuda_caching_allocator(size_t limit_bytes) {
  return std::make_unique<OwningCachingAllocator>(limit_bytes);
}

std::unique_ptr<Backend> make_cuda_backend(Allocator& allocator) { return std::make_unique<CudaBackend>(allocator); }

}  // namespace ft
