#include "kernels/allocator.h"

#include <cstdlib>
#include <new>

#include "kernels/error.h"

namespace ft {

const char* mem_category_name(MemCategory category) {
  switch (category) {
    case MemCategory::weights: return "weights";
    case MemCategory::adapters: return "adapters";
    case MemCategory::gradients: return "gradients";
    case MemCategory::optimizer: return "optimizer";
    case MemCategory::activations: return "activations";
    case MemCategory::workspace: return "workspace";
  }
  return "?";
}

void* HostAllocator::allocate(size_t bytes, MemCategory category) {
  if (bytes == 0) return nullptr;
  size_t rounded_bytes = (bytes + 63) / 64 * 64;
  void* ptr = std::aligned_alloc(64, rounded_bytes);
  FT_CHECK(ptr, "out of host memory allocating ", bytes, " bytes for ", mem_category_name(category));
  return ptr;
}

void HostAllocator::deallocate(void* ptr, size_t, MemCategory) { std::free(ptr); }

void* TrackingAllocator::allocate(size_t bytes, MemCategory category) {
  void* ptr = backing_.allocate(bytes, category);
  std::lock_guard lock(mutex_);
  size_t index = size_t(category);
  stats_.current_bytes[index] += bytes;
  stats_.total_current_bytes += bytes;
  stats_.allocation_count += 1;
  if (stats_.current_bytes[index] > stats_.peak_bytes[index]) stats_.peak_bytes[index] = stats_.current_bytes[index];
  if (stats_.total_current_bytes > stats_.total_peak_bytes) stats_.total_peak_bytes = stats_.total_current_bytes;
  return ptr;
}

void TrackingAllocator::deallocate(void* ptr, size_t bytes, MemCategory category) {
  backing_.deallocate(ptr, bytes, category);
  std::lock_guard lock(mutex_);
  stats_.current_bytes[size_t(category)] -= bytes;
  stats_.total_current_bytes -= bytes;
}

MemoryStats TrackingAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void TrackingAllocator::reset_peaks() {
  std::lock_guard lock(mutex_);
  stats_.peak_bytes = stats_.current_bytes;
  stats_.total_peak_bytes = stats_.total_current_bytes;
}

}  // namespace ft
