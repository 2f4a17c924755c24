// Parameter counts as PEFT's print_trainable_parameters() reports them, for
// a training run and for `finetune course`.
#pragma once
#include <cstdint>
#include <string>

#include "model/causal_lm.h"

namespace ft {

struct ParameterCount {
  int64_t trainable = 0;
  int64_t all = 0;  // base weights and adapters
};

// Every base weight (an NF4 weight by its [out, in] elements, not its packed
// bytes, as PEFT doubles a bitsandbytes Params4bit) and adapter; trainable:
// those with a gradient buffer.
ParameterCount count_parameters(LanguageModel& model);

// PEFT's line, "trainable params: {:,} || all params: {:,} || trainable%: {:.4f}".
std::string trainable_parameters_line(const ParameterCount& count);

// 3538944 -> "3,538,944".
std::string with_commas(int64_t value);

}  // namespace ft
