// Allocators. Every tensor's bytes come from an Allocator and are charged to a
// named category, so memory claims can be checked byte for byte:
//   HostAllocator     - 64-byte aligned host memory (the CPU backend).
//   MetaAllocator     - hands out no memory at all: tensors without data, used
//                       by the memory planner to replay a training step.
//   TrackingAllocator - wraps another allocator and keeps current and peak
//                       bytes per category and in total.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace ft {

enum class Device : uint8_t { cpu, cuda, meta };

enum class MemCategory : uint8_t { weights, adapters, gradients, optimizer, activations, workspace };
constexpr int kMemCategoryCount = 6;
const char* mem_category_name(MemCategory category);

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;
  virtual void* allocate(size_t bytes, MemCategory category) = 0;
  virtual void deallocate(void* ptr, size_t bytes, MemCategory category) = 0;
};

class HostAllocator final : public Allocator {
 public:
  Device device() const override { return Device::cpu; }
  void* allocate(size_t bytes, MemCategory category) override;
  void deallocate(void* ptr, size_t bytes, MemCategory category) override;
};

class MetaAllocator final : public Allocator {
 public:
  Device device() const override { return Device::meta; }
  void* allocate(size_t, MemCategory) override { return nullptr; }
  void deallocate(void*, size_t, MemCategory) override {}
};

struct MemoryStats {
  std::array<size_t, kMemCategoryCount> current_bytes{};
  std::array<size_t, kMemCategoryCount> peak_bytes{};
  size_t total_current_bytes = 0;
  size_t total_peak_bytes = 0;
  size_t allocation_count = 0;

  size_t current(MemCategory c) const { return current_bytes[size_t(c)]; }
  size_t peak(MemCategory c) const { return peak_bytes[size_t(c)]; }
};

class TrackingAllocator final : public Allocator {
 public:
  explicit TrackingAllocator(Allocator& backing) : backing_(backing) {}
  Device device() const override { return backing_.device(); }
  void* allocate(size_t bytes, MemCategory category) override;
  void deallocate(void* ptr, size_t bytes, MemCategory category) override;

  MemoryStats stats() const;
  // Starts a new peak window: peaks are set to the current values.
  void reset_peaks();

 private:
  Allocator& backing_;
  mutable std::mutex mutex_;
  MemoryStats stats_;
};

}  // namespace ft
