// bench_gpu OUTPUT.json STEPS CONFIG.yaml...: the CUDA backend on a real GPU
// (scripts/bench_gpu runs it).
//   1. Device ceilings, measured: bandwidth from a 1 GiB device-to-device copy
//      (read + write bytes / time), FLOP/s from an 8192^3 bf16 GEMM (cuBLASLt).
//   2. Each op on the shapes of a ~1B-parameter layer (8192 tokens, hidden
//      2048, MLP 5632, 16 heads of 128): time, and the bytes it must move or
//      the FLOPs it must do, as a fraction of the ceiling. An op that is not
//      implemented yet is reported with its error.
//   3. Training steps of each config (model, LoRA, precision, seq_len,
//      micro_batch_size, grad_accum_steps as given; random token ids; random
//      INT8 weights where the model folder has none): tokens/s and MFU, the
//      model FLOPs of a step over the measured GEMM ceiling. A LoRA step does
//      2 FLOPs per weight and token forward, 2 for dx and 2 more for a trained
//      weight's gradient; causal attention 2 T H D per layer and token forward
//      and twice that backward. Recomputation (checkpointing) is not counted.
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/error.h"
#include "model/causal_lm.h"
#include "model/rope.h"
#include "model/safetensors.h"
#include "trainer/train_config.h"
#include "trainer/trainer.h"

using namespace ft;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) fail("bench_gpu: ", what, " failed: ", cudaGetErrorString(status));
}

// Mean milliseconds of fn over `reps` runs after two warm-up runs, timed with
// events on the default stream (the backend's).
double time_ms(const std::function<void()>& fn, int reps = 10) {
  fn();
  fn();
  cudaEvent_t start, end;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&end), "cudaEventCreate");
  check(cudaEventRecord(start, nullptr), "cudaEventRecord");
  for (int i = 0; i < reps; ++i) fn();
  check(cudaEventRecord(end, nullptr), "cudaEventRecord");
  check(cudaEventSynchronize(end), "cudaEventSynchronize");
  float ms = 0.0f;
  check(cudaEventElapsedTime(&ms, start, end), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  return double(ms) / reps;
}

struct Ceilings {
  double bytes_per_s, flops_per_s;
};

Ceilings measure_ceilings(Backend& backend) {
  const int64_t copy_bytes = int64_t(1) << 30;
  Tensor src = backend.empty({copy_bytes}, DType::i8, MemCategory::workspace);
  Tensor dst = backend.empty({copy_bytes}, DType::i8, MemCategory::workspace);
  backend.fill(src, 1.0f);
  const double copy_ms = time_ms([&] {
    check(cudaMemcpyAsync(dst.data, src.data, size_t(copy_bytes), cudaMemcpyDeviceToDevice, nullptr), "cudaMemcpy");
  });
  const int64_t n = 8192;
  Tensor a = backend.empty({n, n}, DType::bf16, MemCategory::workspace);
  Tensor b = backend.empty({n, n}, DType::bf16, MemCategory::workspace);
  Tensor c = backend.empty({n, n}, DType::bf16, MemCategory::workspace);
  backend.fill(a, 0.01f);
  backend.fill(b, 0.01f);
  const double gemm_ms = time_ms([&] { backend.matmul(c, a, b, false, true); });
  return {2.0 * double(copy_bytes) / (copy_ms * 1e-3), 2.0 * double(n) * double(n) * double(n) / (gemm_ms * 1e-3)};
}

// One op's figures: bytes it must move (memory-bound ops) or FLOPs it must do.
struct OpCase {
  std::string name;
  double bytes = 0, flops = 0;
  std::function<void()> run;
};

json measure_op(const OpCase& op, const Ceilings& ceilings) {
  json row = {{"op", op.name}};
  try {
    const double ms = time_ms(op.run);
    row["ms"] = ms;
    if (op.flops > 0) {
      row["tflops"] = op.flops / (ms * 1e-3) / 1e12;
      row["fraction_of_gemm_ceiling"] = op.flops / (ms * 1e-3) / ceilings.flops_per_s;
    } else {
      row["gb_per_s"] = op.bytes / (ms * 1e-3) / 1e9;
      row["fraction_of_copy_ceiling"] = op.bytes / (ms * 1e-3) / ceilings.bytes_per_s;
    }
  } catch (const Error& error) {
    row["error"] = error.what();
  }
  return row;
}

Tensor filled(Backend& backend, const Shape& shape, DType dtype, float value) {
  Tensor t = backend.empty(shape, dtype, MemCategory::activations);
  backend.fill(t, value);
  return t;
}

json measure_ops(Backend& backend, const Ceilings& ceilings) {
  const int64_t B = 4, T = 2048, N = B * T, C = 2048, I = 5632, H = 16, D = 128, V = 32000, P = 16 << 20;
  const DType bf = DType::bf16, f32 = DType::f32;
  const std::vector<float> rope_inv_freq = default_rope_inv_freq(1e4f, D);
  HostAllocator host;
  Tensor host_ids = Tensor::empty({N}, DType::i32, host, MemCategory::activations);
  Tensor host_positions = Tensor::empty({N}, DType::i32, host, MemCategory::activations);
  for (int64_t i = 0; i < N; ++i) host_ids.ptr<int32_t>()[i] = int32_t((i * 7919) % V);
  for (int64_t i = 0; i < N; ++i) host_positions.ptr<int32_t>()[i] = int32_t(i % T);
  Tensor ids = backend.empty({N}, DType::i32, MemCategory::activations);
  Tensor positions = backend.empty({N}, DType::i32, MemCategory::activations);
  backend.copy(ids, host_ids);
  backend.copy(positions, host_positions);

  Tensor x = filled(backend, {N, C}, bf, 0.5f), y = filled(backend, {N, C}, bf, 0.0f);
  Tensor dx = filled(backend, {N, C}, bf, 0.0f), w = filled(backend, {C, C}, bf, 0.01f);
  Tensor norm_w = filled(backend, {C}, bf, 1.0f), rstd = filled(backend, {N}, f32, 1.0f);
  Tensor dnorm_w = filled(backend, {C}, f32, 0.0f);
  Tensor w8 = filled(backend, {C, C}, DType::i8, 3.0f), w8_scales = filled(backend, {C}, f32, 0.1f);
  Tensor gate = filled(backend, {N, I}, bf, 0.5f), up = filled(backend, {N, I}, bf, 0.5f);
  Tensor act = filled(backend, {N, I}, bf, 0.0f), dgate = filled(backend, {N, I}, bf, 0.0f);
  Tensor dup = filled(backend, {N, I}, bf, 0.0f);
  Tensor q = filled(backend, {B, T, H, D}, bf, 0.1f), k = filled(backend, {B, T, H, D}, bf, 0.1f);
  Tensor v = filled(backend, {B, T, H, D}, bf, 0.1f), attn = filled(backend, {B, T, H, D}, bf, 0.0f);
  Tensor lse = filled(backend, {B, H, T}, f32, 0.0f), dq = filled(backend, {B, T, H, D}, bf, 0.0f);
  Tensor dk = filled(backend, {B, T, H, D}, bf, 0.0f), dv = filled(backend, {B, T, H, D}, bf, 0.0f);
  // f32 operands take the f32 FMA kernels (attention.cu), bf16 the tensor-core ones (attention_tc.cu).
  Tensor q32 = filled(backend, {B, T, H, D}, f32, 0.1f), attn32 = filled(backend, {B, T, H, D}, f32, 0.0f);
  Tensor dq32 = filled(backend, {B, T, H, D}, f32, 0.0f), dk32 = filled(backend, {B, T, H, D}, f32, 0.0f);
  Tensor dv32 = filled(backend, {B, T, H, D}, f32, 0.0f);
  const int64_t loss_rows = 1024;  // a loss chunk
  Tensor logits = filled(backend, {loss_rows, V}, f32, 0.0f), losses = filled(backend, {loss_rows}, f32, 0.0f);
  Tensor table = filled(backend, {V, C}, bf, 0.01f);
  Tensor param = filled(backend, {P}, f32, 0.1f), grad = filled(backend, {P}, f32, 0.01f);
  Tensor m = filled(backend, {P}, f32, 0.0f), m2 = filled(backend, {P}, f32, 0.0f);
  Tensor wide = filled(backend, {N, C}, f32, 0.0f);
  Tensor q_rows = q.reshaped({N, H, D});
  const float scale = 1.0f / std::sqrt(float(D));
  const double bf16_nc = 2.0 * double(N * C), bf16_ni = 2.0 * double(N * I);
  const double attention_flops = 4.0 * double(B * H) * double(T) * double(T) * double(D) / 2.0;  // causal
  Tensor targets = ids.slice_rows(0, loss_rows);
  std::vector<OpCase> ops = {
      {"matmul bf16 [8192,2048]x[2048,2048]^T", 0, 2.0 * N * C * C, [&] { backend.matmul(y, x, w, false, true); }},
      {"int8_linear_forward [8192,2048]x[2048,2048]", 0, 2.0 * N * C * C,
       [&] { backend.int8_linear_forward(y, x, w8, w8_scales, 6.0f); }},
      {"int8_linear_backward [8192,2048]x[2048,2048]", 0, 2.0 * N * C * C,
       [&] { backend.int8_linear_backward(dx, y, w8, w8_scales, false); }},
      {"attention_forward bf16 (cuDNN SDPA if built, else tensor cores) causal B4 T2048 H16 D128", 0, attention_flops,
       [&] { backend.attention_forward(attn, lse, q, k, v, scale, 0); }},
      {"attention_backward bf16 (cuDNN SDPA if built, else tensor cores) causal B4 T2048 H16 D128", 0, 2.5 * attention_flops,
       [&] { backend.attention_backward(dq, dk, dv, attn, q, k, v, attn, lse, scale, 0); }},
      {"attention_forward f32 FMA causal B4 T2048 H16 D128", 0, attention_flops,
       [&] { backend.attention_forward(attn32, lse, q32, q32, q32, scale, 0); }},
      {"attention_backward f32 FMA causal B4 T2048 H16 D128", 0, 2.5 * attention_flops,
       [&] { backend.attention_backward(dq32, dk32, dv32, attn32, q32, q32, q32, attn32, lse, scale, 0); }},
      {"rmsnorm_forward bf16 [8192,2048]", 2 * bf16_nc + 4.0 * N, 0,
       [&] { backend.rmsnorm_forward(y, rstd, x, norm_w, 1e-5f); }},
      {"rmsnorm_backward bf16 [8192,2048]", 3 * bf16_nc + 4.0 * N, 0,
       [&] { backend.rmsnorm_backward(dx, &dnorm_w, y, x, norm_w, rstd); }},
      {"rope_forward bf16 [8192,16,128]", 2 * bf16_nc, 0, [&] { backend.rope_forward(q_rows, positions, rope_inv_freq); }},
      {"swiglu_forward bf16 [8192,5632]", 3 * bf16_ni, 0, [&] { backend.swiglu_forward(act, gate, up); }},
      {"swiglu_backward bf16 [8192,5632]", 5 * bf16_ni, 0, [&] { backend.swiglu_backward(dgate, dup, act, gate, up); }},
      {"cross_entropy f32 [1024,32000] dlogits in place", 2.0 * 4.0 * double(loss_rows * V), 0,
       [&] { backend.cross_entropy(losses, &logits, logits, targets, 1.0f / float(loss_rows)); }},
      {"embedding_forward bf16 [8192,2048]", 2 * bf16_nc, 0, [&] { backend.embedding_forward(y, ids, table); }},
      {"dropout_forward bf16 [8192,2048]", 2 * bf16_nc, 0, [&] { backend.dropout_forward(y, x, 0.1f, 7); }},
      {"add bf16 [8192,2048]", 3 * bf16_nc, 0, [&] { backend.add(y, x, y); }},
      {"copy bf16->f32 [8192,2048]", bf16_nc + 4.0 * N * C, 0, [&] { backend.copy(wide, x); }},
      {"adamw_update f32 16M", 7.0 * 4.0 * P, 0,
       [&] { backend.adamw_update(param, grad, m, m2, AdamWStep{1e-4f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f, 1}); }},
      {"sum_squares f32 16M", 4.0 * P, 0, [&] { backend.sum_squares(grad); }},
  };
  json rows = json::array();
  for (const OpCase& op : ops) {
    rows.push_back(measure_op(op, ceilings));
    std::cout << rows.back().dump() << std::endl;
  }
  return rows;
}

bool has_weights(const std::string& model_dir) {
  return fs::exists(fs::path(model_dir) / "model.safetensors") ||
         fs::exists(fs::path(model_dir) / "model.safetensors.index.json");
}

// FLOPs of one training token (see the file comment).
double flops_per_token(CausalLM& model, int64_t seq_len) {
  const ModelConfig& c = model.config();
  double flops = 0.0;
  for (std::deque<Parameter>* list : {&model.parameters(), &model.adapters()})
    for (const Parameter& p : *list) {
      const bool input_embedding = p.name.find("embed_tokens") != std::string::npos ||
                                   p.name.find("embed_in") != std::string::npos;
      if (p.value.ndim() != 2 || input_embedding) continue;
      flops += (p.trainable() ? 6.0 : 4.0) * double(p.value.numel());
    }
  if (c.tie_word_embeddings) flops += 4.0 * double(c.vocab_size) * double(c.hidden_size);
  const double attention_forward = 2.0 * double(seq_len) * double(c.hidden_size);  // causal: half of 4 T H D
  return flops + 3.0 * attention_forward * double(c.num_hidden_layers);
}

json measure_training(const std::string& config_path, int steps, const Ceilings& ceilings) {
  TrainConfig config = load_train_config(config_path);
  DeviceAllocator device;
  CachingAllocator caching(device);
  TrackingAllocator tracker(caching);
  CudaBackend backend(tracker);
  const bool random_weights = !has_weights(config.model);
  TrainingSetup setup = setup_training(config, ModelConfig::from_json_file(config.model + "/config.json"), backend,
                                       [&](LanguageModel& model) {
                                         if (random_weights) model.init_random(config.seed);
                                         else model.load(Checkpoint(config.model));
                                       });
  CausalLM* model = &causal_lm(*setup.model, "bench_gpu");
  AdamW* optimizer = setup.optimizer.get();

  HostAllocator host;
  const int64_t B = config.micro_batch_size, T = config.seq_len, vocab = model->config().vocab_size;
  Tensor ids = Tensor::empty({B, T}, DType::i32, host, MemCategory::activations);
  Tensor targets = Tensor::empty({B, T}, DType::i32, host, MemCategory::activations);
  std::mt19937 rng(uint32_t(config.seed));
  for (int64_t i = 0; i < B * T; ++i) ids.ptr<int32_t>()[i] = int32_t(rng() % uint32_t(vocab));
  for (int64_t i = 0; i < B * T; ++i) targets.ptr<int32_t>()[i] = (i + 1) % T ? ids.ptr<int32_t>()[i + 1] : -100;
  auto step = [&] {
    model->zero_grads();
    for (int64_t i = 0; i < config.grad_accum_steps; ++i)
      model->forward_backward(ids, targets, 1.0f / float(config.grad_accum_steps));
    optimizer->step(config.lr);
  };
  step();  // warm-up: fills the caching allocator, cuBLASLt picks its algorithms
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  tracker.reset_peaks();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step();
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double tokens = double(steps) * double(config.grad_accum_steps * B * T);
  const double tokens_per_s = tokens / seconds;
  const double mfu = tokens_per_s * flops_per_token(*model, T) / ceilings.flops_per_s;
  return {{"config", config_path},        {"random_weights", random_weights},
          {"precision", enum_name(config.precision)},
          {"tokens_per_step", config.grad_accum_steps * B * T},
          {"steps", steps},               {"step_s", seconds / steps},
          {"tokens_per_s", tokens_per_s}, {"mfu", mfu},
          {"flops_per_token", flops_per_token(*model, T)},
          {"peak_memory_bytes", tracker.stats().total_peak_bytes},
          {"device_reserved_bytes", caching.stats().reserved_bytes}};
}

int run(int argc, char** argv) {
  FT_CHECK(argc >= 4, "usage: bench_gpu OUTPUT.json STEPS CONFIG.yaml...");
  const std::string output = argv[1];
  const int steps = std::stoi(argv[2]);
  cudaDeviceProp properties;
  check(cudaGetDeviceProperties(&properties, 0), "cudaGetDeviceProperties");
  json report = {{"device", properties.name}};
  {
    DeviceAllocator device;
    CachingAllocator caching(device);
    CudaBackend backend(caching);
    const Ceilings ceilings = measure_ceilings(backend);
    report["ceilings"] = {{"copy_gb_per_s", ceilings.bytes_per_s / 1e9},
                          {"bf16_gemm_tflops", ceilings.flops_per_s / 1e12}};
    std::cout << report.dump() << std::endl;
    report["ops"] = measure_ops(backend, ceilings);
    caching.release_cached();  // the training runs bring their own allocators
    report["training"] = json::array();
    for (int i = 3; i < argc; ++i) {
      json row;
      try {
        row = measure_training(argv[i], steps, ceilings);
      } catch (const Error& error) {
        row = {{"config", argv[i]}, {"error", error.what()}};
      }
      std::cout << row.dump() << std::endl;
      report["training"].push_back(row);
    }
  }
  std::ofstream(output) << report.dump(2) << "\n";
  std::cout << "written: " << output << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    std::cerr << "error: " << error.what() << "\n";
    return 1;
  }
}
