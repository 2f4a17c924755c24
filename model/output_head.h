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

// The head's output for every row of hidden [N, C] (on the backend): host f32 [N].
std::vector<float> head_outputs(Backend& backend, const HeadParameters& head, const Tensor& hidden);

// From d(loss)/d(output) per row (host, [N]): dhidden [N, C] += dout weight,
// and when they train weight.grad += dout^T hidden, bias.grad += sum(dout).
void head_backward(Backend& backend, const HeadParameters& head, const Tensor& hidden, const std::vector<float>& dout,
                   Tensor& dhidden);

}  // namespace ft
