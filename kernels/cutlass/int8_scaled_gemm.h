// The CUTLASS kernels' interface (int8_scaled_gemm_sm90.cu): plain C++ and
// cudaStream_t only, so the rest of the CUDA backend compiles without
// CUTLASS's headers, for every architecture.
#pragma once
#include <cstddef>
#include <cstdint>

struct CUstream_st;

namespace ft::cutlass_kernels {

// out [rows, out_features] bf16, row-major =
//   bf16(float(codes [rows, in_features] i8 @ weight [out_features, in_features]^T)
//        * row_scales[n] * weight_scales[o] / 127^2 + bias[o]),
// row_scales f32 [rows], weight_scales f32 [out_features], bias f32
// [out_features] or null; every tensor packed row-major on the device.
struct Int8ScaledGemm {
  void* out;
  const int8_t *codes, *weight;
  const float *row_scales, *weight_scales, *bias;
  int64_t rows, in_features, out_features;
};

// Whether the kernel takes these operands (sizes, alignment).
bool int8_scaled_gemm_supported(const Int8ScaledGemm& g);
// Device workspace the kernel needs for them (bytes).
size_t int8_scaled_gemm_workspace_bytes(const Int8ScaledGemm& g);
// Enqueues it on stream; null on success, else CUTLASS's status text.
const char* int8_scaled_gemm(const Int8ScaledGemm& g, void* workspace, CUstream_st* stream);

}  // namespace ft::cutlass_kernels
