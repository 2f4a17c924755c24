// Rotary position embedding, in place, in HF's rotate_half layout. cos/sin are
// computed as HF's rotary embedding does, in f32: angle = float(pos) *
// inv_freq[i] (inv_freq given by the caller), so positions in the thousands
// match HF to f32 rounding rather than drifting.
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_util.h"

namespace ft {

// direction +1 rotates by +angle (forward), -1 by -angle (the transpose, for backward).
static void rope_rotate(const HeadsView& x, const Tensor& positions, std::span<const float> inv_freq,
                        float direction) {
  Tensor rows = x.rows;
  int64_t heads = x.dim(-2), tokens = rows.rows() / heads;
  int half = int(inv_freq.size()), rotary_dim = 2 * half;
  const int32_t* pos = positions.ptr<const int32_t>();
#pragma omp parallel
  {
    std::vector<float> cos_t(half), sin_t(half), row(rotary_dim);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < tokens; ++n) {
      for (int i = 0; i < half; ++i) {
        float angle = float(pos[n]) * inv_freq[i];
        cos_t[i] = std::cos(angle);
        sin_t[i] = direction * std::sin(angle);
      }
      for (int64_t h = 0; h < heads; ++h) {
        int64_t offset = x.offset(n * heads + h);
        cpu::load_row(row.data(), rows, offset, rotary_dim);
        for (int i = 0; i < half; ++i) {
          float x1 = row[i], x2 = row[i + half];
          row[i] = x1 * cos_t[i] - x2 * sin_t[i];
          row[i + half] = x2 * cos_t[i] + x1 * sin_t[i];
        }
        cpu::store_row(rows, offset, row.data(), rotary_dim);
      }
    }
  }
}

void CpuBackend::rope_forward_impl(const HeadsView& x, const Tensor& positions, std::span<const float> inv_freq) {
  rope_rotate(x, positions, inv_freq, 1.0f);
}

void CpuBackend::rope_backward_impl(const HeadsView& dx, const Tensor& positions, std::span<const float> inv_freq) {
  rope_rotate(dx, positions, inv_freq, -1.0f);
}

}  // namespace ft
