#include "kernels/caching_allocator.h"

#include "kernels/cuda/scratch.h"
#include "kernels/error.h"

namespace ft {

CachingAllocator::~CachingAllocator() {
  std::lock_guard lock(mutex_);
  try {
    release_cached_locked();
  } catch (const Error&) {
    // A destructor must not throw; at shutdown a failed cudaFree loses nothing.
  }
}

void* CachingAllocator::take_cached(size_t& size) {
  auto it = free_blocks_.find(size);
  if (it != free_blocks_.end() && !it->second.empty()) {
    void* block = it->second.back();
    it->second.pop_back();
    return block;
  }
  if (!reuse_larger_) return nullptr;
  for (it = free_blocks_.upper_bound(size); it != free_blocks_.end() && it->first <= 2 * size; ++it) {
    if (it->second.empty()) continue;
    void* block = it->second.back();
    it->second.pop_back();
    larger_blocks_[block] = it->first;
    size = it->first;
    return block;
  }
  return nullptr;
}

void* CachingAllocator::allocate(size_t bytes, MemCategory category) {
  if (bytes == 0) return nullptr;
  size_t size = cuda::caching_block_bytes(bytes, category);
  std::lock_guard lock(mutex_);
  void* block = cuda::caching_caches(category) ? take_cached(size) : nullptr;
  if (!block) {
    try {
      block = backing_.allocate(size, category);
    } catch (const Error&) {
      // Out of memory: cached blocks of other sizes may be what is missing.
      release_cached_locked();
      block = backing_.allocate(size, category);
    }
    stats_.allocation_count += 1;
    stats_.reserved_bytes += size;
  }
  stats_.current_bytes += size;
  if (stats_.current_bytes > stats_.peak_bytes) stats_.peak_bytes = stats_.current_bytes;
  return block;
}

void CachingAllocator::deallocate(void* ptr, size_t bytes, MemCategory category) {
  if (!ptr) return;
  size_t size = cuda::caching_block_bytes(bytes, category);
  std::lock_guard lock(mutex_);
  if (const auto larger = larger_blocks_.find(ptr); larger != larger_blocks_.end()) {
    size = larger->second;
    larger_blocks_.erase(larger);
  }
  stats_.current_bytes -= size;
  if (cuda::caching_caches(category)) {
    free_blocks_[size].push_back(ptr);
    return;
  }
  backing_.deallocate(ptr, size, category);
  stats_.reserved_bytes -= size;
}

void CachingAllocator::reset_peak() {
  std::lock_guard lock(mutex_);
  stats_.peak_bytes = stats_.current_bytes;
}

void CachingAllocator::release_cached() {
  std::lock_guard lock(mutex_);
  release_cached_locked();
}

void CachingAllocator::release_cached_locked() {
  for (auto& [size, blocks] : free_blocks_) {
    for (void* block : blocks) backing_.deallocate(block, size, MemCategory::workspace);
    stats_.reserved_bytes -= size * blocks.size();
    blocks.clear();
  }
}

CachingStats CachingAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace ft
