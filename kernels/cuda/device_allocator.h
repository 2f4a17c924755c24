// Device memory for the CUDA backend, as ft::Allocator (Device::cuda):
//   DeviceAllocator  - one cudaMalloc per allocation, cudaFree on release. Tests
//                      use it directly: under the emulator every tensor is then
//                      its own guarded, NaN-poisoned allocation.
//   PinnedHostAllocator - page-locked host memory (cudaMallocHost), which
//                      the copy engine reads while the host goes on
//                      (Backend::copy_async's source); Device::cpu.
// and the CachingAllocator (kernels/caching_allocator.h) over DeviceAllocator
// keeps training steps from calling cudaMalloc (cudaMalloc/cudaFree
// synchronise the device and are slow). Its blocks are released and reused
// in stream order: the backend issues all work on one stream, so a block
// freed by the host is reused only by later work.
#pragma once
#include <cstddef>

#include "kernels/allocator.h"
#include "kernels/caching_allocator.h"

namespace ft {

// limit_bytes > 0 caps what it holds at once (a smaller card simulated on a
// larger one, FT_DEVICE_MEMORY_LIMIT): an allocation past it fails as
// cudaMalloc would on that card, with the limit named. Deallocations must
// pass the bytes allocated (as CachingAllocator does).
class DeviceAllocator final : public Allocator {
 public:
  explicit DeviceAllocator(size_t limit_bytes = 0) : limit_bytes_(limit_bytes) {}
  Device device() const override { return Device::cuda; }
  void* allocate(size_t bytes, MemCategory category) override;
  void deallocate(void* ptr, size_t bytes, MemCategory category) override;

 private:
  size_t limit_bytes_, held_bytes_ = 0;
};

class PinnedHostAllocator final : public Allocator {
 public:
  Device device() const override { return Device::cpu; }
  void* allocate(size_t bytes, MemCategory category) override;
  void deallocate(void* ptr, size_t bytes, MemCategory category) override;
};

}  // namespace ft
