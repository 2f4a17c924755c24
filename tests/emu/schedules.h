// Runs emulated kernels under several thread schedules. Results that differ
// between schedules expose missing barriers (a race across a barrier interval).
// Compiled by nvcc (the real-GPU build of the tests, tests/gpu/) there is one
// schedule, the hardware's: each helper runs once.
#pragma once
#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#if !defined(__CUDACC__)
#include "kernels/emu/cuda_emu.h"
#endif

namespace emu_test {

template <class T>
bool bit_identical(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

#if defined(__CUDACC__)

template <class F>
auto under_schedules(F run) {
  std::vector<decltype(run())> results;
  results.push_back(run());
  return results;
}

template <class F>
auto same_under_schedules(F run) {
  return run();
}

#else

// Calls run() once per cuda_emu::standard_schedules() entry and returns the
// results in that order; the previous schedule is restored afterwards.
template <class F>
auto under_schedules(F run) {
  struct Restore {
    cuda_emu::Schedule saved = cuda_emu::schedule();
    ~Restore() { cuda_emu::set_schedule(saved); }
  } restore;
  std::vector<decltype(run())> results;
  for (cuda_emu::Schedule s : cuda_emu::standard_schedules()) {
    cuda_emu::set_schedule(s);
    results.push_back(run());
  }
  return results;
}

// Requires bit-identical results under every schedule; returns the first.
template <class F>
auto same_under_schedules(F run) {
  auto results = under_schedules(run);
  std::vector<cuda_emu::Schedule> schedules = cuda_emu::standard_schedules();
  for (size_t i = 1; i < results.size(); ++i) {
    INFO("schedule ", cuda_emu::to_string(schedules[i]), " differs from ", cuda_emu::to_string(schedules[0]));
    REQUIRE(bit_identical(results[i], results[0]));
  }
  return results[0];
}

#endif

}  // namespace emu_test
