// FT_PROFILE_OPS=1: where a run's training steps spend their time, per
// Backend op and the kernel and ISA it ran on (kernels/op_profile.h), written
// by rank 0 to output_dir/op_profile.json and summarised on stdout when
// training ends. The process's first step is left out: its calls create
// oneDNN's primitives and fill the allocator's cache. CPU backend only: a
// CUDA op returns before its kernel has run.
#pragma once
#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

#include "kernels/backend.h"

namespace ft {

// Whether FT_PROFILE_OPS asks for the profile: "1"; unset, empty or "0" do not.
bool op_profile_requested();

class StepOpProfile {
 public:
  // Profiles backend's steps when requested and backend is the CPU's (says
  // on log when it is requested elsewhere).
  StepOpProfile(Backend& backend, std::ostream& log);
  ~StepOpProfile();
  StepOpProfile(const StepOpProfile&) = delete;
  StepOpProfile& operator=(const StepOpProfile&) = delete;

  // Around each training step: its ops timed, its wall time added.
  void begin_step();
  void end_step();
  // {"steps", "step_seconds", "ops_share", "ops": [{"op", "path", "calls",
  // "seconds", "share"}]}, share = of the profiled steps' wall time; null
  // when no step was profiled.
  nlohmann::json to_json() const;
  // Writes output_dir/op_profile.json and the largest rows on out.
  void report(const std::string& output_dir, std::ostream& out) const;

 private:
  Backend& backend_;
  bool enabled_;
  int64_t steps_begun_ = 0, steps_profiled_ = 0;
  double step_seconds_ = 0.0;
  std::chrono::steady_clock::time_point step_start_;
  OpProfile profile_;
};

}  // namespace ft
