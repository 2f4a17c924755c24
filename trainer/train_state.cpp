#include "trainer/train_state.h"

#include <charconv>

#include "kernels/error.h"
#include "model/quantized_format.h"

namespace ft {
namespace {

constexpr const char* kFormat = "finetune-train-state-2";
const std::string kIdentityPrefix = "identity.";

// A host f32 copy of a state tensor (the CPU backend could share memory, a
// GPU backend cannot; one path for both, offloaded state included).
Tensor to_host(AdamW& optimizer, const Tensor& tensor, Allocator& host) {
  Tensor copy = Tensor::empty(tensor.shape, DType::f32, host, MemCategory::workspace);
  optimizer.copy_state(copy, tensor);
  return copy;
}

int64_t metadata_int(const std::map<std::string, std::string>& metadata, const std::string& key,
                     const std::string& path) {
  auto found = metadata.find(key);
  FT_CHECK(found != metadata.end(), path, ": not a training state (metadata \"", key, "\" missing)");
  const std::string& text = found->second;
  int64_t value = -1;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  FT_CHECK(error == std::errc() && end == text.data() + text.size() && value >= 0, path, ": metadata \"", key,
           "\" is \"", text, "\" (expected a non-negative decimal integer below 2^63)");
  return value;
}

// Before anything in the file is believed: the checksum, then the format.
void verify_train_state(const SafetensorsFile& file) {
  const std::string& path = file.path();
  auto stored = file.metadata().find(kChecksumKey);
  auto format = file.metadata().find("format");
  FT_CHECK(stored != file.metadata().end(), path, ": not a training state of this version (no checksum; format \"",
           format == file.metadata().end() ? "none" : format->second,
           "\"): it cannot be verified, so start the run again without --resume");
  verify_checksum(file);
  FT_CHECK(format != file.metadata().end() && format->second == kFormat, path, ": format \"",
           format == file.metadata().end() ? "none" : format->second, "\", expected \"", kFormat, "\"");
}

// Every difference between identity and the one the file records, one line each.
std::vector<std::string> identity_differences(const std::map<std::string, std::string>& metadata,
                                              const RunIdentity& identity, bool* only_data) {
  std::vector<std::string> differences;
  *only_data = true;
  // The weights are hashed per pipeline stage: another stage split changes
  // them with the same base, and the layout's own line says why.
  std::string stages;
  for (const IdentityField& field : identity)
    if (field.key == "parallel.pipeline") stages = field.value;
  const auto saved_stages = metadata.find(kIdentityPrefix + "parallel.pipeline");
  const bool restaged = stages != (saved_stages == metadata.end() ? "" : saved_stages->second);
  std::map<std::string, bool> known;
  for (const IdentityField& field : identity) {
    known[kIdentityPrefix + field.key] = true;
    auto saved = metadata.find(kIdentityPrefix + field.key);
    if (saved != metadata.end() && saved->second == field.value) continue;
    if (restaged && field.key == "base_model.weights") continue;
    differences.push_back(field.what + ": now " + field.value + "; the checkpoint's: " +
                          (saved == metadata.end() ? "none recorded" : saved->second));
    *only_data = *only_data && field.is_data;
  }
  for (const auto& [key, value] : metadata) {
    if (key.rfind(kIdentityPrefix, 0) != 0 || known.count(key)) continue;
    differences.push_back(key.substr(kIdentityPrefix.size()) + ": the checkpoint's: " + value + "; none in this run");
    *only_data = *only_data && key.rfind(kIdentityPrefix + "data.", 0) == 0;
  }
  return differences;
}

std::vector<std::string> check_identity(const SafetensorsFile& file, const RunIdentity& identity,
                                        bool allow_data_change) {
  bool only_data = true;
  std::vector<std::string> differences = identity_differences(file.metadata(), identity, &only_data);
  if (differences.empty() || (only_data && allow_data_change)) return differences;
  std::string message = file.path() + ": cannot resume: the checkpoint belongs to a different run:";
  for (const std::string& difference : differences) message += "\n  " + difference;
  message += only_data ? "\n--resume --allow-data-change resumes with the changed data anyway"
                       : "\na checkpoint resumes only with the base model, adapter config and tokenizer it was made "
                         "with, on as many data-parallel ranks and pipeline stages (--allow-data-change covers the "
                         "data files only)";
  fail(message);
}

}  // namespace

std::vector<std::pair<std::string, Tensor>> train_state_tensors(AdamW& optimizer, Allocator& host) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (size_t i = 0; i < optimizer.parameters().size(); ++i) {
    const std::string& name = optimizer.parameters()[i]->name;
    tensors.emplace_back("param." + name, to_host(optimizer, optimizer.master(i), host));
    tensors.emplace_back("adam_m." + name, to_host(optimizer, optimizer.first_moment(i), host));
    tensors.emplace_back("adam_v." + name, to_host(optimizer, optimizer.second_moment(i), host));
  }
  return tensors;
}

void save_train_state(const std::string& path, AdamW& optimizer, const TrainProgress& progress,
                      const RunIdentity& identity) {
  HostAllocator host;
  save_train_state(path, train_state_tensors(optimizer, host), optimizer.steps_taken(), progress, identity);
}

void save_train_state(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      int64_t optimizer_steps, const TrainProgress& progress, const RunIdentity& identity) {
  std::map<std::string, std::string> metadata = {
      {"format", kFormat},
      {"step", std::to_string(progress.step)},
      {"optimizer_steps", std::to_string(optimizer_steps)},
      {"data_epoch", std::to_string(progress.data_position.epoch)},
      {"data_index", std::to_string(progress.data_position.index)},
  };
  if (!progress.objective_state.empty()) metadata["objective_state"] = progress.objective_state;
  for (const IdentityField& field : identity) metadata[kIdentityPrefix + field.key] = field.value;
  save_safetensors_with_checksum(path, tensors, metadata);
}

TrainProgress load_train_state(const std::string& path, AdamW& optimizer, const RunIdentity& identity,
                               bool allow_data_change, size_t job_trainable_tensors) {
  if (job_trainable_tensors == 0) job_trainable_tensors = optimizer.parameters().size();
  SafetensorsFile file(path);
  verify_train_state(file);
  TrainProgress progress;
  progress.data_changes = check_identity(file, identity, allow_data_change);
  std::map<std::string, const SafetensorsEntry*> by_name;
  for (const SafetensorsEntry& entry : file.entries()) by_name[entry.name] = &entry;
  FT_CHECK(by_name.size() == 3 * job_trainable_tensors, path, ": holds ", by_name.size() / 3,
           " trainable tensors but this run trains ", job_trainable_tensors,
           " (was the config changed since the checkpoint?)");
  HostAllocator host;  // a tensor-parallel shard's columns, copied out of the file's whole tensor
  for (size_t i = 0; i < optimizer.parameters().size(); ++i) {
    const Parameter& p = *optimizer.parameters()[i];
    const std::string& name = p.name;
    const Shape whole = whole_shape(p);  // the file holds whole tensors, a shard takes its slice
    const std::pair<std::string, Tensor*> parts[] = {{"param." + name, &optimizer.master(i)},
                                                     {"adam_m." + name, &optimizer.first_moment(i)},
                                                     {"adam_v." + name, &optimizer.second_moment(i)}};
    for (const auto& [key, destination] : parts) {
      auto found = by_name.find(key);
      FT_CHECK(found != by_name.end(), path, ": missing tensor \"", key, "\"");
      const SafetensorsEntry& entry = *found->second;
      FT_CHECK(entry.shape == whole && entry.dtype == DType::f32, path, ": tensor \"", key, "\" is ",
               dtype_name(entry.dtype), " ", shape_string(entry.shape), ", expected f32 ", shape_string(whole));
      require_finite(entry);
      Tensor stored = Tensor::view_of(const_cast<void*>(entry.data), entry.shape, entry.dtype);
      if (!p.slice.whole())
        stored = host_slice(stored, p.slice.dim, p.slice.offset, destination->dim(p.slice.dim), host);
      optimizer.copy_state(*destination, stored);
    }
  }
  optimizer.sync_compute_copies();
  optimizer.set_steps_taken(metadata_int(file.metadata(), "optimizer_steps", path));
  progress.step = metadata_int(file.metadata(), "step", path);
  progress.data_position.epoch = metadata_int(file.metadata(), "data_epoch", path);
  progress.data_position.index = metadata_int(file.metadata(), "data_index", path);
  const auto state = file.metadata().find("objective_state");
  if (state != file.metadata().end()) progress.objective_state = state->second;
  return progress;
}

}  // namespace ft
