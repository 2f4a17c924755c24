// CpuBackend's GEMMs through oneDNN's matmul primitive (when the build found
// oneDNN): f32 x f32, bf16 x bf16 -> f32 or bf16 (f32 accumulation; AVX512-BF16
// or AMX where the CPU has them) and s8 x s8 -> s32 for LLM.int8()'s product
// (VNNI or AMX). oneDNN picks its kernel for the CPU it runs on, so the binary
// stays portable. Primitives are created once per shape and cached. Weights
// are passed in their plain row-major layout: oneDNN packs them per call into
// its own scratch, as our reference kernels do, so no second copy of the
// frozen base exists.
#pragma once
#include <cstdint>
#include <memory>

#include "kernels/tensor.h"

namespace ft {

// Whether this build links oneDNN.
bool onednn_built();

class OnednnGemm {
 public:
  OnednnGemm();
  ~OnednnGemm();
  OnednnGemm(const OnednnGemm&) = delete;
  OnednnGemm& operator=(const OnednnGemm&) = delete;

  // Backend::matmul's contract on checked operands. Returns false, having
  // done nothing, where oneDNN has no kernel for the dtypes (mixed f32/bf16
  // inputs, f16) or the product is empty: the caller runs the reference.
  bool matmul(Tensor& out, const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b, float alpha,
              float beta);

  // Whether oneDNN's bf16 matmul runs on native bf16 dot products here
  // (AVX512-BF16 or AMX). Elsewhere (AVX2, plain AVX-512) its bf16 kernels
  // convert inside a loop slower than its f32 GEMM (scripts/bench_cpu
  // --vs-torch's per-op table), so CpuBackend widens bf16 operands to f32.
  bool bf16_native() const;

  // Whether matmul gives each output row the same bits whatever the number
  // of rows in the call: oneDNN's brgemm kernels (avx512_core and above) sum
  // a row's products in one fixed order; on AVX2 its gemm:jit kernels do
  // not (measured: 1- to 128-row slices of a 256-row product differ from it
  // in 1 to all 256 rows). The chunked MLP, pipeline micro-batches and
  // data-parallel shards equal one whole call only where this holds, so
  // CpuBackend runs its reference kernels (row-independent) elsewhere.
  bool rows_independent() const;

  // Whether int8_product is available: where oneDNN dispatches to AVX-512
  // VNNI or AMX.
  // Elsewhere oneDNN's int8 kernels sum pairs of u8 x s8 products in
  // saturating int16, which would not be exact. (Its f32 GEMM on the codes in
  // K slices of 1024, exact, measured no faster on AVX2 than int8.cpp's int16
  // kernel, so that kernel runs there.)
  bool int8_exact() const;
  // product[N, O] = xq[N, K] @ wq[O, K]^T in int32, exactly (row-major,
  // codes in [-127, 127]; N, K, O > 0). Only where int8_exact().
  void int8_product(int32_t* product, const int8_t* xq, const int8_t* wq, int64_t N, int64_t K, int64_t O);
  // The kernel oneDNN ran the last matmul or int8_product with, as it names
  // it ("brg:avx512_core_vnni"): for the op profile (kernels/op_profile.h).
  const char* last_kernel() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ft
