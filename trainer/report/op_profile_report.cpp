#include "trainer/report/op_profile_report.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "kernels/error.h"
#include "model/atomic_file.h"

namespace ft {

namespace {

constexpr size_t kRowsShown = 8;  // on stdout; op_profile.json has every row

}  // namespace

bool op_profile_requested() {
  const char* value = std::getenv("FT_PROFILE_OPS");
  if (!value || !*value || std::string(value) == "0") return false;
  FT_CHECK(std::string(value) == "1", "FT_PROFILE_OPS: expected 1 (or 0), got '", value, "'");
  return true;
}

StepOpProfile::StepOpProfile(Backend& backend, std::ostream& log)
    : backend_(backend), enabled_(op_profile_requested() && backend.device() == Device::cpu) {
  if (op_profile_requested() && !enabled_)
    log << "FT_PROFILE_OPS: not profiled: the " << backend.name()
        << " backend's ops return before their kernels run (the CPU backend only)\n";
}

StepOpProfile::~StepOpProfile() { backend_.set_op_profile(nullptr); }

void StepOpProfile::begin_step() {
  if (!enabled_ || steps_begun_++ == 0) return;
  backend_.set_op_profile(&profile_);
  step_start_ = std::chrono::steady_clock::now();
}

void StepOpProfile::end_step() {
  if (!enabled_ || steps_begun_ < 2) return;
  step_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start_).count();
  steps_profiled_ += 1;
  backend_.set_op_profile(nullptr);
}

nlohmann::json StepOpProfile::to_json() const {
  if (steps_profiled_ == 0) return nullptr;
  nlohmann::json ops = nlohmann::json::array();
  double ops_seconds = 0.0;
  for (const OpProfile::Row& row : profile_.rows()) {
    ops.push_back({{"op", row.op}, {"path", row.path}, {"calls", row.calls}, {"seconds", row.seconds},
                   {"share", row.seconds / step_seconds_}});
    ops_seconds += row.seconds;
  }
  return {{"steps", steps_profiled_}, {"step_seconds", step_seconds_}, {"ops_share", ops_seconds / step_seconds_},
          {"ops", ops}};
}

void StepOpProfile::report(const std::string& output_dir, std::ostream& out) const {
  if (!enabled_) return;
  const nlohmann::json json = to_json();
  if (json.is_null()) {
    out << "FT_PROFILE_OPS: no step after the first to profile\n";
    return;
  }
  const std::string path = (std::filesystem::path(output_dir) / "op_profile.json").string();
  write_file_atomically(path, json.dump(1) + "\n");
  const double steps = double(steps_profiled_);
  char line[256];
  std::snprintf(line, sizeof line, "op profile (FT_PROFILE_OPS): %lld steps after the first, %.1f ms a step, "
                "%.1f%% of it in ops:\n", (long long)steps_profiled_, 1000.0 * step_seconds_ / steps,
                100.0 * json["ops_share"].get<double>());
  out << line;
  const nlohmann::json& ops = json["ops"];
  for (size_t i = 0; i < std::min(ops.size(), kRowsShown); ++i) {
    const nlohmann::json& row = ops[i];
    std::snprintf(line, sizeof line, "  %5.1f%% %9.2f ms %6.0f calls  %-26s %s\n", 100.0 * row["share"].get<double>(),
                  1000.0 * row["seconds"].get<double>() / steps, row["calls"].get<double>() / steps,
                  row["op"].get<std::string>().c_str(), row["path"].get<std::string>().c_str());
    out << line;
  }
  out << "  (a step's time and calls; every op: " << path << ")\n";
}

}  // namespace ft
