#include "trainer/cli/course.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "kernels/meta/meta_backend.h"
#include "model/families.h"
#include "model/lora_linear.h"
#include "model/t5.h"

namespace ft {

namespace {

// The course's estimate of activations and temporaries while training, per
// parameter: the one figure of its rule that is not a storage size.
constexpr size_t kCourseActivationBytesPerParam = 8;

// A value's bits (little-endian, the format's width) read as f32 through the
// dtype's own conversion.
double decode_bits(DType dtype, uint64_t bits) {
  unsigned char buffer[8] = {};
  std::memcpy(buffer, &bits, dtype_size_bytes(dtype));
  return double(load_as_f32(buffer, dtype, 0));
}

// pi rounded to f32 (as torch.tensor(math.pi) holds it), stored in dtype and read back.
double stored_pi(DType dtype) {
  unsigned char buffer[8] = {};
  store_from_f32(buffer, dtype, 0, float(M_PI));
  return double(load_as_f32(buffer, dtype, 0));
}

// highest_bits: the largest finite bit pattern (floats: the exponent all
// ones but its last bit, as all ones is Inf and NaN; the mantissa all ones),
// and the lowest is the same with the sign bit set (two's complement INT8:
// the sign bit alone).
DTypeFigures dtype_figure(const char* name, DType dtype, uint64_t highest_bits, uint64_t lowest_bits) {
  return DTypeFigures{name, dtype, dtype_size_bytes(dtype), stored_pi(dtype), decode_bits(dtype, lowest_bits),
                      decode_bits(dtype, highest_bits)};
}

// The model a run builds from config.json, on the meta device (no values):
// its family's model (model/families.h); LoRA adapters train.
ParameterCount count_on_meta(const ModelConfig& config, const ModelOptions& options) {
  MetaAllocator meta;
  MetaBackend backend(meta, MemoryPolicy::cpu);
  std::unique_ptr<LanguageModel> model = make_language_model(config, backend, options);
  model->set_trainable([](const std::string& name) { return name.find(".lora_") != std::string::npos; });
  return count_parameters(*model);
}

ModelConfig course_model_config(const std::string& configs_dir, const char* model) {
  return read_model_config((std::filesystem::path(configs_dir) / model / "config.json").string());
}

// The planner's step for `finetune plan MODEL` with --set overrides, at
// micro_batch 1 x seq_len tokens (0: the planner's default length).
StepPlan plan_model(const std::string& configs_dir, const char* model, const std::vector<std::string>& overrides,
                    int64_t seq_len) {
  const TrainConfig config = plan_config_for_model((std::filesystem::path(configs_dir) / model).string(), overrides);
  return plan_step(config, PlanOptions{}, 1, seq_len ? seq_len : config.seq_len);
}

// FLAN-T5-base in the course's lab 2: LoRA r=32, alpha 32, dropout 0.05 on q and v.
ModelOptions flan_t5_lab_options() {
  LoraOptions lora;
  lora.r = 32;
  lora.lora_alpha = 32.0;
  lora.lora_dropout = 0.05;
  lora.target_modules = {"q", "v"};
  ModelOptions options;
  options.lora = lora;
  return options;
}

}  // namespace

std::vector<DTypeFigures> dtype_figures() {
  return {dtype_figure("FP32", DType::f32, 0x7f7fffff, 0xff7fffff),
          dtype_figure("FP16", DType::f16, 0x7bff, 0xfbff),
          dtype_figure("BF16", DType::bf16, 0x7f7f, 0xff7f),
          dtype_figure("INT8", DType::i8, 0x7f, 0x80)};
}

MemoryRule course_memory_rule() {
  const size_t fp32 = dtype_size_bytes(DType::f32);
  return MemoryRule{fp32, 2 * fp32, fp32, kCourseActivationBytesPerParam};  // Adam: m and v
}

size_t WeightFormat::bytes() const {
  return plan.quantized_weight_bytes + plan.quantized_constant_bytes + plan.dense_weight_bytes;
}

CourseFigures course_figures(const std::string& configs_dir) {
  CourseFigures figures;
  figures.dtypes = dtype_figures();
  figures.rule = course_memory_rule();

  figures.one_b_params = count_on_meta(course_model_config(configs_dir, "pythia-1b"), ModelOptions{});
  figures.one_b_full_fp32 =
      plan_model(configs_dir, "pythia-1b", {"trainable=all", "precision=fp32", "quantization.mode=none"}, 0);
  figures.one_b_lora_int8 = plan_model(configs_dir, "pythia-1b", {"quantization.mode=int8"}, 0);

  // Weights do not depend on the step's length: a short one plans faster.
  figures.twenty_b_params = count_on_meta(course_model_config(configs_dir, "gpt-neox-20b"), ModelOptions{});
  const std::pair<int, std::vector<std::string>> formats[] = {
      {32, {"precision=fp32", "quantization.mode=none"}},
      {16, {"precision=bf16", "quantization.mode=none"}},
      {8, {"precision=bf16", "quantization.mode=int8"}},
      {4, {"precision=bf16", "quantization.mode=nf4", "quantization.double_quant=true"}}};
  for (const auto& [bits, overrides] : formats)
    figures.twenty_b.push_back(WeightFormat{bits, plan_model(configs_dir, "gpt-neox-20b", overrides, 8)});

  const LoraShapes shapes = lora_shapes(512, 64, 8);
  figures.lora_512x64_trainable = shapes.numel();
  figures.lora_512x64_base = 512 * 64;
  figures.flan_t5_base = count_on_meta(course_model_config(configs_dir, "flan-t5-base"), flan_t5_lab_options());
  return figures;
}

namespace {

// Decimal gigabytes as the course writes them: "4,200 GB", "82.22 GB".
std::string gb(double bytes) {
  const double value = bytes / 1e9;
  if (value == std::floor(value) && value < 1e15) return with_commas(int64_t(value)) + " GB";
  char text[32];
  std::snprintf(text, sizeof text, value < 0.1 ? "%.4f GB" : "%.2f GB", value);
  return text;
}

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

void print_dtypes(const CourseFigures& f, std::ostream& out) {
  out << "1. One number in four formats (pi stored and read back through kernels/dtype.h; INT8 as a plain cast)\n";
  char line[160];
  std::snprintf(line, sizeof line, "  %-6s %5s  %-20s %-24s %s\n", "format", "bytes", "pi", "min", "max");
  out << line;
  for (const DTypeFigures& d : f.dtypes) {
    std::snprintf(line, sizeof line, "  %-6s %5zu  %-20s %-24s %s\n", d.name, d.bytes, number(d.pi).c_str(),
                  number(d.lowest).c_str(), number(d.highest).c_str());
    out << line;
  }
  out << "  (the INT8 base scales each weight row by its absmax onto -127..127, the course's symmetric range)\n\n";
}

// "17.64 GB: weights 4.05 GB (4.0 B/param) + gradients ... + activations ... + workspace ...".
void print_plan_line(const char* label, const StepPlan& plan, double params, std::ostream& out) {
  const MemoryStats& s = plan.at_peak;
  std::string parts;
  const std::pair<const char*, size_t> categories[] = {
      {"weights", s.current(MemCategory::weights)},       {"adapters", s.current(MemCategory::adapters)},
      {"gradients", s.current(MemCategory::gradients)},   {"AdamW m, v", s.current(MemCategory::optimizer)},
      {"activations", s.current(MemCategory::activations)}};
  for (const auto& [name, bytes] : categories) {
    if (bytes == 0) continue;
    char part[96];
    std::snprintf(part, sizeof part, "%s %s (%.2f B/param)", name, gb(double(bytes)).c_str(), double(bytes) / params);
    parts += std::string(parts.empty() ? "" : " + ") + part;
  }
  const size_t rest = plan.total_bytes() - s.current(MemCategory::weights) - s.current(MemCategory::adapters) -
                      s.current(MemCategory::gradients) - s.current(MemCategory::optimizer) -
                      s.current(MemCategory::activations);
  out << "    " << label << ": " << gb(double(plan.total_bytes())) << " = " << parts << " + workspace, rounding and CUDA context "
      << gb(double(rest)) << "\n";
}

void print_memory(const CourseFigures& f, std::ostream& out) {
  const MemoryRule& r = f.rule;
  out << "2. Memory by the course's rule: " << r.store() << " bytes/param to store (FP32); to train add Adam's two "
      << "states (" << r.adam_states << "), gradients (" << r.gradients << "), activations and temporaries (~"
      << r.activations << "): " << r.train() << " bytes/param\n";
  char line[160];
  std::snprintf(line, sizeof line, "  %-11s %12s %12s\n", "parameters", "to store", "to train");
  out << line;
  for (const int64_t billions : {1, 175, 500}) {
    const double params = double(billions) * 1e9;
    std::snprintf(line, sizeof line, "  %-11s %12s %12s\n", (std::to_string(billions) + "B").c_str(),
                  gb(params * double(r.store())).c_str(), gb(params * double(r.train())).c_str());
    out << line;
  }
  out << "  (the lecture's slide says ~80 GB for 1B: 20x the weights; its 175B and 500B figures are the rule's)\n";
  const double params = double(f.one_b_params.all);
  out << "  our planner (finetune plan) for a 1B model, configs/pythia-1b (" << with_commas(f.one_b_params.all)
      << " params), one step of 1 x " << f.one_b_full_fp32.seq_len << " tokens on CUDA, per-layer checkpointing:\n";
  print_plan_line("full fine-tuning, FP32", f.one_b_full_fp32, params, out);
  print_plan_line("LoRA r=8 on an INT8 base, BF16", f.one_b_lora_int8, params, out);
  out << "  The difference: the rule charges ~8 B/param of activations, the planner charges them per token (batch x "
         "seq_len x width x layers, one layer at a time with checkpointing), and LoRA trains only the adapters.\n\n";
}

std::string weight_breakdown(const WeightFormat& w) {
  const StepPlan& p = w.plan;
  const std::string dense = std::string(dtype_name(p.dense_weight_dtype));
  if (p.quantized_base == QuantizedBase::int8)
    return "INT8 linears " + gb(double(p.quantized_weight_bytes)) + " + f32 row scales " +
           gb(double(p.quantized_constant_bytes)) + " + " + dense + " embeddings, norms, biases " +
           gb(double(p.dense_weight_bytes));
  if (p.quantized_base == QuantizedBase::nf4)
    return "NF4 codes " + gb(double(p.quantized_weight_bytes)) + " + block constants (8-bit, double-quantised) " +
           gb(double(p.quantized_constant_bytes)) + " + " + dense + " embeddings, norms, biases " +
           gb(double(p.dense_weight_bytes));
  return "every weight in " + dense;
}

void print_twenty_b(const CourseFigures& f, std::ostream& out) {
  const double params = double(f.twenty_b_params.all);
  out << "3. A 20B model's weights (configs/gpt-neox-20b, " << with_commas(f.twenty_b_params.all)
      << " params), as the planner holds them\n";
  char line[320];
  std::snprintf(line, sizeof line, "  %4s %12s %10s %10s  %s\n", "bits", "course", "ours", "bits/param", "of which");
  out << line;
  for (const WeightFormat& w : f.twenty_b) {
    std::snprintf(line, sizeof line, "  %4d %12s %10s %10.3f  %s\n", w.bits, gb(20e9 * w.bits / 8).c_str(),
                  gb(double(w.bytes())).c_str(), 8.0 * double(w.bytes()) / params, weight_breakdown(w).c_str());
    out << line;
  }
  out << "\n";
}

void print_lora(const CourseFigures& f, std::ostream& out) {
  out << "4. LoRA's trainable parameters\n";
  const double fewer = 100.0 * (1.0 - double(f.lora_512x64_trainable) / double(f.lora_512x64_base));
  char line[200];
  std::snprintf(line, sizeof line, "  a 512 x 64 weight at r=8: A 8 x 64 + B 512 x 8 = %s trainable instead of %s (%.0f%% fewer)\n",
                with_commas(f.lora_512x64_trainable).c_str(), with_commas(f.lora_512x64_base).c_str(), fewer);
  out << line;
  out << "  FLAN-T5-base (configs/flan-t5-base/config.json), LoRA r=32 on q and v (self-attention and EncDecAttention):\n";
  out << "  " << trainable_parameters_line(f.flan_t5_base) << "\n";
}

// The labs, run end to end on the embedded tiny models by config files
// beside the model configs (each file says what it runs).
void print_labs(const std::string& configs_dir, std::ostream& out) {
  struct Lab {
    const char *file, *what;
  };
  const Lab labs[] = {
      {"course-lab2.yaml", "lab 2: the tiny T5 summarising dialogues: original, full fine-tuning, LoRA, INT8 + "
                           "LoRA, by ROUGE"},
      {"course-lab3.yaml", "lab 3: a tiny reward classifier of insults, then PPO with LoRA on the tiny T5 against "
                           "it: reward, toxicity and KL to the reference before and after"},
  };
  out << "\n5. The labs, in miniature\n";
  for (const Lab& lab : labs) {
    const std::string path = (std::filesystem::path(configs_dir) / lab.file).string();
    out << "  " << lab.what << "\n    ./finetune " << path
        << (std::filesystem::exists(path) ? "" : " (not found in this configs folder)") << "\n";
  }
}

}  // namespace

void print_course(const CourseFigures& figures, const std::string& configs_dir, std::ostream& out) {
  out << "The course's memory and LoRA figures, computed by this trainer (model configs from " << configs_dir
      << "; GB = 10^9 bytes)\n\n";
  print_dtypes(figures, out);
  print_memory(figures, out);
  print_twenty_b(figures, out);
  print_lora(figures, out);
  print_labs(configs_dir, out);
}

}  // namespace ft
