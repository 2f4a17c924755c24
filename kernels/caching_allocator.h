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
#include <map>
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
  // backing must outlive this one. reuse_larger (the CPU's): a request with
  // no cached block of its size class takes the smallest cached block of a
  // larger class up to twice its size, so steps of different lengths (a
  // batch trimmed after its last loss token, packed rows) share one set of
  // blocks instead of each length keeping its own: a 1 x 1,024 run's RSS
  // went from 883 to 1,202 MiB when an 837-token step met the cache. The GPU
  // keeps exact classes, which the memory planner models (CachingModelAllocator).
  explicit CachingAllocator(Allocator& backing, bool reuse_larger = false)
      : backing_(backing), reuse_larger_(reuse_larger) {}
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

  // A cached block of class `size` for a request of that class, or with
  // reuse_larger_ of a larger one (recorded in larger_blocks_, and size set
  // to its class); null if none.
  void* take_cached(size_t& size);

  Allocator& backing_;
  bool reuse_larger_;
  mutable std::mutex mutex_;
  std::map<size_t, std::vector<void*>> free_blocks_;  // by size class
  std::unordered_map<void*, size_t> larger_blocks_;    // handed out for a smaller class: their own class
  CachingStats stats_;
};

}  // namespace ft
