// What a run's checkpoints belong to, recorded in every training state and
// compared on --resume (train_state.h): the base model (its config.json, the
// names, dtypes and shapes of its tensors, how it is held, and the weights'
// bytes as hashed while they loaded: LanguageModel::base_fingerprint), the
// adapter config, the tokenizer file and the data files (size and checksum
// of each) and the order they are drawn in.
#pragma once
#include "model/causal_lm.h"
#include "trainer/train_config.h"
#include "trainer/train_state.h"

namespace ft {

// model: the run's model, built from config and loaded (its LoRA options have the
// architecture's default targets filled in). base_weights: the loaded weights'
// fingerprint, the whole model's (model.base_fingerprint(), or every pipeline
// stage's: staged_base_fingerprint); "" for a random init.
RunIdentity run_identity(const TrainConfig& config, const LanguageModel& model, const std::string& base_weights);

}  // namespace ft
