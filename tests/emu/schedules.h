// Runs emulated kernels under several thread schedules. Results that differ
// between schedules expose missing barriers (a race across a barrier interval).
#pragma once
#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include "kernels/emu/cuda_emu.h"

namespace emu_test {

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

template <class T>
bool bit_identical(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
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

}  // namespace emu_test
