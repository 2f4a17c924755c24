// The LLM.int8() linear ops of the CUDA backend (int8_linear.cu) with their
// blocking as a parameter: CudaBackend passes kernels/int8_tiles.h's sizes,
// which only layers far larger than the emulator can run reach in more than
// one block, so tests pass small ones to exercise several blocks. Plain C++,
// like cuda_backend.h.
#pragma once
#include <cstdint>
#include <functional>

#include "kernels/allocator.h"
#include "kernels/backend.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/int8_gemm_engine.h"
#include "kernels/tensor.h"

namespace ft::cuda {

// Where an op runs: the GEMM engine, the allocator its scratch comes from
// (category workspace, freed on return) and the stream. after_pass, where
// set, is called after each pass is enqueued, with the pass's name
// (scripts/bench_gpu records an event there to time each pass).
struct Int8Context {
  Gemm& gemm;
  Allocator& allocator;
  CUstream_st* stream;
  // The library int8 GEMM (int8_gemm_engine.h) the forward runs fused on
  // where it takes the operands; null: the int32 product and our epilogue.
  Int8GemmEngine* int8_gemm = nullptr;
  std::function<void(const char* pass)> after_pass = {};
  void passed(const char* pass) const {
    if (after_pass) after_pass(pass);
  }
};

// Backend::int8_linear_forward holding the int32 product of at most
// chunk_rows rows of x at a time (balanced chunks), and gathering the codes of
// at most gather_columns outlier columns (more are read in place); run fused
// (int8_forward_runs_fused), the small GEMM takes at most fused_columns
// outlier columns (more are added in place) and neither of the others applies.
void int8_linear_forward(Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& weight_scales,
                         float threshold, const Int8Epilogue& epilogue, int64_t chunk_rows, int64_t gather_columns,
                         int64_t fused_columns, const Int8Context& context);
// Whether that forward runs fused: context's engine takes the sizes, x, out
// and h are bf16 (int8_forward_fuses) and every operand the engine reads
// starts 16-byte aligned (as every tensor an allocator hands out does).
bool int8_forward_runs_fused(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& weight_scales,
                             const Int8Epilogue& epilogue, const Int8Context& context);

// Backend::int8_quantize_input (input.threshold is the caller's to set);
// given_scales (f32 [N], may be null) replace the row scales' absmax, as
// Int8Epilogue::row_absmax does in the forward.
void int8_quantize_input(Int8Input& input, const Tensor& x, float threshold, const Tensor* outlier_flags,
                         const Tensor* given_scales, const Int8Context& context);

// Backend::int8_row_absmax.
void int8_row_absmax(Tensor& absmax, const Tensor& x, float threshold, const Tensor* outlier_flags,
                     const Int8Context& context);

// Backend::int8_linear_backward dequantising tile_columns input features of
// the weight at a time.
void int8_linear_backward(Tensor& dx, const Tensor& dout, const Tensor& weight, const Tensor& weight_scales,
                          bool accumulate, int64_t tile_columns, const Int8Context& context);

}  // namespace ft::cuda
