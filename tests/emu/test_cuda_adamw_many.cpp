// The CUDA backend's adamw_update_many and sum_squares_many (one launch over
// many tensors) against the CPU backend and against its own single-tensor
// ops, on tensors of odd sizes including empty and one-element ones.

#include <doctest/doctest.h>

#include <vector>

#include "tests/emu/cuda_test_util.h"

using namespace cuda_test;

namespace {

// Empty, one element, under one block, across the 2048-element chunks of
// adamw_update_many, and over 256 blocks of sum_squares (70001).
const std::vector<int64_t> kSizes = {5, 0, 1, 257, 2048, 2049, 70001};

struct AdamWState {
  Tensor param, m, v;
};

std::vector<AdamWState> host_states() {
  std::vector<AdamWState> states;
  for (size_t i = 0; i < kSizes.size(); ++i) {
    const unsigned seed = unsigned(40 + 3 * i);
    const Shape shape{kSizes[i]};
    states.push_back({host_random(shape, DType::f32, seed), host_random(shape, DType::f32, seed + 1, -0.1f, 0.1f),
                      host_random(shape, DType::f32, seed + 2, 0.0f, 0.01f)});
  }
  return states;
}

std::vector<AdamWState> device_states(const std::vector<AdamWState>& states) {
  std::vector<AdamWState> out;
  for (const AdamWState& s : states) out.push_back({to_device(s.param), to_device(s.m), to_device(s.v)});
  return out;
}

std::vector<AdamWTensors> operands(std::vector<AdamWState>& states, const std::vector<Tensor>& grads) {
  std::vector<AdamWTensors> tensors;
  for (size_t i = 0; i < states.size(); ++i)
    tensors.push_back({&states[i].param, &grads[i], &states[i].m, &states[i].v, i % 2 == 0});
  return tensors;
}

std::vector<float> all_values(const std::vector<AdamWState>& states) {
  std::vector<float> out;
  for (const AdamWState& s : states)
    for (const Tensor* t : {&s.param, &s.m, &s.v}) {
      std::vector<float> v = values(*t);
      out.insert(out.end(), v.begin(), v.end());
    }
  return out;
}

AdamWStep step_at(int64_t t) { return AdamWStep{1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 0.7f, t}; }

}  // namespace

TEST_CASE("cuda: adamw_update_many over several tensors and steps") {
  std::vector<AdamWState> start = host_states();
  std::vector<std::vector<Tensor>> grads(3);
  for (unsigned t = 0; t < 3; ++t)
    for (size_t i = 0; i < kSizes.size(); ++i)
      grads[t].push_back(host_random({kSizes[i]}, DType::f32, 70 + 10 * t + unsigned(i)));
  std::vector<AdamWState> want = host_states();
  for (int64_t t = 1; t <= 3; ++t) cpu.adamw_update_many(operands(want, grads[size_t(t - 1)]), step_at(t));
  std::vector<float> got = emu_test::same_under_schedules([&] {
    std::vector<AdamWState> states = device_states(start);
    for (int64_t t = 1; t <= 3; ++t) {
      std::vector<Tensor> device_grads;
      for (const Tensor& g : grads[size_t(t - 1)]) device_grads.push_back(to_device(g));
      gpu.adamw_update_many(operands(states, device_grads), step_at(t));
    }
    return all_values(states);
  });
  check_close(got, all_values(want), {1e-9, 1e-5});
  // The same element math as the single-tensor kernel: bit-identical to it.
  std::vector<AdamWState> single = device_states(start);
  for (int64_t t = 1; t <= 3; ++t)
    for (const AdamWTensors& x : operands(single, grads[size_t(t - 1)])) {
      Tensor grad = to_device(*x.grad);
      gpu.adamw_update(*x.param, grad, *x.m, *x.v, x.step_for(step_at(t)));
    }
  CHECK(got == all_values(single));
}

TEST_CASE("cuda: sum_squares_many is deterministic and adds the per-tensor sums in order") {
  std::vector<Tensor> host;
  for (size_t i = 0; i < kSizes.size(); ++i)
    host.push_back(host_random({kSizes[i]}, i % 3 == 1 ? DType::bf16 : DType::f32, 90 + unsigned(i), -3.0f, 3.0f));
  std::vector<const Tensor*> host_ptrs;
  for (const Tensor& x : host) host_ptrs.push_back(&x);
  const double want = cpu.sum_squares_many(host_ptrs);
  std::vector<Tensor> device;
  for (const Tensor& x : host) device.push_back(to_device(x));
  std::vector<const Tensor*> device_ptrs;
  for (const Tensor& x : device) device_ptrs.push_back(&x);
  std::vector<double> got =
      emu_test::same_under_schedules([&] { return std::vector<double>{gpu.sum_squares_many(device_ptrs)}; });
  CHECK(std::abs(got[0] - want) <= 1e-12 * want);
  // Each tensor's sum is the single-tensor op's, added in tensor order: exact.
  double singles = 0.0;
  for (const Tensor* x : device_ptrs) singles += gpu.sum_squares(*x);
  CHECK(got[0] == singles);
  CHECK(gpu.sum_squares_many({}) == 0.0);
}
