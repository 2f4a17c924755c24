// The run's picture: loss.svg beside metrics.jsonl, train and eval loss
// against the step, the learning rate on the right axis (svg_plot.h).
#pragma once
#include <string>

#include "trainer/report/svg_plot.h"

namespace ft {

// The chart of a metrics.jsonl as Progress writes it: rows with "loss" and
// "lr" (training steps) and rows with "eval_loss", each at its "step".
// Lines that are not such rows (a torn last line after a crash) are skipped;
// a missing file, or one that is not a regular file, gives an empty chart.
LineChart loss_chart(const std::string& metrics_path);

// metrics_path's folder / "loss.svg".
std::string loss_plot_path(const std::string& metrics_path);

// Rewrites loss_plot_path(metrics_path) from the file, atomically. Returns
// false, with the reason in *error, when it cannot be written (a full disk):
// a picture is not worth stopping a run for.
bool write_loss_plot(const std::string& metrics_path, std::string* error);

}  // namespace ft
