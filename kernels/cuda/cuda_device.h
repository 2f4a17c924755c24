// What the trainer needs from the CUDA build without linking it (the trainer
// library stays plain C++): whether a device is usable, and the backend with
// its device memory. Each executable links one implementation, through CMake's
// `kernels_device` (kernels/CMakeLists.txt):
//   cuda_device.cu - in kernels_cuda (nvcc, real GPUs) and in kernels_cuda_emu
//                    (the emulator, whose one device always counts as present);
//   no_cuda.cpp    - builds without nvcc: no device, "built without CUDA".
#pragma once
#include <memory>
#include <string>

#include "kernels/backend.h"

namespace ft {

// The number of usable CUDA devices; when there is none, *why says why (the
// runtime's error, or that this build has no CUDA backend). *runtime_failed
// (when given) tells a machine without a GPU (cudaErrorNoDevice, no NVIDIA
// driver installed, a build without CUDA: false) from a CUDA runtime that
// failed (a driver older than the toolkit, a broken install: true), which
// must not pass for "no GPU".
int cuda_device_count(std::string* why, bool* runtime_failed = nullptr);
// Device 0 in a few words (name, memory), for the trainer's "device:" line.
std::string cuda_device_description();

// The bytes device 0 already has in use before this process allocates (its
// CUDA context, and anything another process holds).
size_t cuda_device_bytes_in_use();
// Device memory for training: a CachingAllocator over a DeviceAllocator
// (kernels/cuda/device_allocator.h), owning both; limit_bytes > 0 caps what
// the DeviceAllocator holds. Wrap it in a TrackingAllocator for per-category
// accounting.
std::unique_ptr<Allocator> make_cuda_caching_allocator(size_t limit_bytes = 0);
// CudaBackend with the build's default GEMM (cuBLASLt on a GPU, the tiled
// kernel under the emulator). allocator must hand out device memory and
// outlive the backend.
std::unique_ptr<Backend> make_cuda_backend(Allocator& allocator);

}  // namespace ft
