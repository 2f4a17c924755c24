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

// c[M, N] += A @ B on the CPU's AMX-BF16: call only where amx_bf16_enabled().
void amx_tile_gemm(float* c, int64_t ldc, const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb, int64_t M,
                   int64_t N, int64_t pairs);

// The same kernel on the modelled tile instructions: TDPBF16PS's products
// summed as its definition orders them (the even element of a pair, then the
// odd), rounding to nearest even after each, denormal inputs read as zero and
// denormal sums flushed. A tile shape or state the hardware would fault on
// throws ft::Error.
void amx_tile_gemm_emulated(float* c, int64_t ldc, const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb,
                            int64_t M, int64_t N, int64_t pairs);

}  // namespace ft::cpu
