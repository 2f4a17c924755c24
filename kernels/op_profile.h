// Wall time and call count per Backend op, and the kernel and ISA each op
// ran on: the trainer's FT_PROFILE_OPS=1 (trainer/report/op_profile_report.h)
// attaches one to its backend (Backend::set_op_profile) for its training
// steps. Every public op of Backend opens an OpTimer, which costs one branch
// while no profile is attached. An op called inside another (the int8
// backward's matmul) counts as part of the outer op, not as a call of its
// own, so the rows' times add up to at most the profiled wall time. Not
// thread-safe: one thread issues a backend's ops (the trainer's).
#pragma once
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ft {

// The ISA the kernels library was compiled for (FT_MARCH): what an op runs
// on when it has no run-time choice of its own. "AVX2" for x86-64-v3.
const char* build_isa();

class OpProfile {
 public:
  struct Row {
    std::string op, path;  // path: the kernel and ISA, e.g. "oneDNN s8 brg:avx512_core_vnni"
    int64_t calls = 0;
    double seconds = 0.0;
  };
  // One row per (op, path) seen, most time first.
  std::vector<Row> rows() const;

  // For OpTimer: the outermost op's start and end (nested calls only count depth).
  void begin();
  void end(const char* op);
  // The kernel the running op took, as the concatenated parts; the last note
  // of an outer op and the ops inside it wins. An op with none ran build_isa().
  void note_path(std::initializer_list<std::string_view> parts);

 private:
  using Clock = std::chrono::steady_clock;
  std::map<std::pair<std::string, std::string>, Row> rows_;
  int depth_ = 0;
  Clock::time_point start_;
  std::string path_;
};

// Times the op call it lives in, into profile; nothing when profile is null.
class OpTimer {
 public:
  OpTimer(OpProfile* profile, const char* op) : profile_(profile), op_(op) {
    if (profile_) profile_->begin();
  }
  ~OpTimer() {
    if (profile_) profile_->end(op_);
  }
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

 private:
  OpProfile* profile_;
  const char* op_;
};

}  // namespace ft
