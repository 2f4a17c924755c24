// A line chart as SVG text: lines (with optional dots) against a shared x
// axis, each on the left or the right y axis, with ticks at round values,
// axis labels and a legend. Small and dependency-free, so a run can draw its
// pictures without Python; any browser shows them.
#pragma once
#include <string>
#include <vector>

namespace ft {

struct PlotSeries {
  std::string label;
  std::string color;         // CSS colour, e.g. "#1f77b4"
  bool right_axis = false;   // plotted against the right y axis
  bool dots = false;         // a dot at every point (for a few points, e.g. evaluations)
  std::vector<double> x, y;  // same length; non-finite points are left out
};

struct LineChart {
  std::string title, x_label, left_label, right_label;
  std::vector<PlotSeries> series;
};

// Grouped bars: one group per name in `groups`, one bar per series in each.
struct BarSeries {
  std::string label;
  std::string color;          // CSS colour, e.g. "#1f77b4"
  std::vector<double> values; // one per group
};

struct BarChart {
  std::string title, y_label;
  std::vector<std::string> groups;
  std::vector<BarSeries> series;
};

// Layout of the SVGs render_svg and render_bar_svg write, in pixels.
inline constexpr int kPlotWidthPx = 860, kPlotHeightPx = 480;

// The chart as a standalone SVG document. Each series is one <polyline>
// (class "series", its points in pixels with 2 decimals; a series with no
// finite point draws nothing); ticks are <text> elements of class "xtick",
// "ytick-left" or "ytick-right" whose content is the value at their x (xtick)
// or y (ytick) attribute, so the pixels map back to data.
std::string render_svg(const LineChart& chart);

// The bar chart as a standalone SVG document, the y axis from 0. Each bar is
// a <rect class="bar"> filled with its series' colour whose data-value
// attribute is its value; the value is also written above it.
std::string render_bar_svg(const BarChart& chart);

}  // namespace ft
