// Which GEMM implementation a CpuBackend uses (cpu_backend.h's CpuGemm).
#include <cstdlib>
#include <string>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/onednn_gemm.h"
#include "kernels/error.h"

namespace ft {

CpuGemm default_cpu_gemm() {
  const char* chosen = std::getenv("FT_CPU_GEMM");
  if (!chosen || !*chosen) return onednn_built() ? CpuGemm::onednn : CpuGemm::reference;
  const std::string name = chosen;
  if (name == "reference") return CpuGemm::reference;
  FT_CHECK(name == "onednn", "FT_CPU_GEMM: expected reference or onednn, got '", name, "'");
  return CpuGemm::onednn;
}

CpuBackend::CpuBackend(Allocator& allocator, CpuGemm gemm) : allocator_(allocator) {
  cpu::amx_emulated();  // reads FT_BF16_TILES here: a bad value fails now, not inside the attention's parallel loop
  if (gemm == CpuGemm::reference) return;
  FT_CHECK(onednn_built(),
           "CPU GEMM 'onednn' asked for, but this build has no oneDNN (install libdnnl-dev and rebuild)");
  onednn_ = std::make_unique<OnednnGemm>();
}

CpuBackend::~CpuBackend() = default;

CpuGemm CpuBackend::gemm() const { return onednn_ ? CpuGemm::onednn : CpuGemm::reference; }

}  // namespace ft
