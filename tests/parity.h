// Helpers for the tests that compare a model with transformers/PEFT fixtures
// (tests/fixtures/README.md).
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "kernels/allocator.h"
#include "kernels/error.h"
#include "kernels/tensor.h"
#include "model/causal_lm.h"
#include "model/families.h"
#include "model/peft_adapter.h"
#include "model/safetensors.h"
#include "trainer/cli/merge.h"
#include "trainer/optimizer.h"
#include "trainer/setup.h"
#include "trainer/train_config.h"
#include "tests/host_tensors.h"

namespace ft::parity {

// Relative error of a tensor as one number: max |got - want| / max |want|.
// Per-element relative error is meaningless for entries near zero.
inline double relative_error(const Tensor& got, const Tensor& want) {
  REQUIRE(got.numel() == want.numel());
  double max_diff = 0.0, max_want = 0.0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    double g = load_as_f32(got.data, got.dtype, i), w = load_as_f32(want.data, want.dtype, i);
    max_diff = std::max(max_diff, std::abs(g - w));
    max_want = std::max(max_want, std::abs(w));
  }
  return max_diff / std::max(max_want, 1e-30);
}

// HF's causal-LM loss shifts labels: position t predicts labels[t + 1].
inline Tensor shifted_targets(const Tensor& labels, HostAllocator& host) {
  Tensor targets = Tensor::empty(labels.shape, DType::i32, host, MemCategory::activations);
  const int64_t B = labels.dim(0), T = labels.dim(1);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      targets.ptr<int32_t>()[b * T + t] = t + 1 < T ? labels.ptr<int32_t>()[b * T + t + 1] : -100;
  return targets;
}

// A forward of model on (input_ids, targets) gives reference's logits and
// loss within tolerance (relative: max |diff| / max |ref|, and of the loss).
inline void check_reference_forward(CausalLM& model, const Checkpoint& reference, const Tensor& input_ids,
                                    const Tensor& targets, double tolerance) {
  const float loss = model.forward(input_ids, targets);
  CHECK(relative_error(model.last_logits(), reference.view("logits")) <= tolerance);
  const float want_loss = reference.view("loss").ptr<float>()[0];
  CHECK(std::abs(loss - want_loss) <= tolerance * std::abs(want_loss));
}

// Four optimizer steps of model on one batch lower its loss.
inline void check_loss_falls(CausalLM& model, AdamW& optimizer, double lr, const Tensor& input_ids,
                             const Tensor& targets) {
  float first = 0, last = 0;
  for (int step = 0; step < 4; ++step) {
    model.zero_grads();
    last = model.forward_backward(input_ids, targets, 1.0f);
    if (step == 0) first = last;
    optimizer.step(lr);
  }
  MESSAGE("loss ", first, " -> ", last);
  CHECK(last < first);
}

// A decoder-only model over model_dir's f32 weights, built for the PEFT
// adapter in adapter_folder (its module selection, ranks and alphas), the
// adapter itself not loaded.
inline std::unique_ptr<CausalLM> adapter_model(Backend& backend, const std::string& model_dir,
                                               const std::string& adapter_folder) {
  ModelOptions options;
  options.weight_dtype = DType::f32;
  options.lora = read_peft_adapter_config(adapter_folder).lora;
  auto model = make_causal_lm(read_model_config(model_dir + "/config.json"), backend, options);
  model->load(Checkpoint(model_dir));
  return model;
}

// parse_train_config's Error message for yaml (read as configs/x.yaml), ""
// when it parses.
inline std::string config_error(const std::string& yaml) {
  try {
    parse_train_config(yaml, "configs/x.yaml");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The same for a minimal config whose lora: section is lora_yaml (its
// fields on line 4 on).
inline std::string lora_config_error(const std::string& lora_yaml) {
  return config_error("model: m\ndata: {train: t.jsonl}\nlora:\n" + lora_yaml);
}

// A run config's model (setup_training, its base loaded from config.model),
// trained four steps on reference's batch (check_loss_falls) and saved as a
// PEFT adapter to the temporary folder `name`.
struct TrainedAdapter {
  TrainingSetup setup;
  std::string folder;
};
inline TrainedAdapter train_and_save(const TrainConfig& config, const Checkpoint& reference, Backend& backend,
                                     HostAllocator& host, const std::string& name) {
  TrainedAdapter trained;
  trained.setup = setup_training(config, read_model_config(config.model + "/config.json"), backend,
                                 [&](LanguageModel& model) { model.load(Checkpoint(config.model)); });
  CausalLM& model = causal_lm(*trained.setup.model, "test");
  check_loss_falls(model, *trained.setup.optimizer, config.lr, reference.view("input_ids"),
                   shifted_targets(reference.view("labels"), host));
  PeftAdapterConfig adapter;
  adapter.lora = *model.options().lora;
  trained.folder = (std::filesystem::temp_directory_path() / name).string();
  std::filesystem::remove_all(trained.folder);
  save_peft_adapter(trained.folder, model, adapter);
  return trained;
}

// Every linear module of the architecture: LoRA targets that touch each path.
inline std::vector<std::string> all_linear_modules(const ModelConfig& config) {
  if (config.model_type == "gpt_neox") return {"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"};
  return {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};  // Llama, Qwen2, Mistral
}

// PEFT's init leaves B = 0, which would zero every lora_A gradient: give B
// small deterministic values so both adapters' gradients are exercised.
inline void set_lora_B(LanguageModel& model) {
  for (Parameter& adapter : model.adapters()) {
    if (adapter.name.find(".lora_B.") == std::string::npos) continue;
    std::vector<float> values(size_t(adapter.value.numel()));
    for (size_t i = 0; i < values.size(); ++i) values[i] = 0.05f * std::sin(float(i) + 1.0f);
    model.backend().copy(adapter.value, Tensor::view_of(values.data(), adapter.value.shape, DType::f32));
  }
}

// Every adapter of model trains and its gradient is reference's
// "grad." + key_prefix + its name (PEFT's saved key) within tolerance; the
// adapters, for an optimizer step.
inline std::vector<Parameter*> check_adapter_gradients(LanguageModel& model, const Checkpoint& reference,
                                                       const std::string& key_prefix, double tolerance) {
  std::vector<Parameter*> trainable;
  for (Parameter& adapter : model.adapters()) {
    CAPTURE(adapter.name);
    REQUIRE(adapter.trainable());
    const double error = relative_error(adapter.grad, reference.view("grad." + key_prefix + adapter.name));
    MESSAGE("gradient relative error ", error, " ", adapter.name);
    CHECK(error <= tolerance);
    trainable.push_back(&adapter);
  }
  return trainable;
}

// The first AdamW step moves each value by lr * g / (|g| + eps): where the
// gradient is within a few eps (1e-8) of zero, its f32 rounding (ours or
// torch's) changes the step itself. Those values (sensitive counts them)
// are left out of the relative error of the others: max |got - want| /
// max |want| over the tensor.
inline double after_step_error(const Parameter& p, const Tensor& want, const Tensor& want_grad, int64_t& sensitive) {
  double max_diff = 0.0, max_want = 0.0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double w = want.ptr<float>()[i];
    max_want = std::max(max_want, std::abs(w));
    if (std::abs(want_grad.ptr<float>()[i]) < 1e-6) {
      ++sensitive;
      continue;
    }
    max_diff = std::max(max_diff, std::abs(double(p.value.ptr<float>()[i]) - w));
  }
  return max_diff / std::max(max_want, 1e-30);
}

// Every adapter of model equals reference's "after_step." + key_prefix +
// its name within tolerance (after_step_error), with at most one value left
// out as sensitive.
inline void check_adapters_after_step(LanguageModel& model, const Checkpoint& reference, const std::string& key_prefix,
                                      double tolerance) {
  int64_t sensitive = 0;
  for (Parameter& adapter : model.adapters()) {
    CAPTURE(adapter.name);
    const std::string key = key_prefix + adapter.name;
    CHECK(after_step_error(adapter, reference.view("after_step." + key), reference.view("grad." + key), sensitive) <=
          tolerance);
  }
  CHECK(sensitive <= 1);  // measured: llama none, neox one (|grad| 3e-7 against a largest 0.12)
}

// The fixtures' optimizer step (scripts/make_fixtures.py's ADAMW): one
// torch.optim.AdamW step with lr 1e-2, weight decay 0.01, eps 1e-8, no clipping.
inline void fixture_adamw_step(Backend& backend, const std::vector<Parameter*>& trainable) {
  AdamWOptions options;
  options.weight_decay = 0.01;
  options.eps = 1e-8;
  options.max_grad_norm = 0.0;
  AdamW adamw(backend, trainable, options);
  adamw.step(1e-2);
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream file(path);
  REQUIRE(file);
  return nlohmann::json::parse(file);
}

// The tensor shapes of an adapter folder's adapter_model.safetensors, by key.
inline std::map<std::string, Shape> adapter_file_shapes(const std::string& adapter_folder) {
  const SafetensorsFile file(adapter_folder + "/adapter_model.safetensors");
  std::map<std::string, Shape> shapes;
  for (const SafetensorsEntry& e : file.entries()) shapes[e.name] = e.shape;
  return shapes;
}

// `finetune merge` of adapter_folder into model_dir, written to a temporary
// folder `out_name`, against reference's "merged.<weight>" tensors (PEFT's
// merge_and_unload()): each within tolerance. Returns the merge's log and
// sets *checked to how many weights were compared.
inline std::string check_merged_weights(const std::string& model_dir, const std::string& adapter_folder,
                                        const Checkpoint& reference, const std::string& out_name,
                                        int64_t* checked) {
  MergeCommand command;
  command.model = model_dir;
  command.adapter = adapter_folder;
  command.out = (std::filesystem::temp_directory_path() / out_name).string();
  std::filesystem::remove_all(command.out);
  std::ostringstream log;
  merge_adapter(command, log);
  const Checkpoint merged(command.out);
  *checked = 0;
  for (const std::string& name : reference.names()) {
    if (!name.starts_with("merged.")) continue;
    CAPTURE(name);
    CHECK(relative_error(merged.view(name.substr(7)), reference.view(name)) <= 1e-6);
    ++*checked;
  }
  return log.str();
}

// Saves model's adapters, with adapter_folder's config, to a temporary
// folder `name` and returns its path: the file must hold adapter_folder's
// keys and shapes, and a model `build` makes for the saved folder, loaded
// from it, must give model's last logits on (input_ids, targets) bit for bit.
inline std::string check_save_and_reload(CausalLM& model, const std::string& adapter_folder,
                                         const std::function<std::unique_ptr<CausalLM>(const std::string&)>& build,
                                         const std::string& name, const Tensor& input_ids, const Tensor& targets) {
  const std::string folder = (std::filesystem::temp_directory_path() / name).string();
  std::filesystem::remove_all(folder);
  save_peft_adapter(folder, model, read_peft_adapter_config(adapter_folder));
  CHECK(adapter_file_shapes(folder) == adapter_file_shapes(adapter_folder));
  auto reloaded = build(folder);
  load_peft_adapter(folder, *reloaded);
  reloaded->forward(input_ids, targets);
  CHECK(testing::same_bytes(reloaded->last_logits(), model.last_logits()));
  return folder;
}

}  // namespace ft::parity
