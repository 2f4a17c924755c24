#include "trainer/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "kernels/error.h"

namespace ft {

double LrSchedule::lr_at(int64_t step) const {
  if (step < warmup_steps) return peak_lr * double(step + 1) / double(warmup_steps);
  if (kind == "constant") return peak_lr;
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup_steps);
  const double progress = std::clamp(double(step - warmup_steps) / double(decay_steps), 0.0, 1.0);
  double decay = 0.0;
  if (kind == "linear") {
    decay = 1.0 - progress;
  } else if (kind == "cosine") {
    decay = 0.5 * (1.0 + std::cos(M_PI * progress));
  } else {
    fail("unknown learning-rate schedule \"", kind, "\" (expected constant, linear or cosine)");
  }
  return peak_lr * (min_lr_ratio + (1.0 - min_lr_ratio) * decay);
}

}  // namespace ft
