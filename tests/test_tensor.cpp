// Tensors, the tracking allocator and the CPU backend's caching allocator.
#include <doctest/doctest.h>

#include <sstream>

#include "kernels/error.h"
#include "kernels/tensor.h"
#include "trainer/device_backend.h"

using namespace ft;

TEST_CASE("tracking allocator counts current and peak bytes per category") {
  HostAllocator host;
  TrackingAllocator tracker(host);
  {
    Tensor weights = Tensor::empty({3, 5}, DType::bf16, tracker, MemCategory::weights);
    Tensor scratch = Tensor::empty({7}, DType::f32, tracker, MemCategory::activations);
    CHECK(tracker.stats().current(MemCategory::weights) == 30);
    CHECK(tracker.stats().current(MemCategory::activations) == 28);
    CHECK(tracker.stats().total_current_bytes == 58);
  }
  MemoryStats stats = tracker.stats();
  CHECK(stats.total_current_bytes == 0);
  CHECK(stats.peak(MemCategory::weights) == 30);
  CHECK(stats.total_peak_bytes == 58);
  tracker.reset_peaks();
  CHECK(tracker.stats().total_peak_bytes == 0);
}

// Host memory that counts the blocks it hands out.
class CountingHost final : public Allocator {
 public:
  Device device() const override { return Device::cpu; }
  void* allocate(size_t bytes, MemCategory category) override {
    allocations += 1;
    return host_.allocate(bytes, category);
  }
  void deallocate(void* ptr, size_t bytes, MemCategory category) override { host_.deallocate(ptr, bytes, category); }
  size_t allocations = 0;

 private:
  HostAllocator host_;
};

// Without the cache every step's tensors went back to malloc, whose adaptive
// mmap threshold fragmented the heap: RSS grew over a run's first steps.
TEST_CASE("the CPU device backend reuses a step's transient tensors: a repeated step takes no new host memory") {
  CountingHost host;
  std::ostringstream log;
  DeviceBackend device = make_device_backend(DeviceChoice::cpu, "test.yaml", host, log);
  Backend& be = *device.backend;
  auto step = [&] {  // activations and workspace under, around and over 1 MiB, freed out of order
    Tensor small = be.empty({1000}, DType::f32, MemCategory::activations);
    Tensor middle = be.empty({300, 1000}, DType::bf16, MemCategory::activations);
    Tensor large = be.empty({3, 1 << 20}, DType::f32, MemCategory::workspace);
    middle = Tensor{};
    Tensor again = be.empty({300, 1000}, DType::bf16, MemCategory::activations);
  };
  step();
  const size_t first_step = host.allocations;
  CHECK(first_step == 3);
  for (int i = 0; i < 3; ++i) step();
  CHECK(host.allocations == first_step);
  // The tracker above the cache counts the bytes asked for, as the planner does.
  CHECK(device.tracker->stats().total_peak_bytes == 4000 + 600000 + (size_t(12) << 20));
}

// A step of another length (a batch trimmed after its last loss token)
// takes the cached blocks of a longer one rather than blocks of its own: an
// 837-token step after 1,024-token ones had cost a 1 x 1,024 run 318 MiB of RSS.
TEST_CASE("the CPU device backend serves a shorter step from a longer step's cached blocks, up to twice the size") {
  CountingHost host;
  std::ostringstream log;
  DeviceBackend device = make_device_backend(DeviceChoice::cpu, "test.yaml", host, log);
  Backend& be = *device.backend;
  auto step = [&](int64_t tokens) {
    Tensor hidden = be.empty({tokens, 768}, DType::f32, MemCategory::activations);
    Tensor mlp = be.empty({tokens, 2048}, DType::f32, MemCategory::activations);
  };
  step(1024);
  CHECK(host.allocations == 2);
  step(837);  // 2.45 and 6.5 MiB into the 3 and 8 MiB blocks
  step(1024);
  CHECK(host.allocations == 2);
  step(1000);
  CHECK(host.allocations == 2);
  step(300);  // 0.9 MiB: the 3 MiB block is more than twice it, so it gets its own
  CHECK(host.allocations == 3);
  Tensor hold = be.empty({1024, 2048}, DType::f32, MemCategory::activations);
  step(837);  // the 8 MiB block is held: mlp takes a block of its class
  CHECK(host.allocations == 4);
}

TEST_CASE("meta tensors have shapes and byte counts but no data") {
  MetaAllocator meta;
  TrackingAllocator tracker(meta);
  Tensor big = Tensor::empty({50432, 6144}, DType::bf16, tracker, MemCategory::weights);
  CHECK(big.data == nullptr);
  CHECK(big.device == Device::meta);
  CHECK(tracker.stats().current(MemCategory::weights) == size_t(50432) * 6144 * 2);
}

TEST_CASE("views share storage and check their ranges") {
  HostAllocator host;
  Tensor matrix = Tensor::empty({4, 3}, DType::f32, host, MemCategory::activations);
  for (int i = 0; i < 12; ++i) matrix.ptr<float>()[i] = float(i);
  Tensor rows = matrix.slice_rows(1, 2);
  CHECK(rows.shape == Shape{2, 3});
  CHECK(rows.ptr<float>()[0] == 3.0f);
  CHECK(matrix.reshaped({2, 6}).dim(-1) == 6);
  CHECK_THROWS_AS(matrix.slice_rows(3, 2), Error);
  CHECK_THROWS_AS(matrix.reshaped({5, 2}), Error);
}

TEST_CASE("bf16 conversion rounds to nearest even") {
  // 1 + 2^-8 lies exactly between two bf16 values (1 and 1 + 2^-7): ties go to even (1).
  CHECK(f32_to_bf16(1.0f + 1.0f / 256) == f32_to_bf16(1.0f));
  // 1 + 3*2^-8 ties between 1 + 2^-7 (odd mantissa) and 1 + 2^-6 (even): rounds up.
  CHECK(bf16_to_f32(f32_to_bf16(1.0f + 3.0f / 256)) == 1.0f + 1.0f / 64);
  CHECK(bf16_to_f32(f32_to_bf16(3.14159265f)) == 3.140625f);
  CHECK(f16_to_f32(f32_to_f16(3.14159265f)) == 3.140625f);
}
