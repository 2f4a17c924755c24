// AMX bf16 tile GEMM (see amx_tile.h). Three tile registers: tmm0 holds a
// 16 x 16 f32 block of c while tmm1 (16 rows of A, 16 pairs each) and tmm2
// (16 pairs of B, 16 columns) step down k; TDPBF16PS sums into tmm0. Blocks
// wholly inside the operands load straight from them (strides in bytes);
// blocks at an edge (M, N or pairs not a multiple of 16) are copied into
// zero-padded 16 x 16 buffers first, so every tile keeps its full shape, one
// configuration serves every call, and no load reads past an operand.
// A row of c is summed over the same k blocks by the same instructions
// whatever M and the other rows are (bf16_tile.h's promise): a padded row is
// zero and its sums are dropped.
#include "kernels/cpu/amx_tile.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/dtype.h"
#include "kernels/error.h"

namespace ft::cpu {
namespace {

constexpr int64_t kTileRows = 16;   // rows of a tile register
constexpr int64_t kTileWords = 16;  // 32-bit words in a tile row (64 bytes): pairs of A, columns of B and c
constexpr int64_t kTileRowBytes = kTileWords * 4;

// LDTILECFG's 64-byte operand: palette 1, then bytes per row and rows of
// each of the 16 tile slots (0 for the unused ones).
struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "LDTILECFG reads 64 bytes");

// tmm0 (c), tmm1 (A) and tmm2 (B), each 16 rows of 64 bytes.
TileConfig full_tiles() {
  TileConfig config;
  for (int t = 0; t < 3; ++t) config.colsb[t] = uint16_t(kTileRowBytes), config.rows[t] = uint8_t(kTileRows);
  return config;
}

#define FT_AMX __attribute__((target("amx-tile,amx-bf16")))

// The CPU's tile instructions. The intrinsics name their tile register by a
// literal number (GCC pastes it into the assembly), hence one function each.
struct HardwareTiles {
  FT_AMX static void configure(const TileConfig& config) { _tile_loadconfig(&config); }
  FT_AMX static void release() { _tile_release(); }
  FT_AMX static void load_c(const float* p, int64_t stride_bytes) { _tile_loadd(0, p, stride_bytes); }
  FT_AMX static void load_a(const uint32_t* p, int64_t stride_bytes) { _tile_loadd(1, p, stride_bytes); }
  FT_AMX static void load_b(const uint32_t* p, int64_t stride_bytes) { _tile_loadd(2, p, stride_bytes); }
  FT_AMX static void store_c(float* p, int64_t stride_bytes) { _tile_stored(0, p, stride_bytes); }
  FT_AMX static void dot_c_ab() { _tile_dpbf16ps(0, 1, 2); }
};

// The same instructions modelled on this thread's copy of the tile state,
// as Intel's SDM defines them (LDTILECFG, TILELOADD, TILESTORED, TDPBF16PS,
// TILERELEASE), with the checks that make the hardware fault.
class EmulatedTiles {
 public:
  static void configure(const TileConfig& config) {
    FT_CHECK(config.palette_id == 1 && config.start_row == 0, "emulated AMX: LDTILECFG wants palette 1, start row 0");
    for (int t = 0; t < 16; ++t) {
      const bool used = config.rows[t] != 0 || config.colsb[t] != 0;
      FT_CHECK(!used || (t < 8 && config.rows[t] >= 1 && config.rows[t] <= kTileRows && config.colsb[t] >= 1 &&
                         config.colsb[t] <= kTileRowBytes),
               "emulated AMX: LDTILECFG of tile ", t, ": ", int(config.rows[t]), " rows of ", config.colsb[t],
               " bytes (palette 1 has tmm0-7, at most 16 rows of 64 bytes, both set or both 0)");
    }
    State& s = state();
    s.config = config;
    s.configured = true;
    std::memset(s.data, 0, sizeof(s.data));
  }
  static void release() { state().configured = false; }
  static void load_c(const float* p, int64_t stride_bytes) { load(0, p, stride_bytes); }
  static void load_a(const uint32_t* p, int64_t stride_bytes) { load(1, p, stride_bytes); }
  static void load_b(const uint32_t* p, int64_t stride_bytes) { load(2, p, stride_bytes); }
  static void store_c(float* p, int64_t stride_bytes) {
    const State& s = configured_state();
    for (int r = 0; r < s.config.rows[0]; ++r)
      std::memcpy(reinterpret_cast<char*>(p) + r * stride_bytes, s.data[0][r], s.config.colsb[0]);
  }
  // tmm0[m, n] += sum over k of the pair products of tmm1[m, k] and tmm2[k, n].
  static void dot_c_ab() {
    State& s = configured_state();
    const TileConfig& cfg = s.config;
    FT_CHECK(cfg.colsb[0] % 4 == 0 && cfg.colsb[1] % 4 == 0 && cfg.colsb[2] % 4 == 0 && cfg.rows[0] == cfg.rows[1] &&
                 cfg.colsb[0] == cfg.colsb[2] && cfg.colsb[1] / 4 == cfg.rows[2],
             "emulated AMX: TDPBF16PS on tiles of mismatched shapes");
    for (int m = 0; m < cfg.rows[0]; ++m) {
      float acc[kTileWords];
      std::memcpy(acc, s.data[0][m], sizeof(acc));
      for (int k = 0; k < cfg.colsb[1] / 4; ++k)
        for (int n = 0; n < cfg.colsb[0] / 4; ++n)
          for (int half = 0; half < 2; ++half)  // the even element of each pair first
            acc[n] = flush_denormal(acc[n] + element(s.data[1][m], 2 * k + half) * element(s.data[2][k], 2 * n + half));
      std::memcpy(s.data[0][m], acc, sizeof(acc));
    }
  }

 private:
  struct State {
    TileConfig config;
    bool configured = false;
    alignas(64) uint8_t data[8][kTileRows][kTileRowBytes];
  };
  static State& state() {
    thread_local State s;
    return s;
  }
  static State& configured_state() {
    State& s = state();
    FT_CHECK(s.configured, "emulated AMX: a tile instruction before LDTILECFG or after TILERELEASE");
    return s;
  }
  // TILELOADD: the configured rows and bytes of each row, the rest zeroed.
  static void load(int t, const void* p, int64_t stride_bytes) {
    State& s = configured_state();
    std::memset(s.data[t], 0, sizeof(s.data[t]));
    for (int r = 0; r < s.config.rows[t]; ++r)
      std::memcpy(s.data[t][r], static_cast<const char*>(p) + r * stride_bytes, s.config.colsb[t]);
  }
  static float flush_denormal(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }
  // bf16 element i of a tile row, widened to f32; a denormal reads as zero.
  static float element(const uint8_t* row, int i) {
    uint16_t bits;
    std::memcpy(&bits, row + 2 * i, sizeof(bits));
    return flush_denormal(bf16_to_f32(bits));
  }
};

// A rows x cols block of src (ld words apart) into a 16 x 16 buffer, the
// rest zero.
template <typename Word>
const Word* padded_block(Word* buf, const Word* src, int64_t ld, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < kTileRows; ++r)
    for (int64_t j = 0; j < kTileWords; ++j) buf[r * kTileWords + j] = r < rows && j < cols ? src[r * ld + j] : Word(0);
  return buf;
}

template <typename Tiles>
FT_AMX void tile_gemm(float* c, int64_t ldc, const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb, int64_t M,
                      int64_t N, int64_t pairs) {
  alignas(64) float c_buf[kTileRows * kTileWords];
  alignas(64) uint32_t a_buf[kTileRows * kTileWords], b_buf[kTileRows * kTileWords];
  for (int64_t m0 = 0; m0 < M; m0 += kTileRows) {
    const int64_t rows = std::min(kTileRows, M - m0);
    for (int64_t n0 = 0; n0 < N; n0 += kTileWords) {
      const int64_t cols = std::min(kTileWords, N - n0);
      float* c_block = c + m0 * ldc + n0;
      const bool c_whole = rows == kTileRows && cols == kTileWords;
      if (c_whole)
        Tiles::load_c(c_block, ldc * 4);
      else
        Tiles::load_c(padded_block(c_buf, c_block, ldc, rows, cols), kTileRowBytes);
      for (int64_t p0 = 0; p0 < pairs; p0 += kTileWords) {
        const int64_t depth = std::min(kTileWords, pairs - p0);
        const uint32_t* a_block = a + m0 * lda + p0;
        const uint32_t* b_block = b + p0 * ldb + n0;
        if (rows == kTileRows && depth == kTileWords)
          Tiles::load_a(a_block, lda * 4);
        else
          Tiles::load_a(padded_block(a_buf, a_block, lda, rows, depth), kTileRowBytes);
        if (depth == kTileWords && cols == kTileWords)
          Tiles::load_b(b_block, ldb * 4);
        else
          Tiles::load_b(padded_block(b_buf, b_block, ldb, depth, cols), kTileRowBytes);
        Tiles::dot_c_ab();
      }
      if (c_whole) {
        Tiles::store_c(c_block, ldc * 4);
      } else {
        Tiles::store_c(c_buf, kTileRowBytes);
        for (int64_t r = 0; r < rows; ++r) std::copy_n(c_buf + r * kTileWords, cols, c_block + r * ldc);
      }
    }
  }
}

}  // namespace

void amx_configure(AmxTiles tiles) {
  if (tiles == AmxTiles::hardware)
    HardwareTiles::configure(full_tiles());
  else
    EmulatedTiles::configure(full_tiles());
}

// Back to the init state: a thread holding no tile data saves and restores
// less on a context switch, and oneDNN loads its own configuration anyway.
void amx_release(AmxTiles tiles) {
  if (tiles == AmxTiles::hardware)
    HardwareTiles::release();
  else
    EmulatedTiles::release();
}

void amx_tile_gemm(AmxTiles tiles, float* c, int64_t ldc, const uint32_t* a, int64_t lda, const uint32_t* b,
                   int64_t ldb, int64_t M, int64_t N, int64_t pairs) {
  if (tiles == AmxTiles::hardware)
    tile_gemm<HardwareTiles>(c, ldc, a, lda, b, ldb, M, N, pairs);
  else
    tile_gemm<EmulatedTiles>(c, ldc, a, lda, b, ldb, M, N, pairs);
}

}  // namespace ft::cpu
