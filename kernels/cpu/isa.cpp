#include "kernels/cpu/isa.h"

#include <atomic>

#include "kernels/op_profile.h"

#ifdef FT_HAVE_ONEDNN
#include <dnnl.hpp>
#endif

namespace ft::cpu {
namespace {

// Whether the cap lets oneDNN use avx512_core (bf16: avx512_core_bf16): its
// effective ISA is the CPU's, capped by ONEDNN_MAX_CPU_ISA, and its values
// are bit sets, each including the ISAs below it.
bool cap_allows([[maybe_unused]] bool bf16) {
#ifdef FT_HAVE_ONEDNN
  const auto isa = unsigned(bf16 ? dnnl::cpu_isa::avx512_core_bf16 : dnnl::cpu_isa::avx512_core);
  return (unsigned(dnnl::get_effective_cpu_isa()) & isa) == isa;
#else
  return true;
#endif
}

bool detect_avx512() {
  __builtin_cpu_init();  // may run before the constructors (a test's static initialiser)
  // x86-64-v4's features one by one (clang 16 takes no level names here).
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl") && cap_allows(false);
}

std::atomic<bool> baseline_only{false};

}  // namespace

bool avx512_enabled() {
  static const bool enabled = detect_avx512();
  return enabled && !baseline_only.load(std::memory_order_relaxed);
}

bool avx512_bf16_enabled() {
  static const bool enabled = detect_avx512() && __builtin_cpu_supports("avx512bf16") && cap_allows(true);
  return enabled;
}

void set_baseline_versions_only(bool on) { baseline_only.store(on, std::memory_order_relaxed); }

const char* avx512_versions_isa() { return avx512_enabled() ? "AVX-512 (x86-64-v4 version)" : build_isa(); }

}  // namespace ft::cpu
