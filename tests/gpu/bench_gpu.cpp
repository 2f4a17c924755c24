// bench_gpu OUTPUT.json STEPS CONFIG.yaml...: the CUDA backend on a real GPU
// (scripts/bench_gpu runs it); bench_gpu OUTPUT.json --int8-only: part 2 alone.
//   1. Device ceilings, measured: bandwidth from a 1 GiB device-to-device copy
//      (read + write bytes / time), FLOP/s from an 8192^3 bf16 GEMM (cuBLASLt).
//   2. LLM.int8(): each INT8 linear op at the 1B and 20B shapes beside the
//      cuBLASLt bf16 and int8 GEMMs of the same shape, with every pass of the
//      op timed (measure_int8).
//   3. Each op on the shapes of a ~1B-parameter layer (8192 tokens, hidden
//      2048, MLP 5632, 16 heads of 128): time, and the bytes it must move or
//      the FLOPs it must do, as a fraction of the ceiling. An op that is not
//      implemented yet is reported with its error.
//   4. Training steps of each config (model, LoRA, precision, seq_len,
//      micro_batch_size, grad_accum_steps as given; random token ids; random
//      INT8 weights where the model folder has none): tokens/s and MFU, the
//      model FLOPs of a step over the measured GEMM ceiling. A LoRA step does
//      2 FLOPs per weight and token forward, 2 for dx and 2 more for a trained
//      weight's gradient; causal attention 2 T H D per layer and token forward
//      and twice that backward. Recomputation (checkpointing) is not counted.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <map>
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
#include "kernels/cuda/int8_linear.h"
#include "kernels/error.h"
#include "kernels/int8_tiles.h"
#include "model/causal_lm.h"
#include "model/families.h"
#include "model/rope.h"
#include "model/safetensors.h"
#include "trainer/device_backend.h"
#include "trainer/train_config.h"
#include "trainer/trainer.h"

using namespace ft;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) fail("bench_gpu: ", what, " failed: ", cudaGetErrorString(status));
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n == 0 ? 0.0 : (n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]));
}

// Median milliseconds of fn over `reps` runs after two warm-up runs, each
// run timed with its own pair of events on the default stream (the backend's).
double time_ms(const std::function<void()>& fn, int reps = 10) {
  fn();
  fn();
  std::vector<cudaEvent_t> events(size_t(reps) + 1);
  for (cudaEvent_t& event : events) check(cudaEventCreate(&event), "cudaEventCreate");
  check(cudaEventRecord(events[0], nullptr), "cudaEventRecord");
  for (int i = 0; i < reps; ++i) {
    fn();
    check(cudaEventRecord(events[size_t(i) + 1], nullptr), "cudaEventRecord");
  }
  check(cudaEventSynchronize(events.back()), "cudaEventSynchronize");
  std::vector<double> ms(static_cast<size_t>(reps), 0.0);
  for (int i = 0; i < reps; ++i) {
    float elapsed = 0.0f;
    check(cudaEventElapsedTime(&elapsed, events[size_t(i)], events[size_t(i) + 1]), "cudaEventElapsedTime");
    ms[size_t(i)] = elapsed;
  }
  for (cudaEvent_t event : events) cudaEventDestroy(event);
  return median(ms);
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

// ---- LLM.int8() at the 1B and 20B shapes -----------------------------------
// Each INT8 linear op beside the cuBLASLt GEMMs of the same shape, on random
// data (x with a few planted outlier columns, as LLM.int8() activations
// have), with each pass of the op timed by events between passes (median of
// reps, a pass that runs per row block or weight tile summed within a run).

// Host tensors of the random inputs (each copied to the device, then freed).
HostAllocator host_memory;

// Uniform f32 values in [lo, hi) on the host.
Tensor host_uniform(const Shape& shape, unsigned seed, float lo, float hi) {
  Tensor values = Tensor::empty(shape, DType::f32, host_memory, MemCategory::activations);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < values.numel(); ++i) values.ptr<float>()[i] = dist(rng);
  return values;
}

// host's values in a device tensor of dtype.
Tensor on_device(Backend& backend, const Tensor& host, DType dtype) {
  Tensor out = backend.empty(host.shape, dtype, MemCategory::activations);
  backend.copy(out, host);
  return out;
}

Tensor random_device(Backend& backend, const Shape& shape, DType dtype, unsigned seed, float lo, float hi) {
  return on_device(backend, host_uniform(shape, seed, lo, hi), dtype);
}

Tensor random_codes(Backend& backend, const Shape& shape, unsigned seed) {
  Tensor codes = Tensor::empty(shape, DType::i8, host_memory, MemCategory::weights);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(-127, 127);
  for (int64_t i = 0; i < codes.numel(); ++i) codes.ptr<int8_t>()[i] = int8_t(dist(rng));
  return on_device(backend, codes, DType::i8);
}

// x [N, K] in bf16, uniform in [-2, 2], with 6 columns holding +-8 (over the
// threshold of 6) in every 97th row.
Tensor activations_with_outliers(Backend& backend, int64_t N, int64_t K, unsigned seed) {
  Tensor values = host_uniform({N, K}, seed, -2.0f, 2.0f);
  for (int64_t c = 0; c < 6; ++c)
    for (int64_t n = 0; n < N; n += 97) values.ptr<float>()[n * K + (c * 977 + 13) % K] = n % 2 ? 8.0f : -8.0f;
  return on_device(backend, values, DType::bf16);
}

struct PassTimes {
  double total_ms;
  std::map<std::string, double> pass_ms;  // median over runs of each pass's summed time
};

// Runs op(context) twice to warm up, then `reps` times, each run bracketed by
// events and with an event after every pass (Int8Context::after_pass). With
// int8_gemm the forward runs fused on it.
PassTimes time_passes(const std::function<void(const cuda::Int8Context&)>& op, cuda::Gemm& gemm,
                      Allocator& allocator, cuda::Int8GemmEngine* int8_gemm = nullptr, int reps = 10) {
  std::vector<cudaEvent_t> pool(256);
  for (cudaEvent_t& event : pool) check(cudaEventCreate(&event), "cudaEventCreate");
  std::vector<std::string> names;
  cuda::Int8Context context{gemm, allocator, nullptr, int8_gemm, [&](const char* pass) {
                              FT_CHECK(names.size() + 1 < pool.size(), "bench_gpu: too many passes");
                              check(cudaEventRecord(pool[names.size() + 1], nullptr), "cudaEventRecord");
                              names.emplace_back(pass);
                            }};
  std::vector<double> totals;
  std::map<std::string, std::vector<double>> passes;
  for (int run = 0; run < reps + 2; ++run) {
    names.clear();
    check(cudaEventRecord(pool[0], nullptr), "cudaEventRecord");
    op(context);
    check(cudaEventRecord(pool[names.size() + 1], nullptr), "cudaEventRecord");
    check(cudaEventSynchronize(pool[names.size() + 1]), "cudaEventSynchronize");
    if (run < 2) continue;
    std::map<std::string, double> sums;
    for (size_t i = 0; i < names.size(); ++i) {
      float ms = 0.0f;
      check(cudaEventElapsedTime(&ms, pool[i], pool[i + 1]), "cudaEventElapsedTime");
      sums[names[i]] += ms;
    }
    float total = 0.0f;
    check(cudaEventElapsedTime(&total, pool[0], pool[names.size() + 1]), "cudaEventElapsedTime");
    totals.push_back(total);
    for (const auto& [name, ms] : sums) passes[name].push_back(ms);
  }
  for (cudaEvent_t event : pool) cudaEventDestroy(event);
  PassTimes times{median(totals), {}};
  for (const auto& [name, ms] : passes) times.pass_ms[name] = median(ms);
  return times;
}

json pass_row(const std::string& op, double flops, const PassTimes& times, const Ceilings& ceilings) {
  json row = {{"op", op},
              {"ms", times.total_ms},
              {"tflops", flops / (times.total_ms * 1e-3) / 1e12},
              {"fraction_of_gemm_ceiling", flops / (times.total_ms * 1e-3) / ceilings.flops_per_s},
              {"passes_ms", times.pass_ms}};
  return row;
}

json measure_int8_shape(CudaBackend& backend, Allocator& allocator, cuda::Gemm& gemm,
                        cuda::Int8GemmEngine* int8_gemm, int64_t N, int64_t K, int64_t O, const Ceilings& ceilings) {
  const int64_t r = 16;
  const double flops = 2.0 * double(N) * double(K) * double(O);
  char shape_text[64];
  std::snprintf(shape_text, sizeof(shape_text), "[%lld,%lld]->%lld", static_cast<long long>(N),
                static_cast<long long>(K), static_cast<long long>(O));
  const std::string shape = shape_text;
  Tensor x = activations_with_outliers(backend, N, K, 1);
  Tensor wq = random_codes(backend, {O, K}, 2), codes = random_codes(backend, {N, K}, 3);
  Tensor w_scales = random_device(backend, {O}, DType::f32, 4, 0.01f, 0.1f);
  Tensor w = random_device(backend, {O, K}, DType::bf16, 5, -0.05f, 0.05f);
  Tensor bias = random_device(backend, {O}, DType::bf16, 6, -0.1f, 0.1f);
  Tensor h = random_device(backend, {N, r}, DType::bf16, 7, -1.0f, 1.0f);
  Tensor B = random_device(backend, {O, r}, DType::bf16, 8, -0.1f, 0.1f);
  Tensor dout = random_device(backend, {N, O}, DType::bf16, 9, -1.0f, 1.0f);
  Tensor out = backend.empty({N, O}, DType::bf16, MemCategory::activations);
  Tensor dx = backend.empty({N, K}, DType::bf16, MemCategory::activations);
  Tensor product = backend.empty({N, O}, DType::i32, MemCategory::activations);
  const int64_t chunk = int8_forward_chunk_rows(N, O), gather = int8_outlier_gather_columns(K, O);
  const int64_t tile = int8_backward_tile_columns(O, K, kInt8DequantTileElementsGpu);
  json rows = json::array();
  auto add = [&](json row) {
    std::cout << row.dump() << std::endl;
    rows.push_back(std::move(row));
  };
  add(measure_op({"bf16 GEMM (cuBLASLt) x W^T " + shape, 0, flops, [&] { backend.matmul(out, x, w, false, true); }},
                 ceilings));
  add(measure_op({"int8 GEMM -> i32 (cuBLASLt) " + shape, 0, flops,
                  [&] {
                    cuda::GemmArgs args{};
                    args.m = O, args.n = N, args.k = K, args.batch = 1, args.alpha = 1.0f, args.beta = 0.0f;
                    args.a = {wq.data, DType::i8, true, K, 0};
                    args.b = {codes.data, DType::i8, false, K, 0};
                    args.c = {product.data, DType::i32, O, 0};
                    gemm.gemm(args, nullptr);
                  }},
                 ceilings));
  add(pass_row("int8_linear_forward " + shape, flops,
               time_passes([&](const cuda::Int8Context& c) {
                 cuda::int8_linear_forward(out, x, wq, w_scales, 6.0f, {}, chunk, gather, kInt8FusedOutlierColumns, c);
               }, gemm, allocator),
               ceilings));
  const Int8Epilogue epilogue{&bias, &h, &B, 2.0f};
  add(pass_row("int8_linear_forward + bias + LoRA r16 " + shape, flops,
               time_passes([&](const cuda::Int8Context& c) {
                 cuda::int8_linear_forward(out, x, wq, w_scales, 6.0f, epilogue, chunk, gather, kInt8FusedOutlierColumns,
                                           c);
               }, gemm, allocator),
               ceilings));
  // The same two forwards fused on CUTLASS's int8 GEMM (its epilogue
  // dequantises; outliers and LoRA as one small GEMM), where this GPU runs it.
  if (int8_gemm) {
    add(pass_row("int8_linear_forward fused (CUTLASS) " + shape, flops,
                 time_passes([&](const cuda::Int8Context& c) {
                   cuda::int8_linear_forward(out, x, wq, w_scales, 6.0f, {}, chunk, gather, kInt8FusedOutlierColumns,
                                             c);
                 }, gemm, allocator, int8_gemm),
                 ceilings));
    add(pass_row("int8_linear_forward fused (CUTLASS) + bias + LoRA r16 " + shape, flops,
                 time_passes([&](const cuda::Int8Context& c) {
                   cuda::int8_linear_forward(out, x, wq, w_scales, 6.0f, epilogue, chunk, gather,
                                             kInt8FusedOutlierColumns, c);
                 }, gemm, allocator, int8_gemm),
                 ceilings));
  }
  add(measure_op({"bf16 GEMM (cuBLASLt) dout W " + shape, 0, flops, [&] { backend.matmul(dx, dout, w, false, false); }},
                 ceilings));
  add(pass_row("int8_linear_backward " + shape, flops,
               time_passes([&](const cuda::Int8Context& c) {
                 cuda::int8_linear_backward(dx, dout, wq, w_scales, false, tile, c);
               }, gemm, allocator),
               ceilings));
  return rows;
}

// The 1B shapes (8192 tokens, hidden 2048: query_key_value-sized and MLP-sized
// outputs) and GPT-NeoX-20B's (2048 tokens: 6144 -> 18432 query_key_value,
// 18432 ... -> 6144 as the second 20B shape).
json measure_int8(CudaBackend& backend, Allocator& allocator, const Ceilings& ceilings) {
  std::unique_ptr<cuda::Gemm> gemm = cuda::make_gemm(cuda::GemmKind::cublaslt, allocator);
  std::unique_ptr<cuda::Int8GemmEngine> int8_gemm = cuda::make_library_int8_gemm(allocator);
  std::cout << "int8 GEMM engine: " << (int8_gemm ? "CUTLASS (sm_90a) beside cuBLASLt" : "cuBLASLt only") << std::endl;
  const int64_t shapes[][3] = {{8192, 2048, 2048}, {8192, 2048, 8192}, {2048, 6144, 18432}, {2048, 18432, 6144}};
  json rows = json::array();
  for (const auto& s : shapes) {
    try {
      for (json& row : measure_int8_shape(backend, allocator, *gemm, int8_gemm.get(), s[0], s[1], s[2], ceilings)) rows.push_back(row);
    } catch (const Error& error) {
      rows.push_back({{"shape", {s[0], s[1], s[2]}}, {"error", error.what()}});
      std::cout << rows.back().dump() << std::endl;
    }
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
  const size_t limit_bytes = device_allocation_limit_bytes(std::cout);
  DeviceAllocator device(limit_bytes);
  CachingAllocator caching(device);
  TrackingAllocator tracker(caching);
  CudaBackend backend(tracker);
  const bool random_weights = !has_weights(config.model);
  TrainingSetup setup = setup_training(config, read_model_config(config.model + "/config.json"), backend,
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
  std::vector<double> step_seconds;
  for (int i = 0; i < steps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    step();
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    step_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  const double seconds = median(step_seconds);
  const double tokens_per_s = double(config.grad_accum_steps * B * T) / seconds;
  const double mfu = tokens_per_s * flops_per_token(*model, T) / ceilings.flops_per_s;
  return {{"config", config_path},        {"random_weights", random_weights},
          {"precision", enum_name(config.precision)},
          {"tokens_per_step", config.grad_accum_steps * B * T},
          {"steps", steps},               {"step_s", seconds},
          {"tokens_per_s", tokens_per_s}, {"mfu", mfu},
          {"flops_per_token", flops_per_token(*model, T)},
          {"peak_memory_bytes", tracker.stats().total_peak_bytes},
          {"device_reserved_bytes", caching.stats().reserved_bytes},
          {"device_allocation_limit_bytes", limit_bytes}};
}

int run(int argc, char** argv) {
  FT_CHECK(argc >= 3, "usage: bench_gpu OUTPUT.json STEPS [CONFIG.yaml...] | bench_gpu OUTPUT.json --int8-only");
  const std::string output = argv[1];
  const bool int8_only = std::string(argv[2]) == "--int8-only";
  const int steps = int8_only ? 0 : std::stoi(argv[2]);
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
    report["int8"] = measure_int8(backend, caching, ceilings);
    caching.release_cached();
    if (int8_only) {
      std::ofstream(output) << report.dump(2) << "\n";
      return 0;
    }
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
