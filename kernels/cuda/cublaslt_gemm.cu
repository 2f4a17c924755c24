// The cuBLASLt GEMM engine (nvcc builds only; the emulator build leaves this
// file out). As llm.c: f32 compute, one 32 MiB workspace, and one heuristic
// pick per problem; the integer product (i8 codes -> i32) uses cuBLASLt's
// int32 compute (IMMA tensor cores) where its layout rules allow. Unlike llm.c the matmul descriptor, the layouts and the
// chosen algorithm are cached per problem (shape, dtypes, transposes, leading
// dimensions, strides, pointer alignment), so the steady-state cost of a call
// is one cublasLtMatmul.
#include <cublasLt.h>

#include <cstdio>
#include <map>
#include <tuple>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/scratch.h"
#include "kernels/tensor.h"

#define FT_CUBLAS_CHECK(call) ::ft::cuda::cublas_check((call), #call, __FILE__, __LINE__)

namespace ft::cuda {
namespace {

void cublas_check(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS)
    fail("cuBLASLt error: ", call, " failed: ", cublasLtGetStatusString(status), " (", file, ":", line, ")");
}

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::bf16: return CUDA_R_16BF;
    case DType::i8: return CUDA_R_8I;
    case DType::i32: return CUDA_R_32I;
    default: return CUDA_R_32F;
  }
}

// The largest power of two (<= 256) dividing the address: cuBLASLt assumes 256
// unless told, and pointers into the middle of tensors are often less aligned.
uint32_t alignment(const void* p) {
  uintptr_t address = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && address % align != 0) align /= 2;
  return align;
}

// cuBLASLt's IMMA rules for regular (column-major) ordering, from the
// cublasLtMatmul() documentation: only the "TN" form (A transposed, B not),
// m and k multiples of 4, leading dimensions multiples of 4, pointers 4-byte
// aligned (strided batches keep every matrix so). Anything else goes to the
// tiled kernel, whose int32 arithmetic is equally exact.
bool imma_layout(const GemmArgs& args) {
  auto four = [](int64_t x) { return x % 4 == 0; };
  bool strides = args.batch <= 1 || (four(args.a.stride) && four(args.b.stride));
  return args.a.transposed && !args.b.transposed && four(args.m) && four(args.k) && four(args.a.ld) &&
         four(args.b.ld) && four(args.c.ld) && strides && alignment(args.a.data) >= 4 &&
         alignment(args.b.data) >= 4 && alignment(args.c.data) >= 4;
}

// What cuBLASLt runs: with f32 compute bf16 x bf16 -> bf16 or f32 and
// f32 x f32 -> f32; with int32 compute i8 x i8 -> i32 in IMMA layout. The
// rare f32 x f32 -> bf16, other integer layouts, and k = 0 (out = beta * out,
// which cuBLASLt rejects) go to the tiled kernel.
bool cublaslt_runs(const GemmArgs& args) {
  if (args.k == 0) return false;
  switch (args.a.dtype) {
    case DType::i8: return imma_layout(args);
    case DType::bf16: return args.c.dtype == DType::bf16 || args.c.dtype == DType::f32;
    default: return args.c.dtype == DType::f32;
  }
}

struct Problem {
  int64_t m, n, k, lda, ldb, ldc, stride_a, stride_b, stride_c;
  int batch;
  bool transa, transb;
  DType input, output;
  uint32_t align_a, align_b, align_c;
  auto tie() const {
    return std::tie(m, n, k, lda, ldb, ldc, stride_a, stride_b, stride_c, batch, transa, transb, input, output,
                    align_a, align_b, align_c);
  }
  bool operator<(const Problem& other) const { return tie() < other.tie(); }
};

// Everything cublasLtMatmul needs besides pointers and scalars.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool found = true;  // false: no cuBLASLt algorithm for this integer problem
};

cublasLtMatrixLayout_t make_layout(DType dtype, int64_t rows, int64_t cols, int64_t ld, int batch, int64_t stride) {
  cublasLtMatrixLayout_t layout;
  FT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, cuda_type(dtype), uint64_t(rows), uint64_t(cols), ld));
  if (batch > 1) {
    int32_t count = batch;
    FT_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    FT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                     sizeof(stride)));
  }
  return layout;
}

class CublasLtGemm final : public Gemm {
 public:
  explicit CublasLtGemm(Allocator& allocator)
      : workspace_(Tensor::empty({int64_t(kCublasLtWorkspaceBytes)}, DType::i8, allocator, MemCategory::workspace)) {
    FT_CUBLAS_CHECK(cublasLtCreate(&handle_));
  }

  ~CublasLtGemm() override {
    for (auto& [problem, plan] : plans_) {
      cublasLtMatrixLayoutDestroy(plan.a);
      cublasLtMatrixLayoutDestroy(plan.b);
      cublasLtMatrixLayoutDestroy(plan.c);
      cublasLtMatmulDescDestroy(plan.op);
    }
    cublasLtDestroy(handle_);
  }

  void gemm(const GemmArgs& args, CUstream_st* stream) override {
    check_gemm_args(args);
    if (!cublaslt_runs(args)) {
      tiled_->gemm(args, stream);
      return;
    }
    if (args.m == 0 || args.n == 0 || args.batch == 0) return;
    const Plan& p = plan(args);
    if (!p.found) {
      tiled_->gemm(args, stream);
      return;
    }
    // alpha and beta have the scale type: int32 for the integer product.
    const int32_t alpha_i = int32_t(args.alpha), beta_i = int32_t(args.beta);
    const bool integer = args.a.dtype == DType::i8;
    const void* alpha = integer ? static_cast<const void*>(&alpha_i) : &args.alpha;
    const void* beta = integer ? static_cast<const void*>(&beta_i) : &args.beta;
    FT_CUBLAS_CHECK(cublasLtMatmul(handle_, p.op, alpha, args.a.data, p.a, args.b.data, p.b, beta, args.c.data, p.c,
                                   args.c.data, p.c, &p.algo, workspace_.data, kCublasLtWorkspaceBytes, stream));
  }

 private:
  const Plan& plan(const GemmArgs& args) {
    Problem key{args.m,        args.n,        args.k,        args.a.ld,          args.b.ld,
                args.c.ld,     args.a.stride, args.b.stride, args.c.stride,      args.batch,
                args.a.transposed, args.b.transposed, args.a.dtype, args.c.dtype, alignment(args.a.data),
                alignment(args.b.data), alignment(args.c.data)};
    auto found = plans_.find(key);
    if (found != plans_.end()) return found->second;

    Plan p;
    const bool integer = args.a.dtype == DType::i8;
    FT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, integer ? CUBLAS_COMPUTE_32I : CUBLAS_COMPUTE_32F,
                                             integer ? CUDA_R_32I : CUDA_R_32F));
    cublasOperation_t transa = args.a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t transb = args.b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
    FT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa)));
    FT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb)));
    // Layouts describe the stored matrices, before op().
    p.a = args.a.transposed ? make_layout(args.a.dtype, args.k, args.m, args.a.ld, args.batch, args.a.stride)
                            : make_layout(args.a.dtype, args.m, args.k, args.a.ld, args.batch, args.a.stride);
    p.b = args.b.transposed ? make_layout(args.b.dtype, args.n, args.k, args.b.ld, args.batch, args.b.stride)
                            : make_layout(args.b.dtype, args.k, args.n, args.b.ld, args.batch, args.b.stride);
    p.c = make_layout(args.c.dtype, args.m, args.n, args.c.ld, args.batch, args.c.stride);

    cublasLtMatmulPreference_t preference;
    FT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    uint64_t workspace_bytes = kCublasLtWorkspaceBytes;
    FT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                         &workspace_bytes, sizeof(workspace_bytes)));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c}};
    for (const auto& [attribute, value] : alignments)
      FT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &value, sizeof(value)));
    cublasLtMatmulHeuristicResult_t result{};
    int found_count = 0;
    cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.a, p.b, p.c, p.c, preference, 1, &result, &found_count);
    cublasLtMatmulPreferenceDestroy(preference);
    // IMMA kernels have had limits beyond the documented ones in some
    // cuBLASLt versions (torch's _int_mm still asks for more than 16 rows):
    // an integer problem without an algorithm runs on the tiled kernel,
    // whose int32 sums are the same.
    if (integer && (status != CUBLAS_STATUS_SUCCESS || found_count == 0)) {
      p.found = false;
      log_no_imma_once(args, status);
      return plans_.emplace(key, p).first->second;
    }
    FT_CUBLAS_CHECK(status);
    FT_CHECK(found_count > 0, "cuBLASLt: no algorithm for a ", args.m, " x ", args.n, " x ", args.k, " ",
             dtype_name(args.a.dtype), " -> ", dtype_name(args.c.dtype), " product");
    p.algo = result.algo;
    return plans_.emplace(key, p).first->second;
  }

  // The tiled fallback is far slower than IMMA: say so, once per engine,
  // naming the first problem it happened to.
  void log_no_imma_once(const GemmArgs& args, cublasStatus_t status) {
    if (logged_no_imma_) return;
    logged_no_imma_ = true;
    std::fprintf(stderr,
                 "warning: cuBLASLt has no IMMA algorithm for the int8 product %lld x %lld x %lld (%s); the tiled "
                 "int8 kernel runs instead (exact, but slower); further such products are not reported\n",
                 static_cast<long long>(args.m), static_cast<long long>(args.n), static_cast<long long>(args.k),
                 status == CUBLAS_STATUS_SUCCESS ? "no algorithm returned" : cublasLtGetStatusString(status));
  }

  cublasLtHandle_t handle_ = nullptr;
  bool logged_no_imma_ = false;
  Tensor workspace_;
  std::map<Problem, Plan> plans_;
  std::unique_ptr<Gemm> tiled_ = make_tiled_gemm();
};

}  // namespace

std::unique_ptr<Gemm> make_cublaslt_gemm(Allocator& allocator) { return std::make_unique<CublasLtGemm>(allocator); }

}  // namespace ft::cuda
