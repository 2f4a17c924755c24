// Backend::matmul on cuda::Gemm. A row-major matrix is the column-major view
// of its transpose, so the row-major out[M,N] = op(a) @ op(b) is computed as
// the column-major out^T[N,M] = op(b)^T @ op(a)^T: the operands swap places
// and keep their transpose flags, with leading dimension = row-major columns.
#include "kernels/cuda/checks.h"
#include "kernels/cuda/cuda_backend.h"

namespace ft {
namespace {

bool overlaps(const Tensor& x, const Tensor& y) {
  const char* x0 = static_cast<const char*>(x.data);
  const char* y0 = static_cast<const char*>(y.data);
  return x0 < y0 + y.size_bytes() && y0 < x0 + x.size_bytes();
}

}  // namespace

void CudaBackend::matmul(Tensor& out, const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b,
                         float alpha, float beta) {
  cuda::check_float(out, "matmul", "out");
  cuda::check_float(a, "matmul", "a");
  cuda::check_float(b, "matmul", "b");
  int64_t M = out.rows(), N = out.cols();
  int64_t K = transpose_a ? a.rows() : a.cols();
  int64_t a_rows = transpose_a ? a.cols() : a.rows();
  int64_t b_rows = transpose_b ? b.cols() : b.rows(), b_cols = transpose_b ? b.rows() : b.cols();
  FT_CHECK(a_rows == M && b_rows == K && b_cols == N, "matmul: out ", shape_string(out.shape), " = op(a) ",
           shape_string(a.shape), (transpose_a ? "^T" : ""), " @ op(b) ", shape_string(b.shape),
           (transpose_b ? "^T" : ""), ": expected op(a) [", M, ", K] and op(b) [K, ", N, "], got op(a) [", a_rows,
           ", ", K, "] and op(b) [", b_rows, ", ", b_cols, "]");
  FT_CHECK(!overlaps(out, a) && !overlaps(out, b), "matmul: out must not alias a or b");
  if (M == 0 || N == 0) return;
  // Mixed inputs (an f32 activation times a bf16 weight): widen the bf16 one
  // to f32, exactly, so the product is the f32 one the CPU backend computes.
  Tensor a_wide, b_wide;
  const Tensor* a_in = &a;
  const Tensor* b_in = &b;
  if (a.dtype != b.dtype) {
    Tensor& wide = a.dtype == DType::bf16 ? a_wide : b_wide;
    const Tensor& narrow = a.dtype == DType::bf16 ? a : b;
    wide = scratch(narrow.shape, DType::f32);
    copy(wide, narrow);
    (a.dtype == DType::bf16 ? a_in : b_in) = &wide;
  }
  cuda::GemmArgs args{};
  args.m = N;
  args.n = M;
  args.k = K;
  args.batch = 1;
  args.alpha = alpha;
  args.beta = beta;
  args.a = {b_in->data, b_in->dtype, transpose_b, b.cols(), 0};
  args.b = {a_in->data, a_in->dtype, transpose_a, a.cols(), 0};
  args.c = {out.data, out.dtype, N, 0};
  gemm_->gemm(args, stream_);
}

}  // namespace ft
