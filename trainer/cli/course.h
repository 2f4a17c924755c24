// `finetune course`: the figures of the "Generative AI with Large Language
// Models" course's memory and LoRA lectures, computed by this trainer's own
// code: the dtype conversions (kernels/dtype.h), the memory planner
// (plan.h) over model configs from configs/, the LoRA adapter shapes
// (model/lora_linear.h) and the parameter count of a model built from
// config.json alone on the meta device (no weights read).
#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "trainer/parameter_count.h"
#include "trainer/plan.h"

namespace ft {

// One value in each format: pi stored and read back, and the lowest and
// highest finite values the format holds.
struct DTypeFigures {
  const char* name;  // "FP32", "FP16", "BF16", "INT8"
  DType dtype;
  size_t bytes = 0;
  double pi = 0.0, lowest = 0.0, highest = 0.0;
};
std::vector<DTypeFigures> dtype_figures();

// The course's rule of thumb for full fine-tuning in FP32 with Adam, in bytes
// per parameter.
struct MemoryRule {
  size_t weights = 0, adam_states = 0, gradients = 0, activations = 0;
  size_t store() const { return weights; }
  size_t train() const { return weights + adam_states + gradients + activations; }
};
MemoryRule course_memory_rule();

// A model's weights in one format as the planner holds them.
struct WeightFormat {
  int bits = 0;    // the course's label: 32, 16, 8, 4
  StepPlan plan;   // its weight fields
  size_t bytes() const;
};

struct CourseFigures {
  std::vector<DTypeFigures> dtypes;
  MemoryRule rule;
  // A ~1B model (configs/pythia-1b): its parameters, and one planned step of
  // full fine-tuning in FP32 and of LoRA over an INT8 base.
  ParameterCount one_b_params;
  StepPlan one_b_full_fp32, one_b_lora_int8;
  // A 20B model (configs/gpt-neox-20b) at 32 / 16 / 8 / 4 bits.
  ParameterCount twenty_b_params;
  std::vector<WeightFormat> twenty_b;
  // LoRA at r=8 on a 512 x 64 weight; FLAN-T5-base, r=32 on q and v.
  int64_t lora_512x64_trainable = 0, lora_512x64_base = 0;
  ParameterCount flan_t5_base;
};

// Everything `finetune course` prints, from the config.json files under
// configs_dir (pythia-1b/, gpt-neox-20b/, flan-t5-base/).
CourseFigures course_figures(const std::string& configs_dir);

void print_course(const CourseFigures& figures, const std::string& configs_dir, std::ostream& out);

}  // namespace ft
