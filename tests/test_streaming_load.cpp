// Streaming load: a sharded bf16 checkpoint loads into an int8 base with the
// process's peak RSS under quantized size + largest tensor + 10%, and a saved
// quantised base loads back to the same bits as quantising again.
//
// The RSS case runs at ~50 MB here; scripts/bench_load runs the same case at
// ~1 GB by setting FT_BENCH_LOAD=1. It comes first in this file on purpose:
// its child is forked, and a child forked after OpenMP has started its thread
// pool (the other case's forward) may hang in libgomp.
#include <doctest/doctest.h>
#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/meta/meta_backend.h"
#include "model/causal_lm.h"
#include "model/families.h"
#include "model/quant/int8.h"
#include "model/quantized_base.h"
#include "model/safetensors.h"
#include "tests/host_tensors.h"

using namespace ft;
using ft::testing::same_bytes;
namespace fs = std::filesystem;

namespace {

std::string llama_config(int64_t hidden, int64_t intermediate, int64_t layers, int64_t vocab) {
  nlohmann::json config = {{"model_type", "llama"},
                           {"hidden_size", hidden},
                           {"intermediate_size", intermediate},
                           {"num_hidden_layers", layers},
                           {"num_attention_heads", hidden / 64},
                           {"vocab_size", vocab},
                           {"max_position_embeddings", 256}};
  return config.dump();
}

// A fresh folder under the system temp dir, removed when this goes.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag)
      : path(fs::temp_directory_path() / ("ft_" + tag + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// Deterministic bf16 values in about [-0.05, 0.05], cheap enough for 1 GB.
Tensor synthetic_bf16(const Shape& shape, uint64_t seed, HostAllocator& host) {
  Tensor t = Tensor::empty(shape, DType::bf16, host, MemCategory::workspace);
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    float value = (float(uint32_t(state >> 40)) / float(1 << 24) - 0.5f) * 0.1f;
    store_from_f32(t.data, DType::bf16, i, value);
  }
  return t;
}

// Writes config.json and a bf16 checkpoint of every base parameter the config
// implies: one shard per decoder layer plus one for the rest, with an index.
// Only one shard is in memory at a time.
void write_sharded_checkpoint(const fs::path& dir, const std::string& config_text) {
  std::ofstream(dir / "config.json") << config_text;
  ModelConfig config = parse_model_config(config_text, "synthetic config");
  MetaAllocator meta;
  MetaBackend shapes_only(meta, MemoryPolicy::cpu);
  std::unique_ptr<CausalLM> model = make_causal_lm(config, shapes_only, ModelOptions{});
  std::map<std::string, std::vector<std::string>> shards;  // shard file -> tensor names
  for (const Parameter& p : model->parameters()) {
    std::string shard = "model-rest.safetensors";
    if (p.name.rfind("model.layers.", 0) == 0)
      shard = "model-layer" + p.name.substr(13, p.name.find('.', 13) - 13) + ".safetensors";
    shards[shard].push_back(p.name);
  }
  HostAllocator host;
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t seed = 0;
  for (const auto& [shard, names] : shards) {
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const std::string& name : names) {
      tensors.emplace_back(name, synthetic_bf16(model->parameter(name).value.shape, ++seed, host));
      weight_map[name] = shard;
    }
    save_safetensors((dir / shard).string(), tensors, {{"format", "pt"}});
  }
  std::ofstream(dir / "model.safetensors.index.json") << nlohmann::json{{"weight_map", weight_map}}.dump();
}

// A field of /proc/self/status in bytes (VmRSS, VmHWM: reported in kB).
size_t status_bytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind(field + ":", 0) == 0) return size_t(std::stoull(line.substr(field.size() + 1))) * 1024;
  FAIL("no ", field, " in /proc/self/status");
  return 0;
}

struct LoadFigures {
  size_t baseline_rss = 0;    // child's RSS before the model exists
  size_t peak_rss = 0;        // child's VmHWM after loading
  size_t quantized_bytes = 0; // the model's weights as stored: i8 codes + f32 scales + bf16 rest
  size_t largest_tensor = 0;  // largest tensor in the checkpoint
  size_t checkpoint_bytes = 0;
};

// In the child: build the int8 model, load, and measure.
LoadFigures load_and_measure(const fs::path& dir) {
  LoadFigures figures;
  // The forked child starts with the parent's resident pages: reset the peak
  // (clear_refs 5 sets VmHWM to the current RSS) so it counts from here.
  std::ofstream("/proc/self/clear_refs") << "5";
  figures.baseline_rss = status_bytes("VmRSS");
  HostAllocator host;
  CpuBackend backend(host);
  ModelOptions options;
  options.quantized_base = QuantizedBase::int8;
  options.weight_dtype = DType::bf16;
  std::unique_ptr<CausalLM> model =
      make_causal_lm(read_model_config((dir / "config.json").string()), backend, options);
  Checkpoint checkpoint(dir.string());
  model->load(checkpoint);
  figures.peak_rss = status_bytes("VmHWM");
  for (const Parameter& p : model->parameters()) {
    figures.quantized_bytes += p.value.size_bytes();
    for (const Tensor& constant : p.quantized.constants) figures.quantized_bytes += constant.size_bytes();
  }
  for (const std::string& name : checkpoint.names())
    figures.largest_tensor = std::max(figures.largest_tensor, checkpoint.entry(name).size_bytes);
  figures.checkpoint_bytes = checkpoint.total_bytes();
  return figures;
}

LoadFigures measure_in_child(const fs::path& dir) {
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  // Hand the freed shard buffers back to the system first: heap pages the
  // child inherits resident would hide part of what the load allocates.
  ::malloc_trim(0);
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::alarm(600);  // a hung load dies of SIGALRM: the read below ends and the status says so
    ::close(pipe_fds[0]);
    int status = 1;
    try {
      LoadFigures figures = load_and_measure(dir);
      status = ::write(pipe_fds[1], &figures, sizeof figures) == ssize_t(sizeof figures) ? 0 : 1;
    } catch (const std::exception& error) {
      std::fprintf(stderr, "child: %s\n", error.what());
    }
    ::_exit(status);  // no atexit handlers or doctest reporting in the child
  }
  ::close(pipe_fds[1]);
  LoadFigures figures;
  ssize_t got = ::read(pipe_fds[0], &figures, sizeof figures);
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  REQUIRE(got == ssize_t(sizeof figures));
  return figures;
}

double mib(size_t bytes) { return double(bytes) / (1 << 20); }

}  // namespace

TEST_CASE("loading a sharded bf16 checkpoint into an int8 base keeps peak RSS near the quantized size") {
  const bool bench = std::getenv("FT_BENCH_LOAD") != nullptr;
  // ~50 MB here; ~1 GB (0.49 G parameters) for scripts/bench_load.
  const std::string config = bench ? llama_config(2048, 5632, 7, 32000) : llama_config(512, 1408, 5, 8000);
  TempDir dir("streaming_load");
  write_sharded_checkpoint(dir.path, config);
  LoadFigures f = measure_in_child(dir.path);
  const size_t bound = size_t(1.1 * double(f.quantized_bytes + f.largest_tensor));
  const size_t added = f.peak_rss - f.baseline_rss;
  std::printf(
      "streaming_load: checkpoint %.1f MiB, quantized %.1f MiB, largest tensor %.1f MiB, bound %.1f MiB; "
      "peak RSS %.1f MiB (baseline before load %.1f MiB, added by load %.1f MiB)\n",
      mib(f.checkpoint_bytes), mib(f.quantized_bytes), mib(f.largest_tensor), mib(bound), mib(f.peak_rss),
      mib(f.baseline_rss), mib(added));
  // What loading adds must fit; at 1 GB the whole process must too (the
  // ~10 MB of code and libraries before the load is within the 10% there).
#ifdef FT_SANITIZED
  // AddressSanitizer keeps freed blocks in quarantine and adds shadow memory:
  // RSS then measures the instrumentation, not the loader.
  MESSAGE("sanitizer build: the RSS bound is not checked");
#else
  CHECK(added <= bound);
  if (bench) CHECK(f.peak_rss <= bound);
#endif
}

TEST_CASE("a saved quantised base loads back to the same codes, scales and logits") {
  TempDir dir("quantized_base");
  const std::string config = llama_config(128, 256, 2, 512);
  write_sharded_checkpoint(dir.path, config);
  HostAllocator host;
  CpuBackend backend(host);
  ModelOptions options;
  options.quantized_base = QuantizedBase::int8;
  options.weight_dtype = DType::bf16;
  ModelConfig model_config = parse_model_config(config, "synthetic config");

  std::unique_ptr<CausalLM> quantised = make_causal_lm(model_config, backend, options);
  quantised->load(Checkpoint(dir.path.string()));
  const std::string saved = (dir.path / "quantized.safetensors").string();
  save_quantized_base(*quantised, saved);

  Checkpoint file(saved);
  std::unique_ptr<CausalLM> reloaded = make_causal_lm(model_config, backend, options);
  reloaded->load(file);
  CHECK(SafetensorsFile(saved).metadata().at(kQuantizationMetadataKey) == kQuantizationInt8);
  CHECK(file.entry("model.layers.0.self_attn.q_proj.weight").dtype == DType::i8);
  // bitsandbytes' names: the row scales and layout code under the module's name.
  CHECK(file.entry("model.layers.0.self_attn.q_proj.SCB").dtype == DType::f32);
  CHECK(file.entry("model.layers.0.self_attn.q_proj.weight_format").dtype == DType::u8);
  CHECK(!file.contains("model.layers.0.self_attn.q_proj.weight.SCB"));

  size_t int8_parameters = 0;
  for (const Parameter& p : quantised->parameters()) {
    const Parameter& q = reloaded->parameter(p.name);
    CAPTURE(p.name);
    CHECK(same_bytes(p.value, q.value));
    if (p.value.dtype == DType::i8) {
      ++int8_parameters;
      CHECK(same_bytes(int8_scales(p), int8_scales(q)));
    }
  }
  CHECK(int8_parameters == 2 * 7);

  Tensor ids = Tensor::empty({2, 8}, DType::i32, host, MemCategory::activations);
  Tensor targets = Tensor::empty({2, 8}, DType::i32, host, MemCategory::activations);
  for (int i = 0; i < 16; ++i) ids.ptr<int32_t>()[i] = (i * 37) % 512, targets.ptr<int32_t>()[i] = (i * 53) % 512;
  float loss_a = quantised->forward(ids, targets);
  float loss_b = reloaded->forward(ids, targets);
  CHECK(loss_a == loss_b);
  CHECK(same_bytes(quantised->last_logits(), reloaded->last_logits()));

  // A quantised base cannot go into a model without an int8 base.
  std::unique_ptr<CausalLM> dense = make_causal_lm(model_config, backend, ModelOptions{});
  CHECK_THROWS_WITH(dense->load(file), doctest::Contains("quantization.mode int8"));
}

TEST_CASE("a released tensor reads back the same bytes") {
  TempDir dir("release");
  HostAllocator host;
  Tensor t = Tensor::empty({3, 5000}, DType::f32, host, MemCategory::workspace);  // spans pages
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = float(i) * 0.5f;
  const std::string path = (dir.path / "t.safetensors").string();
  save_safetensors(path, {{"a", t}, {"b", t}});
  Checkpoint checkpoint(path);
  checkpoint.release("a");
  checkpoint.release("a");  // twice is harmless
  for (const char* name : {"a", "b"})
    CHECK(std::memcmp(checkpoint.view(name).data, t.data, t.size_bytes()) == 0);
}
