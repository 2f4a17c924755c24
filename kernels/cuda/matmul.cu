// Backend::matmul on cuda::Gemm. A row-major matrix is the column-major view
// of its transpose, so the row-major out[M,N] = op(a) @ op(b) is computed as
// the column-major out^T[N,M] = op(b)^T @ op(a)^T: the operands swap places
// and keep their transpose flags, with leading dimension = row-major columns.
#include "kernels/cuda/cuda_backend.h"

namespace ft {

void CudaBackend::matmul_impl(Tensor& out, const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b,
                              float alpha, float beta) {
  const int64_t M = out.rows(), N = out.cols(), K = transpose_a ? a.rows() : a.cols();
  if (M == 0 || N == 0) return;
  // Mixed inputs (an f32 activation times a bf16 weight): widen the bf16 one
  // to f32, exactly, so the product is the f32 one the CPU backend computes.
  Tensor a_wide, b_wide;
  const Tensor* a_in = &a;
  const Tensor* b_in = &b;
  if (const auto widened = cuda::matmul_scratch(a, b)) {
    Tensor& wide = a.dtype == DType::bf16 ? a_wide : b_wide;
    const Tensor& narrow = a.dtype == DType::bf16 ? a : b;
    wide = scratch(*widened);
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
