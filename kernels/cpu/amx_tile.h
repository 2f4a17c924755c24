// The bf16 tile GEMM (bf16_tile.h's contract and operand layout) on AMX's
// tile registers: TDPBF16PS multiplies a 16 x 16-pair block of A by a 16-pair
// x 16 block of B into a 16 x 16 f32 block of c, so the paired operands load
// into tiles as they are. The kernel is written once over its tile
// instructions; it runs either on the CPU's (where kernels/cpu/isa.h finds
// AMX usable) or on a C++ model of them that follows Intel's definitions and
// checks every tile shape, so the kernel's blocking, padding and strides are
// tested on CPUs without AMX (FT_BF16_TILES=amx-emulated).
#pragma once
#include <cstdint>

namespace ft::cpu {

// Where the tile instructions run: the CPU's AMX-BF16 (only where
// amx_bf16_enabled()), or the modelled ones. The model sums TDPBF16PS's
// products as its definition orders them (the even element of a pair, then
// the odd), rounding to nearest even after each, reads denormal inputs as
// zero and flushes denormal sums; a tile shape or state the hardware would
// fault on throws ft::Error.
enum class AmxTiles { hardware, emulated };

// LDTILECFG of the kernel's three tiles on this thread, and TILERELEASE. A
// caller loads the configuration once around a run of amx_tile_gemm calls
// (Bf16TileScope, bf16_tile.h), not once a call.
void amx_configure(AmxTiles tiles);
void amx_release(AmxTiles tiles);

// c[M, N] += A @ B, with this thread's tiles configured by amx_configure.
void amx_tile_gemm(AmxTiles tiles, float* c, int64_t ldc, const uint32_t* a, int64_t lda, const uint32_t* b,
                   int64_t ldb, int64_t M, int64_t N, int64_t pairs);

}  // namespace ft::cpu
