// The instruction sets the CPU kernels dispatch to at run time. The kernels are
// built for FT_MARCH (x86-64-v3: AVX2 + FMA); the hot loops also have an
// AVX-512 version (FT_AVX512_VERSIONS below) and the bf16 tiles a vdpbf16ps
// one, picked once per process from what the CPU has, capped by
// ONEDNN_MAX_CPU_ISA exactly as oneDNN caps its own kernels: one variable
// runs a whole step on a lower ISA (ONEDNN_MAX_CPU_ISA=AVX2 is the AVX2
// machine's code on an AVX-512 one), for tests and benchmarks. Without
// oneDNN in the build there is no cap.
#pragma once

namespace ft::cpu {

// The x86-64-v4 versions (AVX-512 F, BW, CD, DQ, VL) run: the CPU has them
// and the cap (if any) is avx512_core or above.
bool avx512_enabled();

// The bf16 tiles use vdpbf16ps: the CPU has AVX512-BF16 and the cap is
// avx512_core_bf16 or above.
bool avx512_bf16_enabled();

// The bf16 tiles use AMX (amx_tile.h): the CPU has AMX-TILE and AMX-BF16, the
// OS saves their state and lets this process use it (Linux 5.16 and later),
// and the cap is avx512_core_amx or above.
bool amx_bf16_enabled();

// FT_BF16_TILES=amx-emulated: the bf16 tiles run the AMX kernel on its
// modelled instructions whatever the CPU has, for tests (any other value is
// an error).
bool amx_emulated();

// The ISA the bf16 tiles run on, for the op profile: "AMX", "AMX
// (emulated)", "AVX512-BF16", or the build's (the portable loop).
const char* bf16_tiles_isa();

// Which version FT_AVX512_VERSIONS functions run, for the op profile.
const char* avx512_versions_isa();

// For tests: while on, avx512_enabled() is false, so one process can
// compare the two versions of each function bit for bit (the bf16 tiles,
// which round differently, keep their choice). Set it between ops.
void set_baseline_versions_only(bool on);

}  // namespace ft::cpu

// FT_AVX512_VERSIONS(ret, name, (params), (args)) { body } defines name,
// which runs body compiled for x86-64-v4 where avx512_enabled() and as built
// (x86-64-v3) elsewhere: the body is always-inlined into one function per
// ISA, and the inline helpers it calls are compiled into each. Both versions
// do the same IEEE operations in the same order (no reduction whose grouping
// follows the vector width), so they give the same bits. Put it at namespace
// scope in a .cpp; name has internal linkage.
#define FT_AVX512_VERSIONS(ret, name, params, args)                                      \
  [[gnu::always_inline]] static inline ret name##_body params;                           \
  [[gnu::target("arch=x86-64-v4")]] static ret name##_avx512 params {                    \
    return name##_body args;                                                             \
  }                                                                                      \
  static ret name##_built params { return name##_body args; }                            \
  [[maybe_unused]] static ret name params {                                              \
    return ::ft::cpu::avx512_enabled() ? name##_avx512 args : name##_built args;         \
  }                                                                                      \
  [[gnu::always_inline]] static inline ret name##_body params
