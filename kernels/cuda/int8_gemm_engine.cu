// The int8 GEMM engines of int8_gemm_engine.h: CUTLASS's (GPU builds with its
// headers) and our substitute (everywhere, the emulator included).
#include "kernels/cuda/int8_gemm_engine.h"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/library_choice.h"
#include "kernels/cuda/scratch.h"
#include "kernels/error.h"
#if defined(FT_HAVE_CUTLASS)
#include "kernels/cutlass/int8_scaled_gemm.h"
#endif

namespace ft::cuda {
namespace {

constexpr int kBlock = 256;

// out[i] as the engine's formula, from the int32 product [N, O].
__global__ void __launch_bounds__(kBlock)
    scale_product_kernel(__nv_bfloat16* out, const int32_t* product, const float* sx, const float* sw,
                         const float* bias, int64_t N, int64_t O) {
  for (int64_t i = int64_t(blockIdx.x) * kBlock + threadIdx.x; i < N * O; i += int64_t(gridDim.x) * kBlock) {
    const int64_t n = i / O, o = i % O;
    const float scaled = sx[n] * (sw[o] * float(product[i]));
    out[i] = __float2bfloat16(fmaf(1.0f / (127.0f * 127.0f), scaled, bias ? bias[o] : 0.0f));
  }
}

class SubstituteInt8Gemm final : public Int8GemmEngine {
 public:
  SubstituteInt8Gemm(Gemm& gemm, Allocator& allocator) : gemm_(gemm), allocator_(allocator) {}
  bool takes(int64_t, int64_t) const override { return true; }
  void scaled_product(Tensor& out, const Tensor& codes, const Tensor& weight, const Tensor& row_scales,
                      const Tensor& weight_scales, const Tensor* bias, CUstream_st* stream) override {
    const int64_t N = codes.rows(), K = codes.cols(), O = weight.dim(0);
    Tensor product = Tensor::empty({N, O}, DType::i32, allocator_, MemCategory::workspace);
    if (N == 0 || O == 0) return;
    // Row-major product [N, O] = column-major [O, N] = weight^T-as-stored @ codes: int8_linear.cu's TN form.
    GemmArgs args{};
    args.m = O;
    args.n = N;
    args.k = K;
    args.batch = 1;
    args.alpha = 1.0f;
    args.a = {weight.data, DType::i8, true, K, 0};
    args.b = {codes.data, DType::i8, false, K, 0};
    args.c = {product.data, DType::i32, O, 0};
    gemm_.gemm(args, stream);
    launch<scale_product_kernel>(elementwise_blocks(N * O, kBlock), kBlock, 0, stream,
                                 out.ptr<__nv_bfloat16>(), product.ptr<const int32_t>(),
                                 row_scales.ptr<const float>(), weight_scales.ptr<const float>(),
                                 bias ? bias->ptr<const float>() : nullptr, N, O);
    FT_CUDA_CHECK_LAUNCH();
  }

 private:
  Gemm& gemm_;
  Allocator& allocator_;
};

#if defined(FT_HAVE_CUTLASS)
cutlass_kernels::Int8ScaledGemm cutlass_operands(Tensor& out, const Tensor& codes, const Tensor& weight,
                                                 const Tensor& row_scales, const Tensor& weight_scales,
                                                 const Tensor* bias) {
  return {out.data, codes.ptr<const int8_t>(), weight.ptr<const int8_t>(), row_scales.ptr<const float>(),
          weight_scales.ptr<const float>(), bias ? bias->ptr<const float>() : nullptr,
          codes.rows(), codes.cols(), weight.dim(0)};
}

class CutlassInt8Gemm final : public Int8GemmEngine {
 public:
  explicit CutlassInt8Gemm(Allocator& allocator) : allocator_(allocator) {}
  bool takes(int64_t in_features, int64_t out_features) const override {
    return int8_scaled_gemm_takes(in_features, out_features);
  }
  void scaled_product(Tensor& out, const Tensor& codes, const Tensor& weight, const Tensor& row_scales,
                      const Tensor& weight_scales, const Tensor* bias, CUstream_st* stream) override {
    const cutlass_kernels::Int8ScaledGemm g = cutlass_operands(out, codes, weight, row_scales, weight_scales, bias);
    FT_CHECK(cutlass_kernels::int8_scaled_gemm_supported(g), "int8_linear_forward: CUTLASS's int8 GEMM does not take [",
             g.rows, ", ", g.in_features, "] -> ", g.out_features, " at these addresses");
    // None for this kernel (its persistent scheduler and broadcast epilogue keep no state), which the planner assumes.
    const size_t workspace_bytes = cutlass_kernels::int8_scaled_gemm_workspace_bytes(g);
    Tensor workspace;
    if (workspace_bytes > 0)
      workspace = Tensor::empty({int64_t(workspace_bytes)}, DType::u8, allocator_, MemCategory::workspace);
    const char* failure = cutlass_kernels::int8_scaled_gemm(g, workspace.data, stream);
    FT_CHECK(failure == nullptr, "int8_linear_forward: CUTLASS's int8 GEMM failed: ", failure);
    FT_CUDA_CHECK_LAUNCH();
  }

 private:
  Allocator& allocator_;
};

bool sm90_device() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) return false;
  return major == 9 && minor == 0;
}
#endif

}  // namespace

bool library_int8_gemm_wanted() {
  return library_engine_wanted("FT_INT8_GEMM_ENGINE", "CUTLASS's int8 GEMM where built and the GPU is sm_90, else ours");
}

bool library_int8_gemm_available() {
#if defined(FT_HAVE_CUTLASS)
  return library_int8_gemm_wanted() && sm90_device();
#else
  return false;
#endif
}

std::unique_ptr<Int8GemmEngine> make_library_int8_gemm(Allocator& allocator) {
#if defined(FT_HAVE_CUTLASS)
  if (library_int8_gemm_available()) return std::make_unique<CutlassInt8Gemm>(allocator);
#else
  (void)allocator;
#endif
  return nullptr;
}

std::unique_ptr<Int8GemmEngine> make_substitute_int8_gemm(Gemm& gemm, Allocator& allocator) {
  return std::make_unique<SubstituteInt8Gemm>(gemm, allocator);
}

}  // namespace ft::cuda
