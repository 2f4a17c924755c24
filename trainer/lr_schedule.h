// Learning-rate schedules with linear warmup, as transformers'
// get_{constant,linear,cosine}_schedule_with_warmup (the floor as its
// cosine_with_min_lr), but for one step of warmup: step s < W runs at
// lr (s + 1) / W (llm.c's), where transformers' Trainer runs its first step
// at lr 0 and reaches lr at step W. From W on they are the same
// (tests/test_adamw.cpp against scripts/make_lr_schedule_fixture.py).
#pragma once
#include <cstdint>

namespace ft {

enum class Schedule { constant, linear, cosine };  // the config's schedule: (spelled in train_config.h)

struct LrSchedule {
  Schedule kind = Schedule::cosine;
  double peak_lr = 2e-4;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_lr_ratio = 0.0;  // decay ends at peak_lr * min_lr_ratio

  // Learning rate of optimizer step `step` (0-based, the step about to run).
  double lr_at(int64_t step) const;
};

}  // namespace ft
