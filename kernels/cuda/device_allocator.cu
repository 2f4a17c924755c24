#include "kernels/cuda/device_allocator.h"

#include "kernels/cuda/cuda_check.h"

namespace ft {

void* DeviceAllocator::allocate(size_t bytes, MemCategory category) {
  if (bytes == 0) return nullptr;
  FT_CHECK(limit_bytes_ == 0 || bytes <= limit_bytes_ - held_bytes_, "CUDA error: cudaMalloc of ", bytes,
           " bytes for ", mem_category_name(category), " failed: out of memory under the device memory limit (",
           held_bytes_, " of ", limit_bytes_, " bytes held; FT_DEVICE_MEMORY_LIMIT)");
  void* ptr = nullptr;
  cudaError_t status = cudaMalloc(&ptr, bytes);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls are not blamed
    fail("CUDA error: cudaMalloc of ", bytes, " bytes for ", mem_category_name(category),
         " failed: ", cudaGetErrorString(status));
  }
  held_bytes_ += bytes;
  return ptr;
}

void DeviceAllocator::deallocate(void* ptr, size_t bytes, MemCategory) {
  if (!ptr) return;
  FT_CUDA_CHECK(cudaFree(ptr));
  held_bytes_ -= bytes;
}

void* PinnedHostAllocator::allocate(size_t bytes, MemCategory category) {
  if (bytes == 0) return nullptr;
  void* ptr = nullptr;
  cudaError_t status = cudaMallocHost(&ptr, bytes);
  if (status != cudaSuccess) {
    cudaGetLastError();
    fail("CUDA error: cudaMallocHost of ", bytes, " bytes of pinned host memory for ", mem_category_name(category),
         " failed: ", cudaGetErrorString(status));
  }
  return ptr;
}

void PinnedHostAllocator::deallocate(void* ptr, size_t, MemCategory) { FT_CUDA_CHECK(cudaFreeHost(ptr)); }

}  // namespace ft
