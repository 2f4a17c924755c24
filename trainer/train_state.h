// The resumable training state: every trainable parameter (its f32 master),
// both AdamW moments, the optimizer step, the data loader's position, what
// the run belongs to (RunIdentity) and a checksum of all of it. One
// safetensors file written atomically (atomic_file.h), so a crash or a failed
// write at any moment leaves either the previous state or the new one, never
// a torn file. Dropout masks derive from (seed, step), so no RNG state needs saving.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "model/safetensors.h"
#include "trainer/data/data.h"
#include "trainer/optimizer.h"

namespace ft {

// One thing a checkpoint belongs to (run_identity.h builds them for a run).
struct IdentityField {
  std::string key;    // stored as metadata "identity.<key>"
  std::string what;   // for messages: "the train data (data/train.jsonl)"
  std::string value;  // compared exactly: "5210 bytes, checksum 0123456789abcdef"
  bool is_data = false;  // a difference may be accepted with --allow-data-change
};
using RunIdentity = std::vector<IdentityField>;

struct TrainProgress {
  int64_t step = 0;  // optimizer steps done
  DataPosition data_position;
  std::vector<std::string> data_changes;  // accepted by allow_data_change, for a warning
  // The objective's own state between steps, as JSON text ("" = none):
  // PPO's KL coefficient controller.
  std::string objective_state;
};

void save_train_state(const std::string& path, AdamW& optimizer, const TrainProgress& progress,
                      const RunIdentity& identity);
// The optimizer's state as the file names it (param., adam_m., adam_v. +
// the parameter's name), f32 host tensors.
std::vector<std::pair<std::string, Tensor>> train_state_tensors(AdamW& optimizer, Allocator& host);
// The file from such tensors (pipeline parallel: every stage's, gathered on
// rank 0) and the optimizer steps taken.
void save_train_state(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      int64_t optimizer_steps, const TrainProgress& progress, const RunIdentity& identity);
// Verifies the checksum (a flipped byte anywhere is an Error naming the file),
// then that the state belongs to identity (an Error listing every difference;
// differences in data fields only are accepted when allow_data_change), then
// restores parameters, moments and the step count into optimizer (whose
// parameters must match the saved ones by name and shape) and returns the
// progress. Errors name the file and the mismatching tensor. The file holds
// job_trainable_tensors parameters (pipeline parallel: every stage's, of
// which optimizer holds one stage's); 0: the optimizer's.
TrainProgress load_train_state(const std::string& path, AdamW& optimizer, const RunIdentity& identity,
                               bool allow_data_change = false, size_t job_trainable_tensors = 0);

}  // namespace ft
