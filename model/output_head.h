// A one-output linear head over the final hidden states, beside (or instead
// of) the LM head: a reward model's score -- transformers'
// *ForSequenceClassification `score` with num_labels 1, no bias -- or PPO's
// value head -- trl's ValueHead `v_head.summary`, with a bias. Its
// parameters live among the model's (LanguageModel::output_head()) under
// those names, so a *ForSequenceClassification checkpoint's score loads as a
// base weight would, and they train as PEFT's modules_to_save do.
#pragma once
#include <vector>

#include "kernels/backend.h"
#include "model/parameter.h"

namespace ft {

constexpr const char* kScoreWeightName = "score.weight";
constexpr const char* kValueWeightName = "v_head.summary.weight";
constexpr const char* kValueBiasName = "v_head.summary.bias";

struct HeadParameters {
  Parameter* weight = nullptr;  // [1, C], the weight dtype
  Parameter* bias = nullptr;    // [1] or null
  bool defined() const { return weight != nullptr; }
};

// Dropout on the head's input, as trl's ValueHead applies nn.Dropout
// (summary_dropout_prob) to the hidden states in training: p > 0 reads
// dropout(hidden) with the dropout op's mask drawn from seed; a backward
// takes the forward's p and seed.
struct HeadDropout {
  float p = 0.0f;
  uint64_t seed = 0;
};

// The head's output for every row of hidden [N, C] (on the backend): host f32 [N].
std::vector<float> head_outputs(Backend& backend, const HeadParameters& head, const Tensor& hidden,
                                const HeadDropout& dropout = {});

// From d(loss)/d(output) per row (host, [N]), with x = dropout(hidden):
// dhidden [N, C] += dropout_backward(dout weight), and when they train
// weight.grad += dout^T x, bias.grad += sum(dout).
void head_backward(Backend& backend, const HeadParameters& head, const Tensor& hidden, const std::vector<float>& dout,
                   Tensor& dhidden, const HeadDropout& dropout = {});

}  // namespace ft
