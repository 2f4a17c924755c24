// Learning-rate schedules with linear warmup, as transformers'
// get_{constant,linear,cosine}_schedule_with_warmup (plus an optional floor).
#pragma once
#include <cstdint>
#include <string>

namespace ft {

struct LrSchedule {
  std::string kind = "cosine";  // constant | linear | cosine
  double peak_lr = 2e-4;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_lr_ratio = 0.0;  // decay ends at peak_lr * min_lr_ratio

  // Learning rate of optimizer step `step` (0-based, the step about to run).
  double lr_at(int64_t step) const;
};

}  // namespace ft
