// loss.svg: well-formed XML whose polylines, read back through the tick
// labels' positions, give the metrics' values; Progress redraws it beside
// metrics.jsonl at each evaluation and at the end. A comparison's ROUGE bar
// chart: its bars' heights, read back the same way, are the scores.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "trainer/cli/compare.h"
#include "trainer/report/loss_plot.h"
#include "trainer/report/progress.h"

namespace fs = std::filesystem;

namespace {

struct Element {
  std::string name;
  std::map<std::string, std::string> attributes;
  std::string text;  // character data up to the next tag
};

// A strict reader for the XML subset an SVG file needs: declaration, nested
// and empty-element tags, double-quoted attributes, character data with the
// five predefined entities. Fails the test on anything not well-formed:
// unbalanced or mismatched tags, an unquoted or duplicate attribute, a bare
// '<' or '&'.
std::vector<Element> parse_xml(const std::string& xml) {
  std::vector<Element> elements;
  std::vector<std::string> open;
  size_t i = 0;
  auto check_text = [](const std::string& text) {
    for (size_t at = text.find('&'); at != std::string::npos; at = text.find('&', at + 1)) {
      const std::string rest = text.substr(at, 6);
      const bool entity = rest.rfind("&amp;", 0) == 0 || rest.rfind("&lt;", 0) == 0 || rest.rfind("&gt;", 0) == 0 ||
                          rest.rfind("&quot;", 0) == 0 || rest.rfind("&apos;", 0) == 0;
      REQUIRE_MESSAGE(entity, "bare & in ", text);
    }
  };
  if (xml.rfind("<?xml", 0) == 0) i = xml.find("?>") + 2;
  while (i < xml.size()) {
    const size_t lt = xml.find('<', i);
    if (lt == std::string::npos) break;
    const size_t gt = xml.find('>', lt);
    REQUIRE(gt != std::string::npos);
    std::string tag = xml.substr(lt + 1, gt - lt - 1);
    REQUIRE(tag.find('<') == std::string::npos);
    const size_t next = xml.find('<', gt);
    const std::string text = xml.substr(gt + 1, (next == std::string::npos ? xml.size() : next) - gt - 1);
    check_text(text);
    i = gt + 1;
    if (tag[0] == '/') {
      REQUIRE(!open.empty());
      CHECK(open.back() == tag.substr(1));
      open.pop_back();
      continue;
    }
    REQUIRE_MESSAGE((elements.empty() || !open.empty()), "content after the root element");
    const bool empty = tag.back() == '/';
    if (empty) tag.pop_back();
    Element element;
    std::istringstream in(tag);
    in >> element.name;
    size_t at = element.name.size();
    while (true) {
      while (at < tag.size() && std::isspace(static_cast<unsigned char>(tag[at]))) ++at;
      if (at >= tag.size()) break;
      const size_t equals = tag.find('=', at);
      REQUIRE(equals != std::string::npos);
      REQUIRE(tag[equals + 1] == '"');
      const size_t close = tag.find('"', equals + 2);
      REQUIRE(close != std::string::npos);
      const std::string key = tag.substr(at, equals - at), value = tag.substr(equals + 2, close - equals - 2);
      check_text(value);
      CHECK(element.attributes.emplace(key, value).second);
      at = close + 1;
    }
    element.text = text;
    elements.push_back(element);
    if (!empty) open.push_back(element.name);
  }
  CHECK(open.empty());
  return elements;
}

// pixel = a + b * value, from the first and last tick of a class.
struct Scale {
  double a = 0, b = 1;
  double value(double pixel) const { return (pixel - a) / b; }
};

Scale scale_from_ticks(const std::vector<Element>& elements, const std::string& tick_class, const char* coordinate) {
  std::vector<std::pair<double, double>> ticks;  // value, pixel
  for (const Element& e : elements)
    if (e.attributes.count("class") && e.attributes.at("class") == tick_class)
      ticks.emplace_back(std::stod(e.text), std::stod(e.attributes.at(coordinate)));
  REQUIRE(ticks.size() >= 2);
  const double b = (ticks.back().second - ticks.front().second) / (ticks.back().first - ticks.front().first);
  const Scale scale{ticks.front().second - b * ticks.front().first, b};
  for (const auto& [value, pixel] : ticks) CHECK(std::fabs(pixel - (scale.a + scale.b * value)) <= 0.011);  // evenly spaced
  return scale;
}

// The polyline's points mapped back to data.
std::vector<std::pair<double, double>> series_points(const std::vector<Element>& elements, const std::string& label,
                                                     const Scale& x, const Scale& y) {
  for (const Element& e : elements) {
    if (e.name != "polyline" || e.attributes.at("data-label") != label) continue;
    std::vector<std::pair<double, double>> points;
    std::istringstream in(e.attributes.at("points"));
    std::string pair;
    while (in >> pair) {
      const size_t comma = pair.find(',');
      points.emplace_back(x.value(std::stod(pair.substr(0, comma))), y.value(std::stod(pair.substr(comma + 1))));
    }
    return points;
  }
  FAIL("no polyline labelled ", label);
  return {};
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Within the rounding of pixels printed with 2 decimals (the points and the ticks the scale comes from).
void check_close(double got, double want, const Scale& scale) {
  CHECK(std::fabs(got - want) <= 0.02 / std::fabs(scale.b));
}

}  // namespace

TEST_CASE("loss.svg is well-formed and its lines give back the metrics") {
  const fs::path dir = fs::path(FT_BINARY_DIR) / "svg_plot_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path metrics = dir / "metrics.jsonl";
  std::vector<double> losses, lrs;
  {
    std::ofstream out(metrics);
    out << R"({"eval_loss":2.75,"eval_perplexity":15.6,"step":0})" << "\n";
    for (int step = 1; step <= 40; ++step) {
      const double loss = 2.6 * std::exp(-step / 15.0) + 0.35 + 0.05 * std::sin(step);
      const double lr = step <= 5 ? 3e-4 * step / 5 : 3e-4 * (40 - step) / 35;
      losses.push_back(loss);
      lrs.push_back(lr);
      if (step == 17) out << R"({"step":17,"loss":null,"lr":)" << lr << R"(,"update_skipped":true})" << "\n";
      else out << R"({"step":)" << step << R"(,"loss":)" << loss << R"(,"lr":)" << lr << "}\n";
    }
    out << R"({"eval_loss":0.82,"step":20})" << "\n" << R"({"eval_loss":0.61,"step":40})" << "\n";
    out << R"({"step":41,"lo)";  // a torn last line
  }
  std::string error;
  REQUIRE(ft::write_loss_plot(metrics.string(), &error));
  const std::string svg = read_file(dir / "loss.svg");
  const std::vector<Element> elements = parse_xml(svg);
  REQUIRE(!elements.empty());
  CHECK(elements.front().name == "svg");
  for (const char* text : {"step", "learning rate", "train loss", "eval loss"})
    CHECK_MESSAGE(svg.find(text) != std::string::npos, text);

  const Scale x = scale_from_ticks(elements, "xtick", "x");
  const Scale left = scale_from_ticks(elements, "ytick-left", "y");
  const Scale right = scale_from_ticks(elements, "ytick-right", "y");
  const auto train = series_points(elements, "train loss", x, left);
  REQUIRE(train.size() == 39);  // step 17's loss was not finite
  for (size_t i = 0, step = 1; i < train.size(); ++i, ++step) {
    if (step == 17) ++step;
    check_close(train[i].first, double(step), x);
    check_close(train[i].second, losses[step - 1], left);
  }
  const auto eval = series_points(elements, "eval loss", x, left);
  const std::vector<std::pair<double, double>> want_eval = {{0, 2.75}, {20, 0.82}, {40, 0.61}};
  REQUIRE(eval.size() == want_eval.size());
  for (size_t i = 0; i < eval.size(); ++i) {
    check_close(eval[i].first, want_eval[i].first, x);
    check_close(eval[i].second, want_eval[i].second, left);
  }
  const auto lr = series_points(elements, "learning rate", x, right);
  REQUIRE(lr.size() == 40);
  for (size_t i = 0; i < lr.size(); ++i) check_close(lr[i].second, lrs[i], right);
}

TEST_CASE("Progress redraws loss.svg beside metrics.jsonl at each evaluation and at the end") {
  const fs::path dir = fs::path(FT_BINARY_DIR) / "svg_plot_progress";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path metrics = dir / "metrics.jsonl";
  const fs::path svg = dir / "loss.svg";
  ft::Progress progress(metrics.string(), 3, 0, 1);
  progress.on_eval(0, {{"eval_loss", 2.0}});
  REQUIRE(fs::exists(svg));
  CHECK(read_file(svg).find("data-label=\"train loss\"") == std::string::npos);  // no step yet
  for (int64_t step = 1; step <= 3; ++step) progress.on_step(ft::StepReport{step, 2.0 - 0.1 * double(step), 1e-4});
  CHECK(read_file(svg).find("data-label=\"train loss\"") == std::string::npos);  // steps alone do not redraw
  progress.finish();
  CHECK(read_file(svg).find("data-label=\"train loss\"") != std::string::npos);
  progress.on_eval(3, {{"eval_loss", 1.5}});
  const std::vector<Element> elements = parse_xml(read_file(svg));
  const Scale x = scale_from_ticks(elements, "xtick", "x"), left = scale_from_ticks(elements, "ytick-left", "y");
  const auto eval = series_points(elements, "eval loss", x, left);
  REQUIRE(eval.size() == 2);
  check_close(eval[1].second, 1.5, left);
}

TEST_CASE("a metrics.jsonl that is not a regular file (/dev/full reads zeros forever) gives an empty chart") {
  const fs::path dir = fs::path(FT_BINARY_DIR) / "svg_plot_device";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::create_symlink("/dev/full", dir / "metrics.jsonl");
  const ft::LineChart chart = ft::loss_chart((dir / "metrics.jsonl").string());
  REQUIRE(chart.series.size() == 3);
  for (const ft::PlotSeries& series : chart.series) CHECK(series.x.empty());
  std::string error;
  CHECK(ft::write_loss_plot((dir / "metrics.jsonl").string(), &error));
  CHECK(fs::exists(dir / "loss.svg"));
}

TEST_CASE("the comparison's ROUGE bar chart is well-formed and its bars' heights give back the scores") {
  std::vector<ft::ComparedResult> results(3);
  results[0].name = "original model";
  results[0].summary.rouge = {0.1234, 0.0211, 0.1100, 0.1111};
  results[1].name = "full <fine-tuning>";  // escaped in the SVG
  results[1].summary.rouge = {0.4521, 0.2210, 0.4012, 0.4013};
  results[2].name = "LoRA";
  results[2].summary.rouge = {0.4080, 0.1900, 0.3700, 0.3702};
  const std::vector<Element> elements = parse_xml(ft::render_bar_svg(ft::rouge_chart(results)));
  const Scale y = scale_from_ticks(elements, "ytick-left", "y");
  std::vector<double> heights, values;
  std::vector<std::string> groups, fills;
  for (const Element& e : elements) {
    if (e.attributes.count("class") && e.attributes.at("class") == "group") groups.push_back(e.text);
    if (!e.attributes.count("class") || e.attributes.at("class") != "bar") continue;
    const double top = std::stod(e.attributes.at("y")), bottom = top + std::stod(e.attributes.at("height"));
    CHECK(std::fabs(y.value(bottom)) <= 0.02 / std::fabs(y.b));  // bars stand on 0
    heights.push_back(y.value(top));
    values.push_back(std::stod(e.attributes.at("data-value")));
    fills.push_back(e.attributes.at("fill"));
  }
  CHECK(groups == std::vector<std::string>{"original model", "full &lt;fine-tuning&gt;", "LoRA"});
  const std::vector<double> want = {0.1234, 0.0211, 0.1100, 0.1111, 0.4521, 0.2210,
                                    0.4012, 0.4013, 0.4080, 0.1900, 0.3700, 0.3702};
  REQUIRE(heights.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    check_close(heights[i], want[i], y);
    CHECK(values[i] == doctest::Approx(want[i]).epsilon(1e-9));
    CHECK(fills[i] == fills[i % 4]);  // one colour per ROUGE variant
  }
  CHECK(fills[0] != fills[1]);
}
