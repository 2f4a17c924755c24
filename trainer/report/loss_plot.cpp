#include "trainer/report/loss_plot.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "kernels/error.h"
#include "model/atomic_file.h"

namespace ft {

namespace {

// row[key] as a number; NaN when absent or null (a step whose loss was not finite).
double number_or_nan(const nlohmann::json& row, const char* key) {
  const auto it = row.find(key);
  return it != row.end() && it->is_number() ? it->get<double>() : std::nan("");
}

}  // namespace

LineChart loss_chart(const std::string& metrics_path) {
  LineChart chart;
  chart.title = "Training run: loss and learning rate";
  chart.x_label = "step";
  chart.left_label = "loss (mean cross-entropy per token)";
  chart.right_label = "learning rate";
  PlotSeries train{"train loss", "#1f77b4", false, false, {}, {}};
  PlotSeries eval{"eval loss", "#d62728", false, true, {}, {}};
  PlotSeries lr{"learning rate", "#2ca02c", true, false, {}, {}};
  // Only a regular file is read: metrics.jsonl may be a device (/dev/full, /dev/null) or a pipe, which
  // reads forever or blocks.
  if (!std::filesystem::is_regular_file(metrics_path)) {
    chart.series = {train, eval, lr};
    return chart;
  }
  std::ifstream in(metrics_path);
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
    if (!row.is_object() || !row.contains("step") || !row["step"].is_number()) continue;
    const double step = row["step"].get<double>();
    if (row.contains("eval_loss")) {
      eval.x.push_back(step);
      eval.y.push_back(number_or_nan(row, "eval_loss"));
    } else if (row.contains("lr")) {
      train.x.push_back(step);
      train.y.push_back(number_or_nan(row, "loss"));
      lr.x.push_back(step);
      lr.y.push_back(number_or_nan(row, "lr"));
    }
  }
  chart.series = {train, eval, lr};
  return chart;
}

std::string loss_plot_path(const std::string& metrics_path) {
  return (std::filesystem::path(metrics_path).parent_path() / "loss.svg").string();
}

bool write_loss_plot(const std::string& metrics_path, std::string* error) {
  try {
    write_file_atomically(loss_plot_path(metrics_path), render_svg(loss_chart(metrics_path)));
    return true;
  } catch (const Error& e) {
    *error = e.what();
    return false;
  }
}

}  // namespace ft
