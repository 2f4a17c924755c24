// Tensor-core tile product: c[M,N] = a[M,K] @ b[K,N] + c0, one warp per 16x16
// output tile. A row_major operand is stored [rows, cols]; a col_major one is
// stored transposed. M, N, K are multiples of 16.
#pragma once
#include <type_traits>

#include "kernels/launch.h"

template <class T, class LayoutA, class LayoutB>
__global__ void __launch_bounds__(32) wmma_matmul_kernel(const T* a, const T* b, const float* c0, float* c, int M,
                                                         int N, int K) {
  using namespace nvcuda;
  constexpr bool a_rows = std::is_same_v<LayoutA, wmma::row_major>;
  constexpr bool b_rows = std::is_same_v<LayoutB, wmma::row_major>;
  int tm = blockIdx.y * 16, tn = blockIdx.x * 16;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::load_matrix_sync(acc, c0 + tm * N + tn, N, wmma::mem_row_major);
  for (int k = 0; k < K; k += 16) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LayoutA> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LayoutB> fb;
    wmma::load_matrix_sync(fa, a_rows ? a + tm * K + k : a + k * M + tm, a_rows ? K : M);
    wmma::load_matrix_sync(fb, b_rows ? b + k * N + tn : b + tn * K + k, b_rows ? N : K);
    wmma::mma_sync(acc, fa, fb, acc);
  }
  wmma::store_matrix_sync(c + tm * N + tn, acc, N, wmma::mem_row_major);
}
