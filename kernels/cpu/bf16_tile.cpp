// bf16 tile GEMMs (see bf16_tile.h). The kernels are built for x86-64-v3;
// the AVX512-BF16 block is compiled for its ISA alone (a target attribute)
// and runs only where the CPU reports it, AMX's likewise (amx_tile.h), picked
// once per process (kernels/cpu/isa.h), so one binary serves every CPU.
#include "kernels/cpu/bf16_tile.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "kernels/cpu/amx_tile.h"
#include "kernels/cpu/isa.h"

namespace ft::cpu {
namespace {

constexpr int64_t kNativeRows = 8;  // rows of c summed together by native_block (its 8 x 2 named sums)
constexpr int64_t kBlockRows = 4;   // and by portable_block

// The Rows rows of a's block at m0: rows past M repeat row m0 (computed, dropped).
template <int64_t Rows>
void block_rows(const uint32_t* rows_out[Rows], const uint32_t* a, int64_t lda, int64_t m0, int64_t M) {
  for (int64_t r = 0; r < Rows; ++r) rows_out[r] = a + (m0 + (m0 + r < M ? r : 0)) * lda;
}

#define FT_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

// acc += the pair products of a and b, lane by lane: vdpbf16ps written as
// assembly, as clang 16 crashes optimising its intrinsic's bf16 vectors.
FT_AVX512_BF16 inline void dot_pairs(__m512& acc, __m512i a, __m512i b) {
  asm("vdpbf16ps %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
}

// The lanes of a 16-wide half holding one of `cols` columns.
__mmask16 column_mask(int64_t cols) { return cols >= 16 ? __mmask16(0xffff) : cols <= 0 ? 0 : __mmask16((1u << cols) - 1); }

// c[rows, cols] += a rows x b [., 32] over `pairs` pairs, rows <= 8, cols <=
// 32: the 8 x 32 sums stay in sixteen registers, enough independent chains
// to hide vdpbf16ps's latency (scripts/bench_cpu_gemm's bf16 attention at
// 4 x 256, 2026-11-28, AVX512-BF16 EPYC: 4 rows 184-189 GFLOP/s forward and
// 195-201 backward, 8 rows 201-210 and 205-216); masked loads read only the
// `cols` columns of b.
FT_AVX512_BF16 void native_block(float* c, int64_t ldc, const uint32_t* const a_rows[kNativeRows], const uint32_t* b,
                                 int64_t ldb, int64_t pairs, int64_t rows, int64_t cols) {
  const __mmask16 masks[2] = {column_mask(cols), column_mask(cols - 16)};
  // Named sums, not an array: GCC keeps an array that inline assembly
  // updates on the stack, a load and a store around every vdpbf16ps.
  __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00;
  __m512 c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512i b0 = _mm512_maskz_loadu_epi32(masks[0], b + p * ldb);
    const __m512i b1 = _mm512_maskz_loadu_epi32(masks[1], b + p * ldb + 16);
    const __m512i x0 = _mm512_set1_epi32(int(a_rows[0][p])), x1 = _mm512_set1_epi32(int(a_rows[1][p]));
    const __m512i x2 = _mm512_set1_epi32(int(a_rows[2][p])), x3 = _mm512_set1_epi32(int(a_rows[3][p]));
    dot_pairs(c00, x0, b0), dot_pairs(c01, x0, b1), dot_pairs(c10, x1, b0), dot_pairs(c11, x1, b1);
    dot_pairs(c20, x2, b0), dot_pairs(c21, x2, b1), dot_pairs(c30, x3, b0), dot_pairs(c31, x3, b1);
    const __m512i x4 = _mm512_set1_epi32(int(a_rows[4][p])), x5 = _mm512_set1_epi32(int(a_rows[5][p]));
    const __m512i x6 = _mm512_set1_epi32(int(a_rows[6][p])), x7 = _mm512_set1_epi32(int(a_rows[7][p]));
    dot_pairs(c40, x4, b0), dot_pairs(c41, x4, b1), dot_pairs(c50, x5, b0), dot_pairs(c51, x5, b1);
    dot_pairs(c60, x6, b0), dot_pairs(c61, x6, b1), dot_pairs(c70, x7, b0), dot_pairs(c71, x7, b1);
  }
  const __m512 acc[kNativeRows][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31},
                                      {c40, c41}, {c50, c51}, {c60, c61}, {c70, c71}};
  for (int64_t r = 0; r < rows; ++r)
    for (int half = 0; half < 2; ++half) {
      float* out = c + r * ldc + 16 * half;
      _mm512_mask_storeu_ps(out, masks[half], _mm512_add_ps(_mm512_maskz_loadu_ps(masks[half], out), acc[r][half]));
    }
}

FT_AVX512_BF16 void native_tile(float* c, int64_t ldc, const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb,
                                int64_t M, int64_t N, int64_t pairs) {
  for (int64_t n0 = 0; n0 < N; n0 += 32)
    for (int64_t m0 = 0; m0 < M; m0 += kNativeRows) {
      const uint32_t* a_rows[kNativeRows];
      block_rows<kNativeRows>(a_rows, a, lda, m0, M);
      native_block(c + m0 * ldc + n0, ldc, a_rows, b + n0, ldb, pairs, std::min(kNativeRows, M - m0),
                   std::min<int64_t>(32, N - n0));
    }
}

// Sixteen f32 or u32 lanes (GCC's vector extension: two AVX registers here).
typedef float Floats16 __attribute__((vector_size(64)));
typedef uint32_t Pairs16 __attribute__((vector_size(64)));

// native_block's sums in portable code, 16 columns wide; b has all 16
// columns readable. The odd half of each pair is added first, then the even.
void portable_block(float* c, int64_t ldc, const uint32_t* const a_rows[kBlockRows], const uint32_t* b, int64_t ldb,
                    int64_t pairs, int64_t rows, int64_t cols) {
  const Pairs16 high = Pairs16{} + 0xffff0000u;
  Floats16 acc[kBlockRows] = {};
  for (int64_t p = 0; p < pairs; ++p) {
    Pairs16 bits;
    std::memcpy(&bits, b + p * ldb, sizeof(bits));
    const Pairs16 even_bits = bits << 16, odd_bits = bits & high;
    Floats16 b_even, b_odd;  // the bits as floats
    std::memcpy(&b_even, &even_bits, sizeof(b_even));
    std::memcpy(&b_odd, &odd_bits, sizeof(b_odd));
    for (int64_t r = 0; r < kBlockRows; ++r) {
      const uint32_t x = a_rows[r][p];
      acc[r] += bf16_to_f32(uint16_t(x >> 16)) * b_odd;
      acc[r] += bf16_to_f32(uint16_t(x)) * b_even;
    }
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) c[r * ldc + j] += acc[r][j];
}

// The AMX the bf16 tiles run on, if any.
std::optional<AmxTiles> amx_tiles() {
  if (amx_emulated()) return AmxTiles::emulated;
  if (amx_bf16_enabled()) return AmxTiles::hardware;
  return std::nullopt;
}

}  // namespace

Bf16TileScope::Bf16TileScope() {
  if (const auto tiles = amx_tiles()) amx_configure(*tiles);
}

Bf16TileScope::~Bf16TileScope() {
  if (const auto tiles = amx_tiles()) amx_release(*tiles);
}

void bf16_tile_gemm(float* c, int64_t ldc, const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb, int64_t M,
                    int64_t N, int64_t pairs) {
  if (const auto tiles = amx_tiles()) return amx_tile_gemm(*tiles, c, ldc, a, lda, b, ldb, M, N, pairs);
  if (avx512_bf16_enabled()) return native_tile(c, ldc, a, lda, b, ldb, M, N, pairs);
  bf16_tile_gemm_portable(c, ldc, a, lda, b, ldb, M, N, pairs);
}

// b's last columns, when fewer than 16, are copied into a zero-padded strip.
void bf16_tile_gemm_portable(float* c, int64_t ldc, const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb,
                             int64_t M, int64_t N, int64_t pairs) {
  thread_local std::vector<uint32_t> strip;  // only grows
  for (int64_t n0 = 0; n0 < N; n0 += 16) {
    const int64_t cols = std::min<int64_t>(16, N - n0);
    const uint32_t* b_block = b + n0;
    int64_t ld_block = ldb;
    if (cols < 16) {
      if (int64_t(strip.size()) < pairs * 16) strip.resize(size_t(pairs * 16));
      for (int64_t p = 0; p < pairs; ++p)
        for (int64_t j = 0; j < 16; ++j) strip[size_t(p * 16 + j)] = j < cols ? b[p * ldb + n0 + j] : 0u;
      b_block = strip.data(), ld_block = 16;
    }
    for (int64_t m0 = 0; m0 < M; m0 += kBlockRows) {
      const uint32_t* a_rows[kBlockRows];
      block_rows<kBlockRows>(a_rows, a, lda, m0, M);
      portable_block(c + m0 * ldc + n0, ldc, a_rows, b_block, ld_block, pairs, std::min(kBlockRows, M - m0), cols);
    }
  }
}

void pair_columns(uint32_t* dst, int64_t ld_dst, const uint32_t* src, int64_t ld_src, int64_t rows, int64_t cols) {
  for (int64_t p = 0; 2 * p < rows; ++p) {
    const uint32_t* even = src + 2 * p * ld_src;
    const uint32_t* odd = 2 * p + 1 < rows ? even + ld_src : nullptr;
    for (int64_t n = 0; n < cols; ++n) {
      const int shift = 16 * int(n % 2);  // column n is the low half of pair n / 2 when even
      const uint32_t low = (even[n / 2] >> shift) & 0xffffu, high = odd ? (odd[n / 2] >> shift) & 0xffffu : 0u;
      dst[p * ld_dst + n] = low | high << 16;
    }
  }
}

// In blocks of 16 rows: each block writes whole 64-byte runs of dst, and
// its 16 source rows stay in L1 while their pairs go by.
void transpose_pairs(uint32_t* dst, int64_t ld_dst, const uint32_t* src, int64_t ld_src, int64_t rows, int64_t pairs) {
  constexpr int64_t kRowBlock = 16;
  for (int64_t r0 = 0; r0 < rows; r0 += kRowBlock) {
    const int64_t r1 = std::min(rows, r0 + kRowBlock);
    for (int64_t p = 0; p < pairs; ++p)
      for (int64_t r = r0; r < r1; ++r) dst[p * ld_dst + r] = src[r * ld_src + p];
  }
}

}  // namespace ft::cpu
