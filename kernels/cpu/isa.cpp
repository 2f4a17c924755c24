#include "kernels/cpu/isa.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kernels/error.h"
#include "kernels/op_profile.h"

#ifdef FT_HAVE_ONEDNN
#include <dnnl.hpp>
#endif

namespace ft::cpu {
namespace {

enum class Isa { avx512_core, avx512_core_bf16, avx512_core_amx };

// Whether the cap lets oneDNN use `isa`: its effective ISA is the CPU's,
// capped by ONEDNN_MAX_CPU_ISA, and its values are bit sets, each including
// the ISAs below it.
bool cap_allows([[maybe_unused]] Isa isa) {
#ifdef FT_HAVE_ONEDNN
  const auto bits = unsigned(isa == Isa::avx512_core        ? dnnl::cpu_isa::avx512_core
                             : isa == Isa::avx512_core_bf16 ? dnnl::cpu_isa::avx512_core_bf16
                                                            : dnnl::cpu_isa::avx512_core_amx);
  return (unsigned(dnnl::get_effective_cpu_isa()) & bits) == bits;
#else
  return true;
#endif
}

bool detect_avx512() {
  __builtin_cpu_init();  // may run before the constructors (a test's static initialiser)
  // x86-64-v4's features one by one (clang 16 takes no level names here).
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl") && cap_allows(Isa::avx512_core);
}

// AMX-BF16 and AMX-TILE (CPUID leaf 7: EDX bits 22 and 24), their state
// enabled by the OS (XCR0 bits 17 and 18), and this process allowed to use
// the tile data: Linux grants it on request (arch_prctl ARCH_REQ_XCOMP_PERM
// of feature 18, as oneDNN asks too), and a tile instruction without it
// faults.
bool detect_amx_bf16() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) || !(edx >> 22 & 1u) || !(edx >> 24 & 1u)) return false;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx >> 27 & 1u)) return false;  // OSXSAVE: xgetbv works
  uint32_t xcr0_low = 0, xcr0_high = 0;
  asm volatile("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  constexpr uint32_t kTileState = 3u << 17;  // XTILECFG, XTILEDATA
  if ((xcr0_low & kTileState) != kTileState) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtileData = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtileData) != 0) return false;
  return detect_avx512() && cap_allows(Isa::avx512_core_amx);
}

std::atomic<bool> baseline_only{false};

}  // namespace

bool avx512_enabled() {
  static const bool enabled = detect_avx512();
  return enabled && !baseline_only.load(std::memory_order_relaxed);
}

bool avx512_bf16_enabled() {
  static const bool enabled =
      detect_avx512() && __builtin_cpu_supports("avx512bf16") && cap_allows(Isa::avx512_core_bf16);
  return enabled;
}

bool amx_bf16_enabled() {
  static const bool enabled = detect_amx_bf16();
  return enabled;
}

bool amx_emulated() {
  static const bool emulated = [] {
    const char* chosen = std::getenv("FT_BF16_TILES");
    if (!chosen || !*chosen) return false;
    FT_CHECK(std::string(chosen) == "amx-emulated", "FT_BF16_TILES: expected amx-emulated or unset, got '", chosen,
             "'");
    return true;
  }();
  return emulated;
}

const char* bf16_tiles_isa() {
  if (amx_emulated()) return "AMX (emulated)";
  if (amx_bf16_enabled()) return "AMX";
  return avx512_bf16_enabled() ? "AVX512-BF16" : build_isa();
}

void set_baseline_versions_only(bool on) { baseline_only.store(on, std::memory_order_relaxed); }

const char* avx512_versions_isa() { return avx512_enabled() ? "AVX-512 (x86-64-v4 version)" : build_isa(); }

}  // namespace ft::cpu
