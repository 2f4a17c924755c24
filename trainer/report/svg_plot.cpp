#include "trainer/report/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace ft {

namespace {

constexpr double kLeftPx = 80, kRightPx = 90, kTopPx = 66, kBottomPx = 60;
constexpr double kAreaWidthPx = kPlotWidthPx - kLeftPx - kRightPx;
constexpr double kAreaHeightPx = kPlotHeightPx - kTopPx - kBottomPx;

// An axis from min to max with a tick every step, all round numbers.
struct Axis {
  double min = 0.0, max = 1.0, step = 0.2;
  double fraction(double value) const { return (value - min) / (max - min); }
};

// About five ticks at 1, 2 or 5 times a power of ten, covering [low, high].
Axis nice_axis(double low, double high) {
  if (!(low <= high)) low = 0.0, high = 1.0;  // no finite data
  if (low == high) {
    const double pad = low == 0.0 ? 1.0 : std::fabs(low) * 0.1;
    low -= pad, high += pad;
  }
  const double raw = (high - low) / 5.0;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double normalised = raw / magnitude;
  const double step = (normalised < 1.5 ? 1.0 : normalised < 3.0 ? 2.0 : normalised < 7.0 ? 5.0 : 10.0) * magnitude;
  return Axis{std::floor(low / step) * step, std::ceil(high / step) * step, step};
}

Axis axis_for(const LineChart& chart, bool x, bool right) {
  double low = std::numeric_limits<double>::infinity(), high = -low;
  for (const PlotSeries& s : chart.series) {
    if (!x && s.right_axis != right) continue;
    for (size_t i = 0; i < s.x.size(); ++i)
      if (std::isfinite(s.x[i]) && std::isfinite(s.y[i])) {
        const double v = x ? s.x[i] : s.y[i];
        low = std::min(low, v), high = std::max(high, v);
      }
  }
  return nice_axis(low, high);
}

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

std::string format(const char* pattern, double a, double b = 0.0) {
  char text[64];
  std::snprintf(text, sizeof text, pattern, a, b);
  return text;
}

// Tick values: min, min + step, ..., max; a value within rounding of zero is zero.
std::vector<double> ticks(const Axis& axis) {
  std::vector<double> values;
  const int count = int(std::lround((axis.max - axis.min) / axis.step));
  for (int i = 0; i <= count; ++i) {
    const double value = axis.min + i * axis.step;
    values.push_back(std::fabs(value) < axis.step * 1e-9 ? 0.0 : value);
  }
  return values;
}

double x_px(const Axis& x, double value) { return kLeftPx + x.fraction(value) * kAreaWidthPx; }
double y_px(const Axis& y, double value) { return kTopPx + (1.0 - y.fraction(value)) * kAreaHeightPx; }

// x null: no x ticks (a bar chart names its groups instead).
std::string axes_svg(const LineChart& chart, const Axis* x, const Axis& left, const Axis* right) {
  std::string svg;
  const double bottom = kTopPx + kAreaHeightPx, right_edge = kLeftPx + kAreaWidthPx;
  for (double v : ticks(left)) {
    const std::string y = format("%.2f", y_px(left, v));
    svg += "<line x1=\"" + format("%.0f", kLeftPx) + "\" x2=\"" + format("%.0f", right_edge) + "\" y1=\"" + y +
           "\" y2=\"" + y + "\" stroke=\"#e5e5e5\"/>\n";
    svg += "<text class=\"ytick-left\" x=\"" + format("%.0f", kLeftPx - 6) + "\" y=\"" + y +
           "\" text-anchor=\"end\" dominant-baseline=\"middle\">" + format("%g", v) + "</text>\n";
  }
  if (right)
    for (double v : ticks(*right))
      svg += "<text class=\"ytick-right\" x=\"" + format("%.0f", right_edge + 6) + "\" y=\"" +
             format("%.2f", y_px(*right, v)) + "\" dominant-baseline=\"middle\">" + format("%g", v) + "</text>\n";
  if (x)
    for (double v : ticks(*x))
      svg += "<text class=\"xtick\" x=\"" + format("%.2f", x_px(*x, v)) + "\" y=\"" + format("%.0f", bottom + 18) +
             "\" text-anchor=\"middle\">" + format("%g", v) + "</text>\n";
  svg += "<rect x=\"" + format("%.0f", kLeftPx) + "\" y=\"" + format("%.0f", kTopPx) + "\" width=\"" +
         format("%.0f", kAreaWidthPx) + "\" height=\"" + format("%.0f", kAreaHeightPx) +
         "\" fill=\"none\" stroke=\"#333\"/>\n";
  svg += "<text x=\"" + format("%.0f", kLeftPx + kAreaWidthPx / 2) + "\" y=\"" + format("%.0f", kPlotHeightPx - 14.0) +
         "\" text-anchor=\"middle\">" + escape(chart.x_label) + "</text>\n";
  const std::string middle = format("%.0f", kTopPx + kAreaHeightPx / 2);
  svg += "<text transform=\"translate(20," + middle + ") rotate(-90)\" text-anchor=\"middle\">" +
         escape(chart.left_label) + "</text>\n";
  if (right)
    svg += "<text transform=\"translate(" + format("%.0f", kPlotWidthPx - 16.0) + "," + middle +
           ") rotate(90)\" text-anchor=\"middle\">" + escape(chart.right_label) + "</text>\n";
  return svg;
}

std::string series_svg(const PlotSeries& s, const Axis& x, const Axis& y) {
  std::string points, dots;
  for (size_t i = 0; i < s.x.size(); ++i) {
    if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
    const std::string px = format("%.2f", x_px(x, s.x[i])), py = format("%.2f", y_px(y, s.y[i]));
    points += (points.empty() ? "" : " ") + px + "," + py;
    if (s.dots) dots += "<circle cx=\"" + px + "\" cy=\"" + py + "\" r=\"3.5\" fill=\"" + s.color + "\"/>\n";
  }
  if (points.empty()) return "";
  return "<polyline class=\"series\" data-label=\"" + escape(s.label) + "\" fill=\"none\" stroke=\"" + s.color +
         "\" stroke-width=\"" + (s.dots ? "2" : "1.5") + "\" points=\"" + points + "\"/>\n" + dots;
}

// One row above the plot area, so it never hides a line; text width is
// estimated (about 6.5 px per character at font-size 12).
std::string legend_svg(const LineChart& chart) {
  std::string svg;
  const std::string y = format("%.0f", kTopPx - 16);
  double x = kLeftPx;
  for (const PlotSeries& s : chart.series) {
    const std::string label = s.label + (s.right_axis ? " (right axis)" : "");
    svg += "<line x1=\"" + format("%.0f", x) + "\" x2=\"" + format("%.0f", x + 26) + "\" y1=\"" + y + "\" y2=\"" + y +
           "\" stroke=\"" + s.color + "\" stroke-width=\"2\"/>\n";
    if (s.dots) svg += "<circle cx=\"" + format("%.0f", x + 13) + "\" cy=\"" + y + "\" r=\"3.5\" fill=\"" + s.color + "\"/>\n";
    svg += "<text x=\"" + format("%.0f", x + 32) + "\" y=\"" + y + "\" dominant-baseline=\"middle\">" + escape(label) +
           "</text>\n";
    x += 32 + 6.5 * double(label.size()) + 24;
  }
  return svg;
}


std::string svg_header(const std::string& title) {
  std::string svg = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
                    std::to_string(kPlotWidthPx) + "\" height=\"" + std::to_string(kPlotHeightPx) +
                    "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  return svg + "<text x=\"" + format("%.0f", kPlotWidthPx / 2.0) +
         "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">" + escape(title) + "</text>\n";
}

// The left axis of a bar chart (ticks, grid, frame, label) and the group names under the plot area.
std::string bar_axes_svg(const BarChart& chart, const Axis& y) {
  LineChart frame;
  frame.left_label = chart.y_label;
  std::string svg = axes_svg(frame, nullptr, y, nullptr);
  const double group_px = kAreaWidthPx / double(std::max<size_t>(chart.groups.size(), 1));
  for (size_t g = 0; g < chart.groups.size(); ++g)
    svg += "<text class=\"group\" x=\"" + format("%.2f", kLeftPx + (double(g) + 0.5) * group_px) + "\" y=\"" +
           format("%.0f", kTopPx + kAreaHeightPx + 18) + "\" text-anchor=\"middle\">" + escape(chart.groups[g]) +
           "</text>\n";
  return svg;
}

}  // namespace

std::string render_bar_svg(const BarChart& chart) {
  double high = 0.0;
  for (const BarSeries& s : chart.series)
    for (double v : s.values)
      if (std::isfinite(v)) high = std::max(high, v);
  const Axis y = nice_axis(0.0, high > 0.0 ? high : 1.0);
  std::string svg = svg_header(chart.title) + bar_axes_svg(chart, y);
  const double group_px = kAreaWidthPx / double(std::max<size_t>(chart.groups.size(), 1));
  const double bar_px = group_px * 0.8 / double(std::max<size_t>(chart.series.size(), 1));
  for (size_t g = 0; g < chart.groups.size(); ++g)
    for (size_t k = 0; k < chart.series.size(); ++k) {
      const double value = g < chart.series[k].values.size() ? chart.series[k].values[g] : NAN;
      if (!std::isfinite(value)) continue;
      const double x = kLeftPx + double(g) * group_px + group_px * 0.1 + double(k) * bar_px;
      const double top = y_px(y, value), bottom = y_px(y, 0.0);
      svg += "<rect class=\"bar\" data-value=\"" + format("%.4f", value) + "\" x=\"" + format("%.2f", x) +
             "\" y=\"" + format("%.2f", top) + "\" width=\"" + format("%.2f", bar_px - 2.0) + "\" height=\"" +
             format("%.2f", bottom - top) + "\" fill=\"" + chart.series[k].color + "\"/>\n";
      svg += "<text class=\"bar-value\" x=\"" + format("%.2f", x + bar_px / 2 - 1.0) + "\" y=\"" +
             format("%.2f", top - 4) + "\" text-anchor=\"middle\" font-size=\"10\">" + format("%.3f", value) +
             "</text>\n";
    }
  double x = kLeftPx;  // the legend, one row above the plot area
  const std::string legend_y = format("%.0f", kTopPx - 16);
  for (const BarSeries& s : chart.series) {
    svg += "<rect x=\"" + format("%.0f", x) + "\" y=\"" + format("%.0f", kTopPx - 22) +
           "\" width=\"12\" height=\"12\" fill=\"" + s.color + "\"/>\n";
    svg += "<text x=\"" + format("%.0f", x + 18) + "\" y=\"" + legend_y + "\" dominant-baseline=\"middle\">" +
           escape(s.label) + "</text>\n";
    x += 18 + 6.5 * double(s.label.size()) + 24;
  }
  return svg + "</svg>\n";
}

std::string render_svg(const LineChart& chart) {
  const Axis x = axis_for(chart, true, false), left = axis_for(chart, false, false);
  const bool has_right =
      std::any_of(chart.series.begin(), chart.series.end(), [](const PlotSeries& s) { return s.right_axis; });
  const Axis right = axis_for(chart, false, true);
  std::string svg = svg_header(chart.title);
  svg += axes_svg(chart, &x, left, has_right ? &right : nullptr);
  for (const PlotSeries& s : chart.series) svg += series_svg(s, x, s.right_axis ? right : left);
  svg += legend_svg(chart);
  return svg + "</svg>\n";
}

}  // namespace ft
