#include "trainer/device_backend.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <vector>

#include "kernels/caching_allocator.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/error.h"
#include "trainer/plan.h"

namespace ft {

size_t device_allocation_limit_bytes(std::ostream& log) {
  const char* text = std::getenv("FT_DEVICE_MEMORY_LIMIT");
  if (!text || !*text) return 0;
  size_t limit_bytes = 0;
  try {
    limit_bytes = parse_byte_size(text);
  } catch (const Error& error) {
    fail("FT_DEVICE_MEMORY_LIMIT: ", error.what());
  }
  const size_t in_use_bytes = cuda_device_bytes_in_use();
  const size_t reserve_bytes = std::max(in_use_bytes, PlanOptions{}.context_reserve_bytes);
  FT_CHECK(limit_bytes > reserve_bytes, "FT_DEVICE_MEMORY_LIMIT=", text, " leaves nothing for allocations after the ",
           reserve_bytes, "-byte context reserve");
  log << "device memory limit: " << text << " (FT_DEVICE_MEMORY_LIMIT): " << limit_bytes - reserve_bytes
      << " bytes for allocations, after a " << reserve_bytes << "-byte context reserve (the device uses "
      << in_use_bytes << " now)\n";
  return limit_bytes - reserve_bytes;
}

DeviceBackend make_device_backend(DeviceChoice choice, const std::string& source, Allocator& host, std::ostream& log) {
  std::string no_cuda_why;
  bool runtime_failed = false;
  const bool use_cuda = choice != DeviceChoice::cpu && cuda_device_count(&no_cuda_why, &runtime_failed) > 0;
  FT_CHECK(use_cuda || choice != DeviceChoice::cuda, source, ": device: cuda, but no CUDA device is usable (",
           no_cuda_why, "); set device: auto or cpu to run on the CPU");
  const char* automatic = choice == DeviceChoice::automatic ? "auto: " : "";
  DeviceBackend device;
  if (use_cuda) {
    device.device_memory = make_cuda_caching_allocator(device_allocation_limit_bytes(log));
    device.tracker = std::make_unique<TrackingAllocator>(*device.device_memory);
    device.backend = make_cuda_backend(*device.tracker);
    log << "device: cuda (" << automatic << cuda_device_description() << ")\n";
    return device;
  }
  // The step's transient tensors reuse cached blocks instead of going back
  // to malloc each step, so RSS stops growing over a run's first steps, and
  // a shorter step reuses a longer one's (reuse_larger); the tracker above
  // it still counts the bytes asked for, as the planner does.
  device.device_memory = std::make_unique<CachingAllocator>(host, true);
  device.tracker = std::make_unique<TrackingAllocator>(*device.device_memory);
  device.backend = std::make_unique<CpuBackend>(*device.tracker);
  log << "device: cpu";
  if (choice == DeviceChoice::automatic) log << " (auto: no CUDA device: " << no_cuda_why << ")";
  log << "\n";
  // A GPU whose runtime fails is worth a warning: the run will be far slower
  // than the user expects, for a reason they can fix.
  if (runtime_failed)
    std::cerr << "warning: device: auto falls back to the CPU because the CUDA runtime failed: " << no_cuda_why
              << "\n";
  return device;
}

void bind_local_device(int local_rank) {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (!visible) {
    setenv("CUDA_VISIBLE_DEVICES", std::to_string(local_rank).c_str(), 1);
    return;
  }
  std::vector<std::string> devices;
  std::istringstream list(visible);
  for (std::string device; std::getline(list, device, ',');) devices.push_back(device);
  if (devices.size() <= 1) return;
  FT_CHECK(size_t(local_rank) < devices.size(), "local rank ", local_rank, " has no GPU of its own: CUDA_VISIBLE_DEVICES=",
           visible, " lists ", devices.size(), " (run one rank per GPU)");
  setenv("CUDA_VISIBLE_DEVICES", devices[size_t(local_rank)].c_str(), 1);
}

}  // namespace ft
