// CachingAllocator: keeps released activation and workspace blocks on free
// lists keyed by size class and hands them out again, so a training step
// that repeats the previous step's allocations allocates nothing from its
// backing allocator. On the GPU that spares cudaMalloc/cudaFree, which
// synchronise the device (kernels/cuda/device_allocator.h); on the CPU it
// keeps the step's transient tensors out of malloc, whose adaptive mmap
// threshold otherwise fragments the heap and grows RSS over a run's first
// steps (docs/performance.md). Long-lived tensors (weights, adapters,
// gradients, optimizer state) are allocated once, so they go straight to
// the backing allocator at their own size: rounding a 108 MiB weight up to
// a size class would waste 4 MiB per layer for nothing. Its rounding
// (cuda::caching_block_bytes) is in kernels/cuda/scratch.h, plain C++ shared
// with the memory planner's model of it.
// Blocks change hands between categories, so per-category accounting belongs
// above this allocator (a TrackingAllocator wrapping it), not below.
#pragma once
#include <cstddef>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "kernels/allocator.h"

namespace ft {

struct CachingStats {
  size_t allocation_count = 0;  // allocations from the backing allocator (cudaMalloc, malloc)
  size_t current_bytes = 0;     // handed out now, in rounded block sizes
  size_t peak_bytes = 0;        // the maximum of current_bytes
  size_t reserved_bytes = 0;    // held from the backing allocator: handed out + cached
};

class CachingAllocator final : public Allocator {
 public:
  // backing must outlive this one.
  explicit CachingAllocator(Allocator& backing) : backing_(backing) {}
  ~CachingAllocator() override;
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  Device device() const override { return backing_.device(); }
  void* allocate(size_t bytes, MemCategory category) override;
  void deallocate(void* ptr, size_t bytes, MemCategory category) override;

  // Starts peak_bytes again from current_bytes (to measure one training step).
  void reset_peak();
  // Returns every cached (free) block to the backing allocator.
  void release_cached();
  CachingStats stats() const;

 private:
  void release_cached_locked();

  Allocator& backing_;
  mutable std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_blocks_;  // by size class
  CachingStats stats_;
};

}  // namespace ft
