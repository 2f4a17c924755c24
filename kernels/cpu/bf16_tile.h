// Small bf16 GEMMs with f32 accumulation for the CPU attention's tiles: on
// AMX's tiles (amx_tile.h) where the CPU has AMX-BF16, else on AVX512-BF16's
// dot-product instruction (vdpbf16ps), chosen at run time, and a portable
// loop elsewhere. Operands hold bf16 in
// pairs along the summed dimension k, one pair per uint32 (the even k in the
// low half), as vdpbf16ps reads them:
//   a, rows paired:    a[m * lda + p] = (A[m, 2p], A[m, 2p + 1]), which is a
//                      row-major bf16 matrix of even row length read as uint32;
//   b, columns paired: b[p * ldb + n] = (B[2p, n], B[2p + 1, n]).
// Each product of two bf16 is exact in f32, so only the f32 sums round.
#pragma once
#include <cstdint>

#include "kernels/dtype.h"

namespace ft::cpu {


// The tiles' state on this thread for the bf16_tile_gemm calls made while it
// lives: on AMX it loads the tile configuration once and releases it at the
// end (elsewhere it does nothing). Hold one around each run of calls, with
// no other library's code in between (oneDNN configures the tiles its own
// way).
class Bf16TileScope {
 public:
  Bf16TileScope();
  ~Bf16TileScope();
  Bf16TileScope(const Bf16TileScope&) = delete;
  Bf16TileScope& operator=(const Bf16TileScope&) = delete;
};

// c[M, N] += A[M, 2 * pairs] @ B[2 * pairs, N], c row-major f32 (ldc), a and
// b paired as above (lda, ldb in pairs), inside a Bf16TileScope. Every row of
// c is summed over k in the same order by the same instructions whatever M
// and the other rows are, so a row's result does not depend on the rows
// computed with it.
void bf16_tile_gemm(float* c, int64_t ldc, const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb,
                    int64_t M, int64_t N, int64_t pairs);
// The portable loop bf16_tile_gemm runs without AVX512-BF16.
void bf16_tile_gemm_portable(float* c, int64_t ldc, const uint32_t* a, int64_t lda, const uint32_t* b,
                             int64_t ldb, int64_t M, int64_t N, int64_t pairs);

// dst[p * ld_dst + n] = (src[2p, n], src[2p + 1, n]) for p < ceil(rows / 2),
// n < cols: rows of src (bf16 stored rows-paired, ld_src pairs apart) paired
// down the columns; a missing last odd row reads as zero.
void pair_columns(uint32_t* dst, int64_t ld_dst, const uint32_t* src, int64_t ld_src, int64_t rows, int64_t cols);

// dst[p * ld_dst + r] = src[r * ld_src + p]: a rows-paired [rows, 2 * pairs]
// matrix as its transpose with columns paired.
void transpose_pairs(uint32_t* dst, int64_t ld_dst, const uint32_t* src, int64_t ld_src, int64_t rows,
                     int64_t pairs);

// (bf16(even), bf16(odd)) in one pair, each rounded to nearest even
// (inline: the rounding loops over a tile vectorise).
inline uint32_t bf16_pair(float even, float odd) {
  return uint32_t(f32_to_bf16(even)) | uint32_t(f32_to_bf16(odd)) << 16;
}

}  // namespace ft::cpu
