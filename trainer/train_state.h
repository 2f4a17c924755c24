// The resumable training state: every trainable parameter (its f32 master),
// both AdamW moments, the optimizer step and the data loader's position. One
// safetensors file written atomically (temp file + rename), so a crash at any
// moment leaves either the previous state or the new one, never a torn file.
// Dropout masks derive from (seed, step), so no RNG state needs saving.
#pragma once
#include <string>

#include "trainer/data.h"
#include "trainer/optimizer.h"

namespace ft {

struct TrainProgress {
  int64_t step = 0;  // optimizer steps done
  DataPosition data_position;
};

void save_train_state(const std::string& path, AdamW& optimizer, const TrainProgress& progress);
// Restores parameters, moments and the step count into optimizer (whose
// parameters must match the saved ones by name and shape) and returns the
// progress. Errors name the file and the mismatching tensor.
TrainProgress load_train_state(const std::string& path, AdamW& optimizer);

}  // namespace ft
