// Hostile and corrupt inputs to the parsers and loaders: each gives one Error
// naming the file (and the line or key) instead of a library message, a
// crash or a silently wrong model.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/error.h"
#include "model/atomic_file.h"
#include "model/causal_lm.h"
#include "model/families.h"
#include "model/model_config.h"
#include "model/peft_adapter.h"
#include "model/safetensors.h"
#include "trainer/data/data.h"
#include "trainer/optimizer.h"
#include "trainer/train_state.h"
#include "tokenizer/sentencepiece_tokenizer.h"

using namespace ft;
namespace fs = std::filesystem;

namespace {

const std::string kFixtures = FT_FIXTURES_DIR;

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag)
      : path(fs::temp_directory_path() / ("ft_hardening_" + tag + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream file(path, std::ios::binary);
  file << text;
}

std::string read_text(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

template <class F>
std::string error_of(F&& call) {
  try {
    call();
  } catch (const Error& error) {
    return error.what();
  }
  return "(no error)";
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A safetensors file from raw header text and data bytes.
void write_safetensors(const fs::path& path, const std::string& header, const std::string& data) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[size_t(i)] = char(uint64_t(header.size()) >> (8 * i));
  write_text(path, bytes + header + data);
}

// The llama_gqa fixture saved into dir as config.json + model.safetensors,
// tensor `changed` altered: stored under `dtype` (its bytes unconverted, as a
// broken export might write them) and/or its element 7 set to `poison`.
void write_changed_checkpoint(const fs::path& dir, const std::string& changed, std::optional<DType> dtype,
                              std::optional<float> poison) {
  const std::string fixture = kFixtures + "/llama_gqa";
  fs::copy_file(fixture + "/config.json", dir / "config.json");
  Checkpoint original(fixture);
  HostAllocator host;
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const std::string& name : original.names()) {
    const SafetensorsEntry& entry = original.entry(name);
    const DType stored = name == changed && dtype ? *dtype : entry.dtype;
    Tensor copy = Tensor::empty(entry.shape, stored, host, MemCategory::workspace);
    REQUIRE(copy.size_bytes() == entry.size_bytes);
    std::memcpy(copy.data, entry.data, entry.size_bytes);
    if (name == changed && poison) copy.ptr<float>()[7] = *poison;
    tensors.emplace_back(name, copy);
  }
  save_safetensors((dir / "model.safetensors").string(), tensors);
}

void write_poisoned_checkpoint(const fs::path& dir, const std::string& poisoned, float value) {
  write_changed_checkpoint(dir, poisoned, std::nullopt, value);
}

std::string load_error(const fs::path& dir, bool int8_base) {
  ModelConfig config = read_model_config((dir / "config.json").string());
  HostAllocator host;
  CpuBackend backend(host);
  ModelOptions options;
  options.quantized_base = int8_base ? QuantizedBase::int8 : QuantizedBase::none;
  auto model = make_causal_lm(config, backend, options);
  return error_of([&] { model->load(Checkpoint(dir.string())); });
}

}  // namespace

TEST_CASE("config.json: a number out of double's range names the file and the field") {
  TempDir dir("config_range");
  std::string text = read_text(kFixtures + "/llama_gqa/config.json");
  const std::string key = "\"rms_norm_eps\": 1e-05";
  REQUIRE(has(text, key));
  text.replace(text.find(key), key.size(), "\"rms_norm_eps\": 1e999");
  write_text(dir.path / "config.json", text);
  const std::string path = (dir.path / "config.json").string();
  const std::string message = error_of([&] { read_model_config(path); });
  CHECK(has(message, path));
  CHECK(has(message, "number out of range in field \"rms_norm_eps\""));
}

TEST_CASE("config.json: integers above the documented bound and floats beyond float are refused by name") {
  auto config_with = [](const std::string& field, const std::string& value) {
    std::string text = R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 88,
      "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 320)";
    return text + ", \"" + field + "\": " + value + "}";
  };
  // 2^70 does not fit any integer type (nlohmann keeps it as a double);
  // 2^63 + 1 fits only uint64; 2^24 + 1 is just past the bound.
  for (const char* value : {"1180591620717411303424", "9223372036854775809", "16777217"}) {
    CAPTURE(value);
    const std::string message = error_of([&] { parse_model_config(config_with("vocab_size", value), "c.json"); });
    CHECK(has(message, "c.json: field \"vocab_size\""));
  }
  CHECK(parse_model_config(config_with("vocab_size", std::to_string(kMaxModelConfigInt)), "c.json").vocab_size ==
        kMaxModelConfigInt);
  // A double above FLT_MAX stored into a float field would be undefined behaviour.
  const std::string message = error_of([&] { parse_model_config(config_with("rope_theta", "1e300"), "c.json"); });
  CHECK(has(message, "c.json: field \"rope_theta\""));
  CHECK(has(error_of([&] { parse_model_config(config_with("max_position_embeddings", "-9223372036854775807"), "c.json"); }),
            "field \"max_position_embeddings\""));
}

TEST_CASE("JSONL: a number out of range names the file and the line") {
  TempDir dir("jsonl_range");
  const fs::path path = dir.path / "train.jsonl";
  write_text(path, "{\"prompt\": \"a\", \"completion\": \"b\"}\n\n{\"prompt\": \"a\", \"completion\": \"b\", \"score\": 1e999}\n");
  const std::string message = error_of([&] { load_jsonl(path.string(), DataFormat::automatic); });
  CHECK(has(message, path.string() + ":3: number out of range in field \"score\""));
}

TEST_CASE("JSONL: a line longer than the limit is refused with its line number") {
  std::string text = "{\"text\": \"short\"}\n{\"text\": \"" + std::string(kMaxJsonlLineBytes, 'x') + "\"}\n";
  std::istringstream input(text);
  const std::string message = error_of([&] { load_jsonl(input, "big.jsonl", DataFormat::automatic); });
  CHECK(has(message, "big.jsonl:2: line is longer than the limit"));
  // A line of exactly the limit is accepted.
  std::string fits = "{\"text\": \"" + std::string(kMaxJsonlLineBytes - 12, 'y') + "\"}";
  REQUIRE(fits.size() == kMaxJsonlLineBytes);
  std::istringstream fitting(fits);
  CHECK(load_jsonl(fitting, "fits.jsonl", DataFormat::automatic).examples.size() == 1);
}

TEST_CASE("safetensors: a number out of range in the header names the file") {
  TempDir dir("st_range");
  const fs::path path = dir.path / "w.safetensors";
  write_safetensors(path, R"({"w": {"dtype": "F32", "shape": [1e999], "data_offsets": [0, 4]}})", std::string(4, '\0'));
  const std::string message = error_of([&] { SafetensorsFile file(path.string()); });
  CHECK(has(message, path.string() + ": header: number out of range in field \"shape\""));
}

TEST_CASE("safetensors: header length above the limit is refused before parsing") {
  TempDir dir("st_header");
  const fs::path path = dir.path / "w.safetensors";
  std::string bytes(8, '\0');
  const uint64_t declared = kMaxSafetensorsHeaderBytes + 1;
  for (int i = 0; i < 8; ++i) bytes[size_t(i)] = char(declared >> (8 * i));
  write_text(path, bytes + "{}");
  CHECK(has(error_of([&] { SafetensorsFile file(path.string()); }), "exceeds the limit of 100000000 bytes"));
}

TEST_CASE("safetensors: require_finite finds NaN and Inf in every float dtype and names the element") {
  TempDir dir("st_finite");
  const fs::path path = dir.path / "w.safetensors";
  HostAllocator host;
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    Tensor t = Tensor::empty({3, 5000}, dtype, host, MemCategory::workspace);  // spans two scan blocks
    for (int64_t i = 0; i < t.numel(); ++i) store_from_f32(t.data, dtype, i, 0.5f);
    store_from_f32(t.data, dtype, 4321 + int64_t(dtype_size_bytes(dtype)), std::numeric_limits<float>::infinity());
    tensors.emplace_back(std::string("bad_") + dtype_name(dtype), t);
  }
  Tensor ints = Tensor::empty({4}, DType::i32, host, MemCategory::workspace);
  for (int64_t i = 0; i < 4; ++i) ints.ptr<int32_t>()[i] = -1;  // all bits set: NaN's pattern, but an integer
  tensors.emplace_back("ints", ints);
  save_safetensors(path.string(), tensors);
  SafetensorsFile file(path.string());
  for (const SafetensorsEntry& entry : file.entries()) {
    CAPTURE(entry.name);
    if (entry.dtype == DType::i32) {
      CHECK_NOTHROW(require_finite(entry));
      continue;
    }
    const std::string message = error_of([&] { require_finite(entry); });
    CHECK(has(message, path.string() + ": tensor \"" + entry.name + "\" holds inf at element " +
                           std::to_string(4321 + dtype_size_bytes(entry.dtype))));
  }
}

// An embedding or a projection stored as integers is refused by file and
// name, whatever the base's quantization, before any conversion runs.
TEST_CASE("load refuses a weight stored in an integer dtype, naming the file and the tensor") {
  for (const char* name : {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight"})
    for (bool int8_base : {false, true}) {
      CAPTURE(name);
      CAPTURE(int8_base);
      TempDir dir("retyped");
      write_changed_checkpoint(dir.path, name, DType::i32, std::nullopt);
      const std::string message = load_error(dir.path, int8_base);
      CHECK(has(message, (dir.path / "model.safetensors").string() + ": tensor \"" + name +
                             "\" is stored as i32; a weight must be F32, F16 or BF16"));
    }
}

TEST_CASE("load refuses a checkpoint with a NaN in embed_tokens, naming the tensor") {
  TempDir dir("nan_embed");
  write_poisoned_checkpoint(dir.path, "model.embed_tokens.weight", std::nanf(""));
  const std::string message = load_error(dir.path, false);
  CHECK(has(message, "tensor \"model.embed_tokens.weight\" holds nan at element 7"));
}

TEST_CASE("load refuses a NaN inside a weight that would be quantised to int8") {
  TempDir dir("nan_int8");
  write_poisoned_checkpoint(dir.path, "model.layers.1.self_attn.q_proj.weight", std::nanf(""));
  const std::string message = load_error(dir.path, true);
  CHECK(has(message, "tensor \"model.layers.1.self_attn.q_proj.weight\" holds nan at element 7"));
  // The same checkpoint without the NaN loads.
  TempDir clean("clean_int8");
  write_poisoned_checkpoint(clean.path, "none", 0.0f);
  CHECK(load_error(clean.path, true) == "(no error)");
}

TEST_CASE("adapter_config.json: a number out of range names the file and the field") {
  TempDir dir("adapter_range");
  write_text(dir.path / "adapter_config.json",
             R"({"peft_type": "LORA", "r": 4, "lora_alpha": 1e999, "target_modules": ["q_proj"]})");
  const std::string message = error_of([&] { read_peft_adapter_config(dir.path.string()); });
  CHECK(has(message, (dir.path / "adapter_config.json").string() + ": number out of range in field \"lora_alpha\""));
}

TEST_CASE("train state: NaN tensors and malformed step counts are refused by name") {
  HostAllocator host;
  CpuBackend backend(host);
  Parameter p;
  p.name = "w";
  p.value = backend.empty({4}, DType::f32, MemCategory::weights);
  p.grad = backend.empty({4}, DType::f32, MemCategory::gradients);
  AdamW optimizer(backend, {&p}, AdamWOptions{});
  TempDir dir("state");
  const std::string path = (dir.path / "train_state.safetensors").string();
  auto write_state = [&](float adam_v, const std::string& step) {
    Tensor values = Tensor::empty({4}, DType::f32, host, MemCategory::workspace);
    Tensor v = Tensor::empty({4}, DType::f32, host, MemCategory::workspace);
    for (int i = 0; i < 4; ++i) values.ptr<float>()[i] = 0.25f, v.ptr<float>()[i] = i == 2 ? adam_v : 0.25f;
    const std::vector<std::pair<std::string, Tensor>> tensors = {
        {"param.w", values}, {"adam_m.w", values}, {"adam_v.w", v}};
    const std::map<std::string, std::string> metadata = {{"format", "finetune-train-state-2"}, {"step", step},
                                                   {"optimizer_steps", step}, {"data_epoch", "0"},
                                                   {"data_index", "1"}};
    save_safetensors_with_checksum(path, tensors, metadata);  // a valid file with chosen contents
  };
  write_state(0.25f, "3");
  CHECK(load_train_state(path, optimizer, {}).step == 3);
  write_state(std::nanf(""), "3");
  CHECK(has(error_of([&] { load_train_state(path, optimizer, {}); }), "tensor \"adam_v.w\" holds nan at element 2"));
  for (const char* step : {"x", "-1", "99999999999999999999", "3 "}) {
    CAPTURE(step);
    write_state(0.25f, step);
    CHECK(has(error_of([&] { load_train_state(path, optimizer, {}); }), path + ": metadata \"optimizer_steps\" is \""));
  }
}

namespace {

// An optimizer over two small parameters with distinct values and moments.
struct SmallTraining {
  HostAllocator host;
  CpuBackend backend{host};
  Parameter w, b;
  std::unique_ptr<AdamW> optimizer;
  SmallTraining() {
    for (auto [p, name, size] : {std::tuple{&w, "w", int64_t(24)}, std::tuple{&b, "b", int64_t(8)}}) {
      p->name = name;
      p->value = backend.empty({size}, DType::f32, MemCategory::weights);
      p->grad = backend.empty({size}, DType::f32, MemCategory::gradients);
      for (int64_t i = 0; i < size; ++i) p->value.ptr<float>()[i] = 0.01f * float(i), p->grad.ptr<float>()[i] = 0.5f;
    }
    optimizer = std::make_unique<AdamW>(backend, std::vector<Parameter*>{&w, &b}, AdamWOptions{});
    optimizer->step(1e-3);
  }
};

RunIdentity sample_identity() {
  return {{"base_model.config", "the base model's config.json (m/config.json)", "700 bytes, checksum 01"},
          {"adapter", "the adapter config", "{\"r\":4}"},
          {"data.train", "the train data (train.jsonl)", "5000 bytes, checksum 02", true}};
}

}  // namespace

TEST_CASE("train state: a flipped byte anywhere in the file is one Error naming the file") {
  SmallTraining training;
  TempDir dir("flip");
  const std::string path = (dir.path / "train_state.safetensors").string();
  save_train_state(path, *training.optimizer, {7, {0, 3}, {}, ""}, sample_identity());
  const std::string good = read_text(path);
  REQUIRE(load_train_state(path, *training.optimizer, sample_identity()).step == 7);
  int corrupt_named = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    for (uint8_t flip : {uint8_t(0x01), uint8_t(0x80)}) {
      std::string bad = good;
      bad[i] = char(uint8_t(bad[i]) ^ flip);
      write_text(path, bad);
      const std::string message = error_of([&] { load_train_state(path, *training.optimizer, sample_identity()); });
      CAPTURE(i);
      CAPTURE(message);
      REQUIRE(has(message, path));
      corrupt_named += has(message, ": corrupt: its checksum is ");
    }
  }
  // Each flip in the data block (3 tensors of 24 and 3 of 8 f32 values) passes every check but the checksum.
  CHECK(corrupt_named >= 2 * 3 * (24 + 8) * 4);
}

TEST_CASE("train state: a different base model, adapter or data is refused, naming each difference") {
  SmallTraining training;
  TempDir dir("identity");
  const std::string path = (dir.path / "train_state.safetensors").string();
  save_train_state(path, *training.optimizer, {7, {0, 3}, {}, ""}, sample_identity());

  RunIdentity other_base = sample_identity();
  other_base[0].value = "701 bytes, checksum 03";
  other_base[1].value = "{\"r\":8}";
  for (bool allow : {false, true}) {
    const std::string message = error_of([&] { load_train_state(path, *training.optimizer, other_base, allow); });
    CHECK(has(message, path + ": cannot resume: the checkpoint belongs to a different run:"));
    CHECK(has(message, "the base model's config.json (m/config.json): now 701 bytes, checksum 03; the checkpoint's: "
                       "700 bytes, checksum 01"));
    CHECK(has(message, "the adapter config: now {\"r\":8}; the checkpoint's: {\"r\":4}"));
    CHECK(has(message, "--allow-data-change covers the data files only"));
  }

  RunIdentity other_data = sample_identity();
  other_data[2].value = "5001 bytes, checksum 04";
  const std::string message = error_of([&] { load_train_state(path, *training.optimizer, other_data); });
  CHECK(has(message, "the train data (train.jsonl): now 5001 bytes, checksum 04; the checkpoint's: 5000 bytes"));
  CHECK(has(message, "--resume --allow-data-change resumes with the changed data anyway"));
  const TrainProgress accepted = load_train_state(path, *training.optimizer, other_data, true);
  CHECK(accepted.step == 7);
  REQUIRE(accepted.data_changes.size() == 1);
  CHECK(has(accepted.data_changes[0], "the train data (train.jsonl)"));

  RunIdentity with_eval = sample_identity();
  with_eval.push_back({"data.eval", "the eval data (eval.jsonl)", "10 bytes, checksum 05", true});
  CHECK(has(error_of([&] { load_train_state(path, *training.optimizer, with_eval); }),
            "the eval data (eval.jsonl): now 10 bytes, checksum 05; the checkpoint's: none recorded"));
  RunIdentity without_adapter = sample_identity();
  without_adapter.erase(without_adapter.begin() + 1);
  CHECK(has(error_of([&] { load_train_state(path, *training.optimizer, without_adapter, true); }),
            "adapter: the checkpoint's: {\"r\":4}; none in this run"));
}

TEST_CASE("train state: a state without a checksum (an earlier version's) is refused with what to do") {
  SmallTraining training;
  TempDir dir("old");
  const std::string path = (dir.path / "train_state.safetensors").string();
  Tensor values = Tensor::empty({24}, DType::f32, training.host, MemCategory::workspace);
  save_safetensors(path, {{"param.w", values}}, {{"format", "finetune-train-state-1"}, {"step", "3"}});
  CHECK(has(error_of([&] { load_train_state(path, *training.optimizer, {}); }),
            path + ": not a training state of this version (no checksum; format \"finetune-train-state-1\"): it "
                   "cannot be verified, so start the run again without --resume"));
}

TEST_CASE("an atomic write that fails names the path and the errno text and leaves the previous file") {
  TempDir dir("atomic");
  const std::string path = (dir.path / "kept.json").string();
  write_file_atomically(path, "previous");
  // A folder where the temp file should go: creating it fails with EISDIR.
  fs::create_directories(path + ".tmp");
  CHECK(has(error_of([&] { write_file_atomically(path, "new"); }),
            path + ": cannot save (writing " + path + ".tmp: Is a directory); the previous kept.json, if any, is unchanged"));
  CHECK(read_text(path) == "previous");
  fs::remove(path + ".tmp");
  write_file_atomically(path, "new");
  CHECK(read_text(path) == "new");
  CHECK(!fs::exists(path + ".tmp"));
}

// tokenizer.model: libsentencepiece reads its model file unchecked, so each
// case below was, before tokenizer/sentencepiece_model_check.cpp, a crash, an
// out-of-bounds read, a library message naming no file or a silently accepted
// file (said per case).
namespace {

const std::string kSentencePieceModel = kFixtures + "/tokenizer/tokenizer.model";

// [begin, end) of a field's payload in a model's bytes.
struct Span {
  size_t begin, end;
};

uint64_t read_varint(const std::string& bytes, size_t& at) {
  uint64_t value = 0;
  for (int shift = 0; at < bytes.size(); shift += 7) {
    const uint8_t byte = uint8_t(bytes[at++]);
    value |= uint64_t(byte & 0x7F) << shift;
    if (byte < 0x80) break;
  }
  return value;
}

// The payload of occurrence `index` of the length-delimited field `number` of
// the message at `message`: the protobuf walk the patches below need (the
// fixture's ModelProto, NormalizerSpec and pieces use varint, fixed32 and
// length-delimited fields only).
Span find_field(const std::string& bytes, Span message, uint32_t number, int index = 0) {
  for (size_t at = message.begin; at < message.end;) {
    const uint64_t tag = read_varint(bytes, at);
    if ((tag & 7) == 0) {
      read_varint(bytes, at);
    } else if ((tag & 7) == 5) {
      at += 4;
    } else {
      const size_t size = read_varint(bytes, at);
      if ((tag >> 3) == number && index-- == 0) return {at, at + size};
      at += size;
    }
  }
  throw std::logic_error("the fixture has no such field");
}

void put_u32(std::string& bytes, size_t at, uint32_t value) { std::memcpy(&bytes[at], &value, 4); }

// The fixture model changed by patch, loaded, and a text that reaches the
// normalizer's character map encoded (a bad map crashed at the encode, not at
// the load): the error, or "(no error)".
std::string patched_model_error(const std::function<void(std::string&)>& patch, std::string* path_out = nullptr) {
  static int count = 0;
  TempDir dir("sentencepiece_" + std::to_string(count++));
  std::string bytes = read_text(kSentencePieceModel);
  patch(bytes);
  const std::string path = (dir.path / "tokenizer.model").string();
  write_text(path, bytes);
  if (path_out) *path_out = path;
  return error_of([&] { SentencePieceTokenizer(path).encode("\uff28ello  w\u00f6rld \ufb01 \u2460 <s>"); });
}

std::string model_error_prefix(const std::string& path) { return path + ": cannot load SentencePiece model: "; }

}  // namespace

TEST_CASE("tokenizer.model: a file cut short is refused by name, also where the cut leaves valid protobuf") {
  std::string path;
  // Cut inside the character map: the old loader refused it too, but said only that parsing failed.
  std::string error = patched_model_error([](std::string& bytes) { bytes.resize(bytes.size() / 2); }, &path);
  CHECK(has(error, model_error_prefix(path) + "ModelProto: truncated: a field of 240021 bytes"));
  // Cut after the 100th piece: valid protobuf, which the old loader took as a 100-piece tokenizer
  // without its normalizer.
  error = patched_model_error([](std::string& bytes) {
    bytes.resize(find_field(bytes, {0, bytes.size()}, 1, 99).end);
  }, &path);
  CHECK(error == model_error_prefix(path) + "trainer_spec: missing (a truncated file?)");
  error = patched_model_error([](std::string& bytes) { bytes.clear(); }, &path);
  CHECK(error == model_error_prefix(path) + "pieces: none (an empty or truncated file?)");
}

TEST_CASE("tokenizer.model: a character map whose trie or string offsets lie outside it is refused by name") {
  auto charsmap = [](const std::string& bytes) {
    return find_field(bytes, find_field(bytes, {0, bytes.size()}, 3), 2);
  };
  std::string path;
  // A trie size past the map's end: the old loader's check (size < map) let 3 bytes past the end
  // in, and the string block's size underflowed; it loaded and encoded without a word.
  std::string error = patched_model_error([&](std::string& bytes) {
    const Span map = charsmap(bytes);
    put_u32(bytes, map.begin, uint32_t(map.end - map.begin - 1));
  }, &path);
  CHECK(error == model_error_prefix(path) + "normalizer_spec.precompiled_charsmap: a trie of 240006 bytes but only "
                                            "240003 bytes follow its size");
  // The root's children 4 GiB past the trie (offset field at its maximum, scaled by 256): the old
  // loader's normalizer read there (a segmentation fault).
  error = patched_model_error([&](std::string& bytes) {
    put_u32(bytes, charsmap(bytes).begin + 4, (0x3FFFFFu << 10) | (1u << 9));
  }, &path);
  CHECK(error == model_error_prefix(path) + "normalizer_spec.precompiled_charsmap: a trie node's children reach unit "
                                            "1073741823 but the trie has 44800 units");
  // No NUL in the string block: the old normalizer's strlen ran past the map (silently, here).
  error = patched_model_error([&](std::string& bytes) {
    const Span map = charsmap(bytes);
    uint32_t trie_bytes;
    std::memcpy(&trie_bytes, &bytes[map.begin], 4);
    for (size_t at = map.begin + 4 + trie_bytes; at < map.end; at++)
      if (bytes[at] == '\0') bytes[at] = ' ';
  }, &path);
  CHECK(has(error, model_error_prefix(path) + "normalizer_spec.precompiled_charsmap: trie unit "));
  CHECK(has(error, "of the string block, with no NUL after it"));
}

TEST_CASE("tokenizer.model: a piece with a bad type, a NaN score or a NUL byte is refused by name") {
  // pieces[1] is "<s>": 0a 03 '<' 's' '>', 15 and a float score, 18 03 (CONTROL); pieces[10]
  // is the normal piece "rs": 0a 02 'r' 's', 15 and a score.
  auto piece = [](const std::string& bytes, int index) { return find_field(bytes, {0, bytes.size()}, 1, index); };
  std::string path;
  // protobuf drops an unknown enum value: the old loader made <s> a normal piece (bos_id -1).
  std::string error = patched_model_error([&](std::string& bytes) { bytes[piece(bytes, 1).end - 1] = 9; }, &path);
  CHECK(error == model_error_prefix(path) + "pieces[1].type: 9 is not a piece type (1 to 6)");
  // The old loader took the NaN score.
  error = patched_model_error([&](std::string& bytes) { put_u32(bytes, piece(bytes, 1).begin + 6, 0x7FC00000u); },
                              &path);
  CHECK(error == model_error_prefix(path) + "pieces[1].score: not finite (nan)");
  // libsentencepiece builds its tries from C strings. The old loader took "\0s" here (a BPE
  // model keeps its normal pieces in a hash map); a unigram model's trie builder let darts' own
  // exception out, naming no file (crash-eb308b... below).
  error = patched_model_error([&](std::string& bytes) { bytes[piece(bytes, 10).begin + 2] = '\0'; }, &path);
  CHECK(error == model_error_prefix(path) + "pieces[10].piece: contains a NUL byte");
}

TEST_CASE("tokenizer.model: a special id outside the vocabulary is refused by name") {
  std::string path;
  // trainer_spec ends with eos_id = 2 (d0 02 02); 320 takes one more byte (d0 02 c0 02). The old
  // loader ignored trainer_spec's ids.
  const std::string error = patched_model_error([](std::string& bytes) {
    const Span spec = find_field(bytes, {0, bytes.size()}, 2);
    const size_t eos = bytes.find("\xd0\x02\x02", spec.begin);
    REQUIRE(eos < spec.end);
    bytes.replace(eos, 3, "\xd0\x02\xc0\x02");
    bytes[spec.begin - 1] = char(spec.end - spec.begin + 1);  // the one-byte length before the payload
  }, &path);
  CHECK(error == model_error_prefix(path) + "trainer_spec.eos_id: 320 is outside the vocabulary of 320 pieces (-1 "
                                            "means none)");
}

TEST_CASE("tokenizer.model: inputs the fuzzer found crashing libsentencepiece are refused by name") {
  const std::string kept = FT_SOURCE_DIR "/tests/fuzz/regressions/fuzz_sentencepiece/";
  // With the old loader, replayed under ASan + UBSan (fuzz_replay_sentencepiece): a heap-buffer-overflow
  // in the normalizer's strlen of a replacement past the string block, a segmentation fault in that
  // strlen (its cause, a string block without a NUL, lies behind the first check that fails now),
  // and darts' exception ("failed to insert key: zero-length key") out of the library, from a
  // unigram piece that is all NULs. Without ASan the first two read out of bounds silently.
  const std::pair<const char*, const char*> crashes[] = {
      {"crash-1defb7075ec18b4f4c6f5083addc6eaa128dfe46",
       "normalizer_spec.precompiled_charsmap: trie unit 133 points at byte 132, past the 16-byte string block"},
      {"crash-d32bc6f335a17f0e300188b0a2bc24a8b7894c4e", "pieces[0].piece: invalid UTF-8 at byte 1"},
      {"crash-eb308b4caca7611f39033d8ff456f8cc73052c2b", "pieces[1].piece: appears twice"},
  };
  for (const auto& [name, expected] : crashes) {
    const std::string path = kept + name;
    CAPTURE(path);
    CHECK(error_of([&] { SentencePieceTokenizer(path).encode("\uff28ello w\u00f6rld"); }) ==
          model_error_prefix(path) + expected);
  }
}
