#include "kernels/op_profile.h"

#include <algorithm>

namespace ft {

// Compiled with the kernels' -march, so it names the ISA their loops were
// vectorised for.
const char* build_isa() {
#if defined(__AVX512F__)
  return "AVX-512";
#elif defined(__AVX2__)
  return "AVX2";
#else
  return "SSE2";
#endif
}

std::vector<OpProfile::Row> OpProfile::rows() const {
  std::vector<Row> rows;
  for (const auto& [key, row] : rows_) rows.push_back(row);
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.seconds > b.seconds; });
  return rows;
}

void OpProfile::begin() {
  if (depth_++ > 0) return;
  path_.clear();
  start_ = Clock::now();
}

void OpProfile::end(const char* op) {
  if (--depth_ > 0) return;
  const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
  std::pair<std::string, std::string> key{op, path_.empty() ? std::string(build_isa()) : path_};
  Row& row = rows_[key];
  if (row.calls == 0) row.op = key.first, row.path = key.second;
  row.calls += 1;
  row.seconds += seconds;
}

void OpProfile::note_path(std::initializer_list<std::string_view> parts) {
  path_.clear();
  for (std::string_view part : parts) path_ += part;
}

}  // namespace ft
