#include "trainer/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace ft {

double LrSchedule::lr_at(int64_t step) const {
  if (step < warmup_steps) return peak_lr * double(step + 1) / double(warmup_steps);
  if (kind == Schedule::constant) return peak_lr;
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup_steps);
  const double progress = std::clamp(double(step - warmup_steps) / double(decay_steps), 0.0, 1.0);
  const double decay = kind == Schedule::linear ? 1.0 - progress : 0.5 * (1.0 + std::cos(M_PI * progress));
  return peak_lr * (min_lr_ratio + (1.0 - min_lr_ratio) * decay);
}

}  // namespace ft
