// FT_DEVICE_MEMORY_LIMIT: a smaller card simulated on a larger one. The
// device allocator refuses what would take it past its limit, as cudaMalloc
// would on that card; the caching allocator then gives back its cached
// blocks and tries once more, as after a real out-of-memory; the trainer
// reads the limit from the environment less the planner's context reserve.
#include <doctest/doctest.h>

#include <cstdlib>
#include <sstream>

#include <algorithm>

#include "kernels/caching_allocator.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/error.h"
#include "tests/emu/cuda_device_skip.h"
#include "trainer/device_backend.h"
#include "trainer/plan.h"

using namespace ft;

namespace {
const bool cuda_device_present = cuda_test::exit_skipped_without_cuda_device();
}  // namespace

TEST_CASE("cuda: DeviceAllocator holds no more than its limit") {
  REQUIRE(cuda_device_present);
  DeviceAllocator device(size_t(10) << 20);
  void* a = device.allocate(size_t(6) << 20, MemCategory::activations);
  CHECK_THROWS_WITH_AS(device.allocate(size_t(5) << 20, MemCategory::workspace),
                       doctest::Contains("out of memory under the device memory limit"), Error);
  void* b = device.allocate(size_t(4) << 20, MemCategory::workspace);  // exactly the limit
  device.deallocate(a, size_t(6) << 20, MemCategory::activations);
  void* c = device.allocate(size_t(5) << 20, MemCategory::workspace);  // room again
  device.deallocate(b, size_t(4) << 20, MemCategory::workspace);
  device.deallocate(c, size_t(5) << 20, MemCategory::workspace);
}

TEST_CASE("cuda: under a limit the caching allocator gives back cached blocks to make room") {
  REQUIRE(cuda_device_present);
  DeviceAllocator device(size_t(10) << 20);
  CachingAllocator caching(device);
  void* a = caching.allocate(size_t(6) << 20, MemCategory::activations);
  caching.deallocate(a, size_t(6) << 20, MemCategory::activations);  // cached, still held from the device
  CHECK(caching.stats().reserved_bytes >= size_t(6) << 20);
  void* b = caching.allocate(size_t(8) << 20, MemCategory::activations);  // fits only once the cache is released
  CHECK(caching.stats().reserved_bytes <= size_t(10) << 20);
  CHECK_THROWS_AS(caching.allocate(size_t(4) << 20, MemCategory::activations), Error);
  caching.deallocate(b, size_t(8) << 20, MemCategory::activations);
}

TEST_CASE("FT_DEVICE_MEMORY_LIMIT sets the device allocations' limit, less the context reserve") {
  REQUIRE(cuda_device_present);
  // The planner's reserve, unless the device already uses more (the emulator's uses nothing).
  const size_t reserve = std::max(PlanOptions{}.context_reserve_bytes, cuda_device_bytes_in_use());
  std::ostringstream log;
  unsetenv("FT_DEVICE_MEMORY_LIMIT");
  CHECK(device_allocation_limit_bytes(log) == 0);
  CHECK(log.str().empty());
  setenv("FT_DEVICE_MEMORY_LIMIT", "24GiB", 1);
  CHECK(device_allocation_limit_bytes(log) == (size_t(24) << 30) - reserve);
  CHECK(log.str().find("device memory limit: 24GiB") != std::string::npos);
  setenv("FT_DEVICE_MEMORY_LIMIT", "twenty", 1);
  CHECK_THROWS_WITH_AS(device_allocation_limit_bytes(log), doctest::Contains("FT_DEVICE_MEMORY_LIMIT: \"twenty\" is not a size"),
                       Error);
  setenv("FT_DEVICE_MEMORY_LIMIT", "512MiB", 1);
  CHECK_THROWS_WITH_AS(device_allocation_limit_bytes(log), doctest::Contains("leaves nothing for allocations"), Error);
  unsetenv("FT_DEVICE_MEMORY_LIMIT");
}
