#include "trainer/plan.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <unordered_map>

#include "kernels/checked_mul.h"
#include "kernels/error.h"
#include "model/causal_lm.h"
#include "trainer/dpo.h"
#include "trainer/evaluate.h"
#include "trainer/progress.h"
#include "trainer/trainer.h"

namespace ft {

namespace {

// Sits above the tracker and remembers the tracker's per-category state, the
// step phase and the backend's last op whenever the held bytes reach a new
// maximum. Held bytes are the tracker's total (cpu) or the caching model's
// rounded bytes in use (cuda).
class PeakWatch final : public Allocator {
 public:
  PeakWatch(TrackingAllocator& tracker, const CachingModelAllocator* caching) : tracker_(tracker), caching_(caching) {}
  Device device() const override { return tracker_.device(); }
  void* allocate(size_t bytes, MemCategory category) override {
    void* ptr = tracker_.allocate(bytes, category);
    const size_t held = caching_ ? caching_->in_use_bytes() : tracker_.stats().total_current_bytes;
    if (held > peak_bytes) {
      peak_bytes = held;
      at_peak = tracker_.stats();
      phase_at_peak = phase;
      cursor_at_peak = backend ? backend->cursor() : MetaCursor{};
    }
    return ptr;
  }
  void deallocate(void* ptr, size_t bytes, MemCategory category) override {
    tracker_.deallocate(ptr, bytes, category);
  }

  const MetaBackend* backend = nullptr;
  const char* phase = "backend setup";
  size_t peak_bytes = 0;
  MemoryStats at_peak;
  const char* phase_at_peak = "";
  MetaCursor cursor_at_peak;

 private:
  TrackingAllocator& tracker_;
  const CachingModelAllocator* caching_;
};

// "backward, last op int8_linear_backward on gpt_neox.layers.43.attention.query_key_value.weight":
// the peak allocation was made inside that op (its scratch) or just after it.
std::string describe_peak(const PeakWatch& watch, LanguageModel& model) {
  std::string where = watch.phase_at_peak;
  if (where != "training step") return where;
  const MetaCursor& cursor = watch.cursor_at_peak;
  where = std::string(cursor.backward ? "backward" : "forward") + ", last op " + cursor.op;
  for (std::deque<Parameter>* list : {&model.parameters(), &model.adapters()})
    for (const Parameter& p : *list)
      if (p.value.storage.get() == cursor.parameter) return where + " on " + p.name;
  return where;
}

void split_weights(StepPlan& plan, LanguageModel& model) {
  for (const Parameter& p : model.parameters()) {
    if (p.value.dtype == DType::i8) {
      plan.int8_weight_bytes += p.value.size_bytes();
      plan.int8_scale_bytes += p.scales.size_bytes();
    } else if (p.value.dtype == DType::u8) {
      plan.nf4_weight_bytes += p.value.size_bytes();
      plan.nf4_absmax_bytes += p.scales.size_bytes();
      if (p.nested_map.defined()) plan.nf4_absmax_bytes += p.nested_absmax.size_bytes() + p.nested_map.size_bytes();
    } else {
      plan.dense_weight_bytes += p.value.size_bytes();
      plan.dense_weight_dtype = p.value.dtype;
    }
  }
}

}  // namespace

StepPlan plan_step(const TrainConfig& config, const PlanOptions& options, int64_t micro_batch, int64_t seq_len) {
  const ModelConfig model_config =
      ModelConfig::from_json_file((std::filesystem::path(config.model) / "config.json").string());
  MetaAllocator meta;
  TrackingAllocator host_state(meta);  // offloaded optimizer state: host memory, not the device's
  CachingModelAllocator caching;
  const bool cuda = options.policy == MemoryPolicy::cuda;
  TrackingAllocator tracker(cuda ? static_cast<Allocator&>(caching) : meta);
  PeakWatch watch(tracker, cuda ? &caching : nullptr);
  MetaBackend backend(watch, options.policy, options.gemm_workspace_bytes, options.library_attention);
  watch.backend = &backend;

  // As a run builds it, minus reading weights: the meta device has no values.
  watch.phase = "model weights";
  TrainingSetup setup = setup_training(config, model_config, backend,
                                       [&](LanguageModel&) { watch.phase = "gradients and optimizer state"; },
                                       &host_state);
  LanguageModel& model = *setup.model;

  // One micro-batch of train_step: every target counts, so nothing is skipped.
  // objective: dpo: micro_batch pairs, a chosen and a rejected row each, and
  // the reference forward (adapters off, transient activations) before the
  // policy's forward and backward, as dpo_train_step runs them.
  const bool dpo = config.objective == Objective::dpo;
  const int64_t rows = dpo ? 2 * micro_batch : micro_batch;
  HostAllocator host;
  Tensor ids = Tensor::empty({rows, seq_len}, DType::i32, host, MemCategory::activations);
  Tensor targets = Tensor::empty({rows, seq_len}, DType::i32, host, MemCategory::activations);
  for (int64_t i = 0; i < ids.numel(); ++i) ids.ptr<int32_t>()[i] = targets.ptr<int32_t>()[i] = 0;
  watch.phase = "training step";
  backend.reset_cursor();
  model.zero_grads();
  model.set_dropout_seed(config.seed);
  const Batch batch{ids, targets, ids.numel()};
  const float grad_scale = 1.0f;
  if (dpo) dpo_micro_batch(causal_lm(model, "objective: dpo"), batch, config.dpo, true, 1.0 / double(micro_batch));
  else micro_batch_loss(model, batch, &grad_scale);
  watch.phase = "optimizer step";
  setup.optimizer->step(config.lr);

  StepPlan plan;
  plan.micro_batch = micro_batch;
  plan.seq_len = seq_len;
  split_weights(plan, model);
  FT_CHECK(plan.int8_weight_bytes + plan.int8_scale_bytes + plan.nf4_weight_bytes + plan.nf4_absmax_bytes +
                   plan.dense_weight_bytes ==
               watch.at_peak.current(MemCategory::weights),
           "plan: the weights category holds more than the model's parameters");
  plan.at_peak = watch.at_peak;
  plan.peak_bytes = watch.peak_bytes;
  plan.reserved_bytes = cuda ? caching.reserved_bytes() : 0;
  plan.context_bytes = cuda ? options.context_reserve_bytes : 0;
  plan.where = describe_peak(watch, model);
  if (!model.adapters().empty()) plan.adapter_dtype = model.adapters().front().value.dtype;
  plan.host_optimizer_bytes = host_state.stats().current(MemCategory::optimizer);
  return plan;
}

namespace {

void print_row(const char* label, size_t bytes) {
  std::printf("  %-58s %12s\n", label, format_bytes(bytes).c_str());
}

void print_breakdown(const StepPlan& plan, const PlanOptions& options) {
  const MemoryStats& s = plan.at_peak;
  const std::string dense = std::string("dense weights (embeddings, norms, biases, lm_head), ") +
                            dtype_name(plan.dense_weight_dtype);
  print_row("frozen int8 linear weights", plan.int8_weight_bytes);
  print_row("their f32 row scales", plan.int8_scale_bytes);
  if (plan.nf4_weight_bytes > 0) {
    print_row("frozen NF4 linear weights (4-bit codes)", plan.nf4_weight_bytes);
    print_row("their block absmax (double-quantised: 8-bit + nested)", plan.nf4_absmax_bytes);
  }
  print_row(dense.c_str(), plan.dense_weight_bytes);
  print_row((std::string("LoRA adapters (") + dtype_name(plan.adapter_dtype) + ")").c_str(),
            s.current(MemCategory::adapters));
  print_row("gradients (f32)", s.current(MemCategory::gradients));
  print_row(plan.host_optimizer_bytes ? "optimizer state on the device (none: offloaded)"
                                      : "optimizer state (AdamW m, v, f32 masters)",
            s.current(MemCategory::optimizer));
  print_row("activations (saved for backward + the live layer + logits)", s.current(MemCategory::activations));
  print_row(options.policy == MemoryPolicy::cuda ? "workspace (cuBLASLt 32 MiB, int8 scratch, dequant tiles)"
                                                 : "workspace (int8 dequant tiles)",
            s.current(MemCategory::workspace));
  if (options.policy == MemoryPolicy::cuda) {
    print_row("caching-allocator rounding (size classes, 512 B)", plan.peak_bytes - s.total_current_bytes);
    print_row("CUDA context reserve", plan.context_bytes);
  }
  std::printf("  %-58s %12s\n", "----------------------------------------", "----------");
  print_row("peak", plan.total_bytes());
  std::printf("  peak in bytes: %zu\n", plan.total_bytes());
  std::printf("  peak at: %s\n", plan.where.c_str());
  if (options.policy == MemoryPolicy::cuda)
    std::printf("  reserved by the caching allocator after the step (cache never flushed): %s\n",
                format_bytes(plan.reserved_bytes + plan.context_bytes).c_str());
  if (plan.host_optimizer_bytes)
    std::printf("  host memory (offload.optimizer: host): AdamW m, v and f32 masters %s; PCIe %s each way per "
                "optimizer step\n",
                format_bytes(plan.host_optimizer_bytes).c_str(), format_bytes(plan.host_optimizer_bytes).c_str());
}

}  // namespace

AllReducePlan plan_all_reduce(const StepPlan& plan, int64_t ranks) {
  FT_CHECK(ranks >= 1, "--ranks must be at least 1, got ", ranks);
  AllReducePlan all_reduce;
  all_reduce.ranks = ranks;
  all_reduce.gradient_bytes = plan.at_peak.current(MemCategory::gradients);
  all_reduce.ring_sent_per_rank_bytes =
      size_t(checked_mul(int64_t(all_reduce.gradient_bytes), 2 * (ranks - 1)) / ranks);
  return all_reduce;
}

std::string mode_name(const PlanMode& mode) {
  const char* base = mode.quantization == QuantMode::none ? "unquantised base" : enum_name(mode.quantization);
  return std::string(base) + (mode.optimizer == OffloadTarget::host ? ", optimizer state on the host" : "");
}

namespace {

// The largest power of two in [1, limit] for which fits(value) holds, given
// that it holds for every value below one that does; 0 when it fails at 1.
template <class Fits>
int64_t largest_power_of_two(int64_t limit, const Fits& fits) {
  int64_t low = 0, high = 0;  // exponents: 2^low fits (once checked), 2^high is the last candidate
  while ((int64_t(1) << (high + 1)) <= limit) ++high;
  if (!fits(1)) return 0;
  while (low < high) {
    const int64_t middle = (low + high + 1) / 2;
    if (fits(int64_t(1) << middle)) low = middle;
    else high = middle - 1;
  }
  return int64_t(1) << low;
}

ModeFit fit_mode(const TrainConfig& config, const PlanOptions& options, const PlanMode& mode, int64_t max_seq_len) {
  TrainConfig moded = config;
  moded.quantization.mode = mode.quantization;
  moded.offload_optimizer = mode.optimizer;
  auto fits = [&](int64_t batch, int64_t seq) {
    return plan_step(moded, options, batch, seq).total_bytes() <= options.gpu_mem_bytes;
  };
  ModeFit fit;
  fit.mode = mode;
  fit.bytes = plan_step(moded, options, config.micro_batch_size, config.seq_len).total_bytes();
  fit.fits = fit.bytes <= options.gpu_mem_bytes;
  fit.largest_seq_len = largest_power_of_two(max_seq_len, [&](int64_t seq) { return fits(1, seq); });
  if (fit.largest_seq_len > 0)
    fit.largest_micro_batch = largest_power_of_two(1024, [&](int64_t batch) { return fits(batch, config.seq_len); });
  return fit;
}

std::string power_or_dash(int64_t value) { return value ? std::to_string(value) : "-"; }

}  // namespace

std::vector<ModeFit> fit_modes(const TrainConfig& config, const PlanOptions& options) {
  const ModelConfig model_config =
      ModelConfig::from_json_file((std::filesystem::path(config.model) / "config.json").string());
  std::vector<QuantMode> bases = {QuantMode::none};
  if (config.trainable == Trainable::lora) bases = {QuantMode::none, QuantMode::int8, QuantMode::nf4};
  std::vector<ModeFit> fits;
  for (QuantMode base : bases)
    for (OffloadTarget optimizer : {OffloadTarget::device, OffloadTarget::host})
      fits.push_back(fit_mode(config, options, PlanMode{base, optimizer}, model_config.max_position_embeddings));
  return fits;
}

void print_plan(const TrainConfig& config, const PlanOptions& options) {
  const bool cuda = options.policy == MemoryPolicy::cuda;
  const ModelConfig model_config =
      ModelConfig::from_json_file((std::filesystem::path(config.model) / "config.json").string());
  std::printf("memory plan: %s, %s %lld layers, on %s, micro_batch %lld x seq_len %lld%s\n", config.source.c_str(),
              model_config.model_type.c_str(), (long long)model_config.num_hidden_layers, cuda ? "cuda" : "cpu",
              (long long)config.micro_batch_size, (long long)config.seq_len,
              config.objective == Objective::dpo
                  ? " (DPO: micro_batch counts pairs; the reference forward, adapters off, runs first)"
                  : "");
  const StepPlan plan = plan_step(config, options, config.micro_batch_size, config.seq_len);
  print_breakdown(plan, options);
  const size_t budget = options.gpu_mem_bytes;
  const bool fits = plan.total_bytes() <= budget;
  std::printf("  fits in %s: %s (%s %s)\n", format_bytes(budget).c_str(), fits ? "yes" : "NO",
              format_bytes(fits ? budget - plan.total_bytes() : plan.total_bytes() - budget).c_str(),
              fits ? "to spare" : "over");

  if (options.ranks > 1) {
    const AllReducePlan all_reduce = plan_all_reduce(plan, options.ranks);
    std::printf("data parallel on %lld ranks: each rank's peak as above; per optimizer step %s of gradients "
                "all-reduced (%zu bytes), a ring sends %s per rank (%zu bytes)\n",
                (long long)options.ranks, format_bytes(all_reduce.gradient_bytes).c_str(), all_reduce.gradient_bytes,
                format_bytes(all_reduce.ring_sent_per_rank_bytes).c_str(), all_reduce.ring_sent_per_rank_bytes);
  }

  const std::vector<ModeFit> modes = fit_modes(config, options);
  const std::string at = std::to_string(config.micro_batch_size) + " x " + std::to_string(config.seq_len);
  const std::string at_text = "micro_batch " + std::to_string(config.micro_batch_size) + " x seq_len " +
                              std::to_string(config.seq_len);
  std::printf("modes in %s (largest powers of two that fit):\n", format_bytes(budget).c_str());
  std::printf("  %-46s %12s %5s %24s %28s\n", "mode", ("at " + at).c_str(), "fits", "seq_len at micro_batch 1",
              ("micro_batch at seq_len " + std::to_string(config.seq_len)).c_str());
  const ModeFit* best = nullptr;
  for (const ModeFit& fit : modes) {
    std::printf("  %-46s %12s %5s %24s %28s\n", mode_name(fit.mode).c_str(), format_bytes(fit.bytes).c_str(),
                fit.fits ? "yes" : "no", power_or_dash(fit.largest_seq_len).c_str(),
                power_or_dash(fit.largest_micro_batch).c_str());
    if (fit.fits && !best) best = &fit;
  }
  if (best)
    std::printf("best mode: %s (%s at %s)\n", mode_name(best->mode).c_str(), format_bytes(best->bytes).c_str(),
                at_text.c_str());
  else
    std::printf("best mode: none fits %s in %s\n", at_text.c_str(), format_bytes(budget).c_str());
}

TrainConfig plan_config_for_model(const std::string& path, const std::vector<std::string>& overrides) {
  namespace fs = std::filesystem;
  const fs::path json = fs::is_directory(path) ? fs::path(path) / "config.json" : fs::path(path);
  const ModelConfig model_config = ModelConfig::from_json_file(json.string());
  const int64_t seq_len = std::min<int64_t>(2048, model_config.max_position_embeddings);
  const std::string yaml = "model: " + fs::absolute(json.parent_path()).string() +
                           "\ndata: {train: unused.jsonl}\nprecision: bf16\nactivation_checkpointing: per_layer\n"
                           "loss_chunk_tokens: 512\nmicro_batch_size: 1\nseq_len: " +
                           std::to_string(seq_len) + "\n";
  return parse_train_config(yaml, json.string(), overrides);
}

size_t parse_byte_size(const std::string& text) {
  static const std::unordered_map<std::string, double> units = {
      {"", 1.0},         {"b", 1.0},        {"kib", 0x1p10},  {"mib", 0x1p20}, {"gib", 0x1p30},
      {"tib", 0x1p40},   {"kb", 1e3},       {"mb", 1e6},      {"gb", 1e9},     {"tb", 1e12}};
  size_t used = 0;
  double value = 0.0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    fail("\"", text, "\" is not a size (expected e.g. 24GiB, 512MiB, 2GB)");
  }
  std::string unit;
  for (size_t i = used; i < text.size(); ++i)
    if (!std::isspace(static_cast<unsigned char>(text[i]))) unit += char(std::tolower(static_cast<unsigned char>(text[i])));
  auto it = units.find(unit);
  FT_CHECK(it != units.end() && value >= 0.0, "\"", text, "\" is not a size (expected e.g. 24GiB, 512MiB, 2GB)");
  return size_t(value * it->second);
}

}  // namespace ft
