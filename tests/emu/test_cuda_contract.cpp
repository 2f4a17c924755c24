// One contract per op: the CPU backend, the CUDA backend (under the emulator)
// and the planner's meta backend reject the same bad calls with the same
// error, because Backend checks the arguments before any of them runs the op.
// Each case builds its operands on the backend under test (host, device or
// dataless meta tensors) and must throw there; the messages must agree.
#include <functional>
#include <string>

#include "kernels/meta/meta_backend.h"
#include "tests/emu/cuda_test_util.h"

using namespace cuda_test;

namespace {

MetaAllocator meta_allocator;
MetaBackend meta(meta_allocator, MemoryPolicy::cuda, 0);

Tensor make(Backend& be, const Shape& shape, DType dtype = DType::f32) {
  return be.empty(shape, dtype, MemCategory::activations);
}

// int8_linear_forward of x [2, 4] by a [3, 4] weight with one epilogue operand.
void int8_forward_with(Backend& be, const Tensor* Int8Epilogue::*operand, const Tensor& value) {
  Tensor out = make(be, {2, 3}), x = make(be, {2, 4}), w = make(be, {3, 4}, DType::i8), scales = make(be, {3});
  Int8Epilogue epilogue;
  epilogue.*operand = &value;
  be.int8_linear_forward(out, x, w, scales, 6.0f, epilogue);
}

struct BadCall {
  const char* what;
  std::function<void(Backend&)> call;
  const char* expected;  // part of the message
};

// The error each backend raises for the call ("" when none is raised).
std::string error_on(Backend& be, const BadCall& bad) {
  try {
    bad.call(be);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const BadCall kBadCalls[] = {
    {"rmsnorm_forward with bf16 statistics",
     [](Backend& be) {
       Tensor x = make(be, {4, 8}), out = make(be, {4, 8}), w = make(be, {8}), rstd = make(be, {4}, DType::bf16);
       be.rmsnorm_forward(out, rstd, x, w, 1e-5f);
     },
     "rmsnorm_forward: rstd must be f32, got bf16"},
    {"attention_forward with v of another head size",
     [](Backend& be) {
       Tensor q = make(be, {1, 4, 2, 8}), k = make(be, {1, 4, 2, 8}), v = make(be, {1, 4, 2, 4});
       Tensor out = make(be, {1, 4, 2, 8}), lse = make(be, {1, 2, 4});
       be.attention_forward(out, lse, q, k, v, 0.5f, 0);
     },
     "attention_forward: v has shape [1, 4, 2, 4], expected [1, 4, 2, 8]"},
    {"add of a transposed operand with as many elements",
     [](Backend& be) {
       Tensor out = make(be, {2, 3}), a = make(be, {3, 2}), b = make(be, {2, 3});
       be.add(out, a, b);
     },
     "add: a has shape [3, 2], expected [2, 3]"},
    {"matmul with mismatched inner dimensions",
     [](Backend& be) {
       Tensor out = make(be, {2, 3}), a = make(be, {2, 4}), b = make(be, {5, 3});
       be.matmul(out, a, b, false, false);
     },
     "expected op(a) [2, K] and op(b) [K, 3]"},
    {"int8_linear_forward with an f32 weight",
     [](Backend& be) {
       Tensor out = make(be, {2, 3}), x = make(be, {2, 4}), w = make(be, {3, 4}), scales = make(be, {3});
       be.int8_linear_forward(out, x, w, scales, 6.0f);
     },
     "int8_linear_forward: weight must be i8, got f32"},
    {"int8_linear_backward with a dx of the wrong width",
     [](Backend& be) {
       Tensor dx = make(be, {2, 5}), dout = make(be, {2, 3}), w = make(be, {3, 4}, DType::i8),
              scales = make(be, {3});
       be.int8_linear_backward(dx, dout, w, scales, false);
     },
     "int8_linear_backward: dx has shape [2, 5], expected [2, 4]"},
    {"int8_row_absmax with one scale per column",
     [](Backend& be) {
       Tensor absmax = make(be, {4}), x = make(be, {2, 4});
       be.int8_row_absmax(absmax, x, 6.0f);
     },
     "int8_row_absmax: absmax has shape [4] (4 elements), expected 2 elements"},
    {"int8_quantize_input with an outlier list one word short",
     [](Backend& be) {
       Tensor x = make(be, {2, 40});
       Int8Input input{make(be, {2, 40}, DType::i8), make(be, {2}), make(be, {42}, DType::i32)};
       be.int8_quantize_input(input, x, 6.0f);
     },
     "int8_quantize_input: input.outlier_columns has shape [42] (42 elements), expected 43 elements"},
    {"int8_linear_forward given an input quantised at another threshold",
     [](Backend& be) {
       Tensor out = make(be, {2, 3}), x = make(be, {2, 4}), w = make(be, {3, 4}, DType::i8), scales = make(be, {3});
       Int8Input input{make(be, {2, 4}, DType::i8), make(be, {2}), make(be, {6}, DType::i32), 5.0f};
       Int8Epilogue epilogue;
       epilogue.input = &input;
       be.int8_linear_forward(out, x, w, scales, 6.0f, epilogue);
     },
     "int8_linear_forward: the quantised input was made with threshold 5, the call's is 6"},
    {"accumulate_outer_products with a bf16 grad",
     [](Backend& be) {
       Tensor grad = make(be, {3, 4}, DType::bf16), a = make(be, {2, 3}), b = make(be, {2, 4});
       be.accumulate_outer_products(grad, a, b, 1.0f);
     },
     "accumulate_outer_products: grad must be f32, got bf16"},
    {"accumulate_outer_products with fewer rows of b than of a",
     [](Backend& be) {
       Tensor grad = make(be, {3, 4}), a = make(be, {2, 3}), b = make(be, {1, 4});
       be.accumulate_outer_products(grad, a, b, 1.0f);
     },
     "accumulate_outer_products: grad [3, 4] += a [2, 3]^T @ b [1, 4]: expected a [N, 3] and b [N, 4] with the same N"},
    {"int8_outlier_columns with f32 flags",
     [](Backend& be) {
       Tensor flags = make(be, {4}), x = make(be, {2, 4});
       be.int8_outlier_columns(flags, x, 6.0f);
     },
     "int8_outlier_columns: outlier_flags must be i32, got f32"},
    {"int8_linear_forward with one outlier flag per row",
     [](Backend& be) { int8_forward_with(be, &Int8Epilogue::outlier_flags, make(be, {2}, DType::i32)); },
     "int8_linear_forward: outlier_flags has shape [2] (2 elements), expected 4 elements"},
    {"int8_linear_forward with bf16 row_absmax",
     [](Backend& be) { int8_forward_with(be, &Int8Epilogue::row_absmax, make(be, {2}, DType::bf16)); },
     "int8_linear_forward: row_absmax must be f32, got bf16"},
    {"cross_entropy with bf16 losses",
     [](Backend& be) {
       Tensor logits = make(be, {2, 5}), targets = make(be, {2}, DType::i32), losses = make(be, {2}, DType::bf16);
       be.cross_entropy(losses, nullptr, logits, targets, 0.5f);
     },
     "cross_entropy: losses must be f32, got bf16"},
    {"adamw_update at step 0",
     [](Backend& be) {
       Tensor p = make(be, {4}), g = make(be, {4}), m = make(be, {4}), v = make(be, {4});
       be.adamw_update(p, g, m, v, {1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f, 0});
     },
     "adamw_update: step counts from 1, got 0"},
    {"dropout_forward with p > 1",
     [](Backend& be) {
       Tensor x = make(be, {4}), out = make(be, {4});
       be.dropout_forward(out, x, 1.5f, 7);
     },
     "dropout_forward: p must be in [0, 1], got 1.5"},
    {"add_uniform_noise with a negative magnitude",
     [](Backend& be) {
       Tensor x = make(be, {4});
       be.add_uniform_noise(x, -0.5f, 7);
     },
     "add_uniform_noise: magnitude must be finite and >= 0, got -0.5"},
    {"row_sum_squares with sums for another row count",
     [](Backend& be) {
       Tensor x = make(be, {2, 3, 5}), sums = make(be, {5});
       be.row_sum_squares(sums, x, false);
     },
     "row_sum_squares: sums has shape [5] (5 elements), expected 6 elements"},
    {"dora_scale_forward with bf16 weight_sum_squares",
     [](Backend& be) {
       Tensor out = make(be, {4, 6}), m = make(be, {6}), ss = make(be, {6}, DType::bf16);
       be.dora_scale_forward(out, out, m, ss, nullptr);
     },
     "dora_scale_forward: weight_sum_squares must be f32, got bf16"},
    {"dora_scale_backward with dz of another dtype than dout",
     [](Backend& be) {
       Tensor dout = make(be, {4, 6}), z = make(be, {4, 6}), dz = make(be, {4, 6}, DType::bf16);
       Tensor m = make(be, {6}), ss = make(be, {6}), dm = make(be, {6});
       be.dora_scale_backward(dz, nullptr, &dm, dout, z, m, ss, nullptr);
     },
     "dora_scale_backward: dz must be f32 as dout, got bf16"},
    {"rope_forward with more frequencies than head_dim holds",
     [](Backend& be) {
       Tensor x = make(be, {3, 2, 4}), positions = make(be, {3}, DType::i32);
       be.rope_forward(x, positions, std::vector<float>{1.0f, 0.5f, 0.25f});
     },
     "rope_forward: rotary_dim 6 (twice inv_freq's 3 entries) must be in (0, head_dim = 4]"},
    {"attention_forward with a negative sliding window",
     [](Backend& be) {
       Tensor q = make(be, {1, 4, 2, 8}), k = make(be, {1, 4, 2, 8});
       Tensor out = make(be, {1, 4, 2, 8}), lse = make(be, {1, 2, 4});
       be.attention_forward(out, lse, q, k, k, 0.5f, -1);
     },
     "attention_forward: sliding_window must be >= 0 (0: none), got -1"},
    {"layernorm_backward_add with a dresidual of another shape",
     [](Backend& be) {
       Tensor x = make(be, {4, 8}), dx = make(be, {4, 8}), dout = make(be, {4, 8}), dres = make(be, {8, 4});
       Tensor w = make(be, {8}), mean = make(be, {4}), rstd = make(be, {4});
       be.layernorm_backward_add(dx, nullptr, nullptr, dout, dres, x, w, mean, rstd);
     },
     "layernorm_backward_add: dresidual has shape [8, 4], expected [4, 8]"},
    {"biased_attention_forward causal over more keys than queries",
     [](Backend& be) {
       Tensor q = make(be, {1, 3, 2, 4}), k = make(be, {1, 5, 2, 4});
       Tensor out = make(be, {1, 3, 2, 4}), lse = make(be, {1, 2, 3});
       be.biased_attention_forward(out, lse, q, k, k, nullptr, nullptr, true);
     },
     "biased_attention_forward: causal attention needs as many keys as queries, got 5 and 3"},
    {"biased_attention_backward with a bf16 dbias",
     [](Backend& be) {
       Tensor q = make(be, {1, 3, 2, 4}), out = make(be, {1, 3, 2, 4}), lse = make(be, {1, 2, 3});
       Tensor dq = make(be, {1, 3, 2, 4}), dk = make(be, {1, 3, 2, 4}), dv = make(be, {1, 3, 2, 4});
       Tensor dbias = make(be, {3, 3, 2}, DType::bf16);
       be.biased_attention_backward(dq, dk, dv, &dbias, out, q, q, q, out, lse, nullptr, nullptr, false);
     },
     "biased_attention_backward: dbias must be f32"},
    {"activation_backward with a gate gradient but no gate",
     [](Backend& be) {
       Tensor x = make(be, {4, 8}), dx = make(be, {4, 8}), dup = make(be, {4, 8});
       be.activation_backward(dx, &dup, x, x, nullptr, Activation::gelu_tanh);
     },
     "activation_backward: dup needs up"},
};

}  // namespace

TEST_CASE("contract: the CPU, CUDA and meta backends reject a bad call with the same error") {
  for (const BadCall& bad : kBadCalls) {
    CAPTURE(bad.what);
    const std::string on_cpu = error_on(cpu, bad);
    CHECK(on_cpu.find(bad.expected) != std::string::npos);
    CHECK(error_on(gpu, bad) == on_cpu);
    CHECK(error_on(meta, bad) == on_cpu);
  }
}

// Aliasing is checked by address, which dataless meta tensors do not have:
// the CPU and CUDA backends agree, the planner cannot see it.
TEST_CASE("contract: the CPU and CUDA backends reject an aliasing matmul with the same error") {
  const BadCall bad{"matmul writing into its own input",
                    [](Backend& be) {
                      Tensor a = make(be, {4, 4}), b = make(be, {4, 4});
                      be.matmul(a, a, b, false, false);
                    },
                    "matmul: out must not alias a or b"};
  const std::string on_cpu = error_on(cpu, bad);
  CHECK(on_cpu.find(bad.expected) != std::string::npos);
  CHECK(error_on(gpu, bad) == on_cpu);
}

// A tensor on another device is named by the backend's own device.
TEST_CASE("contract: a host operand is rejected by the CUDA and meta backends") {
  Tensor host = make(cpu, {4});
  Tensor device = make(gpu, {4});
  CHECK_THROWS_WITH_AS(gpu.add(device, host, device), doctest::Contains("add: a must be a CUDA tensor"), Error);
  Tensor planned = make(meta, {4});
  CHECK_THROWS_WITH_AS(meta.add(planned, host, planned), doctest::Contains("add: a must be a meta tensor"), Error);
}
