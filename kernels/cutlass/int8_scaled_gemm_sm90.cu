// The LLM.int8() product with its dequantisation in the GEMM's epilogue, on
// Hopper's int8 tensor cores (IGMMA through TMA and warp specialisation),
// from CUTLASS 3's collective builders and an epilogue visitor tree:
//   out[n, o] = bf16(1/127^2 * (s_x[n] * (s_w[o] * float(acc[n, o]))) + bias[o])
// with acc the exact int32 product of the codes. One pass: the int32 product
// never leaves the SM (the cuBLASLt path writes it to memory and reads it back
// in a second kernel, int8_linear.cu). The epilogue's f32 products are those
// of the reference in another order, so values can differ from its
// dequantisation by an f32 rounding before the bf16 one (kernels/backend.h).
//
// Built only for sm_90a (wgmma needs the arch-specific target), in builds
// with CUTLASS's headers (scripts/deps fetches them): kernels/CMakeLists.txt.
#include "kernels/cutlass/int8_scaled_gemm.h"

#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

namespace ft::cutlass_kernels {
namespace {

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;

// vLLM's and CUTLASS's profiled default for int8 on H100 at large M: a
// 128 x 128 x 128 tile, two CTAs a cluster along M, the ping-pong schedule
// (two consumer warp groups alternate mainloop and epilogue).
using TileShape = Shape<_128, _128, _128>;
using ClusterShape = Shape<_2, _1, _1>;
using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;

using ElementCode = int8_t;
using ElementOut = cutlass::bfloat16_t;
using ElementAcc = int32_t;
constexpr int kCodeAlignment = 16;  // elements: 16 bytes, TMA's minimum
constexpr int kOutAlignment = 8;

// M = tokens (rows of x), N = output features. Per-column (o) operands are
// "row broadcasts" in CUTLASS's words, per-row (n) ones "column broadcasts".
using RowScale = fusion::Sm90ColBroadcast<0, TileShape, float, float, Stride<_1, _0, int64_t>>;
using WeightScale = fusion::Sm90RowBroadcast<0, TileShape, float, float, Stride<_0, _1, int64_t>>;
using Bias = fusion::Sm90RowBroadcast<0, TileShape, float, float, Stride<_0, _1, int64_t>>;
using Inv127Sq = fusion::Sm90ScalarBroadcast<float, Stride<_0, _0, int64_t>>;
using Acc = fusion::Sm90AccFetch;
template <template <class> class Fn, class Out>
using Compute = fusion::Sm90Compute<Fn, Out, float, cutlass::FloatRoundStyle::round_to_nearest>;

using WeightScaled = fusion::Sm90EVT<Compute<cutlass::multiplies, float>, WeightScale, Acc>;
using BothScaled = fusion::Sm90EVT<Compute<cutlass::multiplies, float>, RowScale, WeightScaled>;
using Dequantised =
    fusion::Sm90EVT<Compute<cutlass::homogeneous_multiply_add, ElementOut>, Inv127Sq, BothScaled, Bias>;

using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, float, void, cutlass::layout::RowMajor,
    kOutAlignment, ElementOut, cutlass::layout::RowMajor, kOutAlignment, EpilogueSchedule,
    Dequantised>::CollectiveOp;

using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementCode, cutlass::layout::RowMajor, kCodeAlignment,
    ElementCode, cutlass::layout::ColumnMajor, kCodeAlignment, ElementAcc, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
        sizeof(typename CollectiveEpilogue::SharedStorage))>,
    KernelSchedule>::CollectiveOp;

using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                    CollectiveEpilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

typename Gemm::Arguments arguments(const Int8ScaledGemm& g) {
  const int M = int(g.rows), N = int(g.out_features), K = int(g.in_features);
  using StrideA = typename Gemm::GemmKernel::StrideA;
  using StrideB = typename Gemm::GemmKernel::StrideB;
  using StrideD = typename Gemm::GemmKernel::StrideD;
  // Packed: codes [M, K] and weight [N, K] K-major (the int8 wgmma's only
  // layout), out [M, N] N-major; one batch.
  const StrideA stride_codes = make_stride(int64_t(K), Int<1>{}, int64_t(0));
  const StrideB stride_weight = make_stride(int64_t(K), Int<1>{}, int64_t(0));
  const StrideD stride_out = make_stride(int64_t(N), Int<1>{}, int64_t(0));
  typename Dequantised::Arguments dequantised{
      {{1.0f / (127.0f * 127.0f)}},  // Inv127Sq
      {
          {g.row_scales},  // RowScale
          {{g.weight_scales}, {}, {}},  // WeightScaled: s_w[o] * acc
          {},
      },
      {g.bias},  // Bias (null reads as 0)
      {},
  };
  // The persistent scheduler sizes its grid by the SM count, which it would
  // otherwise query on every call.
  static const int sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count();
  cutlass::KernelHardwareInfo hardware;
  hardware.sm_count = sm_count;
  return typename Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {M, N, K, 1},
                                  {g.codes, stride_codes, g.weight, stride_weight},
                                  {dequantised, nullptr, stride_out, reinterpret_cast<ElementOut*>(g.out),
                                   stride_out},
                                  hardware};
}

}  // namespace

bool int8_scaled_gemm_supported(const Int8ScaledGemm& g) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  typename Gemm::Arguments args = arguments(g);
  return g.in_features % kCodeAlignment == 0 && g.out_features % kOutAlignment == 0 && aligned(g.codes) &&
         aligned(g.weight) && aligned(g.out) && g.rows < (int64_t(1) << 31) && g.out_features < (int64_t(1) << 31) &&
         Gemm::can_implement(args) == cutlass::Status::kSuccess;
}

size_t int8_scaled_gemm_workspace_bytes(const Int8ScaledGemm& g) {
  return Gemm::get_workspace_size(arguments(g));
}

const char* int8_scaled_gemm(const Int8ScaledGemm& g, void* workspace, cudaStream_t stream) {
  Gemm gemm;
  const typename Gemm::Arguments args = arguments(g);
  cutlass::Status status = gemm.initialize(args, workspace, stream);
  if (status == cutlass::Status::kSuccess) status = gemm.run(stream);
  return status == cutlass::Status::kSuccess ? nullptr : cutlassGetStatusString(status);
}

}  // namespace ft::cutlass_kernels
