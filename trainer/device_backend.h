// The backend a command runs on (training, generation), from the config's
// device choice: CUDA where a device is usable (auto) or required (cuda),
// else the CPU; every allocation goes through a TrackingAllocator.
#pragma once
#include <memory>
#include <ostream>
#include <string>

#include "kernels/backend.h"
#include "trainer/train_config.h"

namespace ft {

struct DeviceBackend {
  std::unique_ptr<Allocator> device_memory;  // the caching allocator under the tracker
  std::unique_ptr<TrackingAllocator> tracker;
  std::unique_ptr<Backend> backend;
};

// Writes the "device:" line (which device and why) to log. source names the
// config in the error for device: cuda without a usable GPU.
DeviceBackend make_device_backend(DeviceChoice choice, const std::string& source, Allocator& host, std::ostream& log);

// FT_DEVICE_MEMORY_LIMIT=24GiB (any size parse_byte_size reads) runs as a
// card of that size would: the bytes the CUDA device allocator may hold, the
// limit less the planner's context reserve (the CUDA context and the
// libraries' handles, outside cudaMalloc) or less what the device already
// uses if that is more; 0 when unset. Says so on log. Reads the device.
size_t device_allocation_limit_bytes(std::ostream& log);

// One GPU per rank: before the CUDA runtime starts, limits this process to
// the local_rank-th device of CUDA_VISIBLE_DEVICES (or device local_rank when
// it is unset). A list of one device is kept as it is (a launcher that binds
// a GPU to each task, as srun --gpus-per-task=1 does, has chosen already).
void bind_local_device(int local_rank);

}  // namespace ft
