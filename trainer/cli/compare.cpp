#include "trainer/cli/compare.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <set>

#include "kernels/error.h"
#include "model/atomic_file.h"
#include "trainer/report/progress.h"

namespace ft {
namespace fs = std::filesystem;

namespace {

// The held-out completions shown before and after PPO, as lab 3 shows a few.
constexpr int64_t kHeldOutSamples = 3;

// The keys an entry holds besides config fields.
const std::vector<std::string> kEntryKeys = {"name", "train"};

std::string where(const std::string& path, const YAML::Node& node) {
  return path + ":" + std::to_string(node.Mark().line + 1);
}

// "LoRA (r=32)" -> "lora-r-32": the run's folder.
std::string folder_name(const std::string& name) {
  std::string out;
  for (char c : name) {
    if (std::isalnum(static_cast<unsigned char>(c))) out += char(std::tolower(static_cast<unsigned char>(c)));
    else if (!out.empty() && out.back() != '-') out += '-';
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out;
}

ComparedRun load_entry(const std::string& path, const YAML::Node& root, const YAML::Node& entry, size_t index,
                       const std::vector<std::string>& overrides) {
  const std::string field = "compare[" + std::to_string(index) + "]";
  FT_CHECK(entry.IsMap(), where(path, entry), ": ", field, ": expected a map with a name and the fields it changes");
  const YAML::Node name = entry["name"];
  FT_CHECK(name && name.IsScalar() && !name.Scalar().empty() && !folder_name(name.Scalar()).empty(),
           where(path, entry), ": ", field, ".name: expected a name with a letter or digit (the run's folder)");
  FT_CHECK(!entry["compare"], where(path, entry), ": ", field,
           ".compare: a run cannot hold a comparison of its own (compare: is the file's top-level list)");
  FT_CHECK(!entry["output_dir"], where(path, entry), ": ", field,
           ".output_dir: runs write to the file's output_dir/<name>; set output_dir at the top level");
  ComparedRun run;
  run.name = name.Scalar();
  bool train = true;
  if (const YAML::Node node = entry["train"]) {
    FT_CHECK(node.IsScalar() && YAML::convert<bool>::decode(node, train), where(path, node), ": ", field,
             ".train: expected true or false");
  }
  std::vector<std::string> skipped = kEntryKeys;
  skipped.push_back("compare");  // the root layer's list
  run.config = train_config_from_layers({root, entry}, skipped, path, overrides);
  run.config.evaluate_only = !train;
  run.config.output_dir = (fs::path(run.config.output_dir) / folder_name(run.name)).string();
  // A reward model and PPO report their own held-out figures (lab 3's table); the others are compared by ROUGE.
  const Objective objective = run.config.objective;
  FT_CHECK(run.config.task_metric == TaskMetric::rouge || objective == Objective::reward ||
               objective == Objective::ppo,
           where(path, entry), ": ", field, ": task_metric: rouge (and data.eval) is needed: the comparison is of "
           "ROUGE (objective: reward and ppo runs report their own held-out figures)");
  FT_CHECK(objective != Objective::ppo || !run.config.data.eval.empty(), where(path, entry), ": ", field,
           ": data.eval: held-out prompts are needed (the table compares them before and after PPO)");
  return run;
}

std::string percent(const ParameterCount& count) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f%%", count.all ? 100.0 * double(count.trainable) / double(count.all) : 0.0);
  return text;
}

}  // namespace

bool is_comparison_file(const std::string& path) {
  const YAML::Node root = load_yaml_file(path);
  return root.IsMap() && root["compare"];
}

Comparison load_comparison(const std::string& path, const std::vector<std::string>& overrides) {
  const YAML::Node root = load_yaml_file(path);
  const YAML::Node list = root.IsMap() ? root["compare"] : YAML::Node();
  FT_CHECK(list && list.IsSequence() && list.size() > 0, path, ": compare: expected a list of runs, each a map with "
           "a name and the fields it changes");
  Comparison comparison;
  std::set<std::string> folders;
  for (size_t i = 0; i < list.size(); ++i) {
    ComparedRun run = load_entry(path, root, list[i], i, overrides);
    FT_CHECK(folders.insert(run.config.output_dir).second, where(path, list[i]), ": compare[", i, "].name: \"",
             run.name, "\" names the same folder as an earlier run");
    if (i == 0) comparison.output_dir = fs::path(run.config.output_dir).parent_path().string();
    comparison.runs.push_back(std::move(run));
  }
  return comparison;
}

std::string comparison_table(const std::vector<ComparedResult>& results) {
  size_t width = 6;
  for (const ComparedResult& r : results) width = std::max(width, r.name.size());
  std::string table;
  char line[512];
  std::snprintf(line, sizeof line, "%-*s  %7s  %7s  %7s  %10s  %31s  %11s  %9s\n", int(width), "method", "ROUGE-1",
                "ROUGE-2", "ROUGE-L", "ROUGE-Lsum", "trainable / all parameters", "peak memory", "wall time");
  table += line;
  for (const ComparedResult& r : results) {
    const RunSummary& s = r.summary;
    const std::string params = with_commas(s.parameters.trainable) + " / " + with_commas(s.parameters.all) + " (" +
                               percent(s.parameters) + ")";
    std::snprintf(line, sizeof line, "%-*s  %7.4f  %7.4f  %7.4f  %10.4f  %31s  %11s  %8.1fs\n", int(width),
                  r.name.c_str(), s.rouge.rouge1, s.rouge.rouge2, s.rouge.rougeL, s.rouge.rougeLsum, params.c_str(),
                  format_bytes(s.peak_memory_bytes).c_str(), r.wall_s);
    table += line;
  }
  return table;
}

std::string comparison_csv(const std::vector<ComparedResult>& results) {
  std::string csv = "method,rouge1,rouge2,rougeL,rougeLsum,eval_loss,trainable_params,all_params,peak_memory_bytes,"
                    "wall_s\n";
  char line[512];
  for (const ComparedResult& r : results) {
    const RunSummary& s = r.summary;
    std::string name = r.name;  // CSV quoting: a name with a comma or quote
    if (name.find_first_of(",\"") != std::string::npos) {
      std::string quoted = "\"";
      for (char c : name) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
      name = quoted + "\"";
    }
    std::snprintf(line, sizeof line, ",%.6f,%.6f,%.6f,%.6f,%.6f,%lld,%lld,%zu,%.3f\n", s.rouge.rouge1, s.rouge.rouge2,
                  s.rouge.rougeL, s.rouge.rougeLsum, s.eval_loss, static_cast<long long>(s.parameters.trainable),
                  static_cast<long long>(s.parameters.all), s.peak_memory_bytes, r.wall_s);
    csv += name + line;
  }
  return csv;
}

// Lab 3's figures of one evaluation: "toxicity" is the reward classifier's
// probability that a completion is the rejected kind, sigmoid(-score) (its
// score is high for the chosen, clean summaries).
struct HeldOutRow {
  double reward, reward_std, toxicity, toxicity_std, kl;
};
HeldOutRow held_out_row(const HeldOutSummary& s) {
  std::vector<double> toxicity;
  for (double score : s.model_scores) toxicity.push_back(1.0 / (1.0 + std::exp(score)));
  const double n = double(toxicity.size());
  double mean = 0.0, var = 0.0;
  for (double t : toxicity) mean += t / n;
  for (double t : toxicity) var += n > 1 ? (t - mean) * (t - mean) / (n - 1.0) : 0.0;
  return {s.reward, s.reward_std, toxicity.empty() ? NAN : mean, toxicity.empty() ? NAN : std::sqrt(var), s.kl};
}

std::string held_out_table(const std::vector<ComparedResult>& results, int64_t samples) {
  std::string table;
  char line[512];
  for (const ComparedResult& r : results) {
    const RunSummary& s = r.summary;
    if (s.has_preference)
      table += r.name + ": held-out pair accuracy " + std::to_string(s.preference_accuracy) + "\n";
    if (!s.has_held_out) continue;
    std::snprintf(line, sizeof line, "%s: %zu held-out prompts\n%-8s  %11s  %10s  %13s  %12s  %9s\n", r.name.c_str(),
                  s.held_out_after.prompts.size(), "", "reward mean", "reward std", "toxicity mean", "toxicity std",
                  "KL (nats)");
    table += line;
    for (const auto* phase : {&s.held_out_before, &s.held_out_after}) {
      const HeldOutRow row = held_out_row(*phase);
      std::snprintf(line, sizeof line, "%-8s  %11.4f  %10.4f  %13.4f  %12.4f  %9.4f\n",
                    phase == &s.held_out_before ? "before" : "after", row.reward, row.reward_std, row.toxicity,
                    row.toxicity_std, row.kl);
      table += line;
    }
    const HeldOutRow before = held_out_row(s.held_out_before), after = held_out_row(s.held_out_after);
    std::snprintf(line, sizeof line, "%-8s  %+11.4f  %10s  %+13.4f\n", "change", after.reward - before.reward, "",
                  after.toxicity - before.toxicity);
    table += line;
    for (int64_t i = 0; i < std::min<int64_t>(samples, int64_t(s.held_out_after.prompts.size())); ++i) {
      table += "--- sample " + std::to_string(i + 1) + " ---\n" + s.held_out_after.prompts[size_t(i)] +
               "\n  before: " + s.held_out_before.completions[size_t(i)] +
               "\n  after:  " + s.held_out_after.completions[size_t(i)] + "\n";
    }
  }
  return table;
}

std::string held_out_csv(const std::vector<ComparedResult>& results) {
  std::string csv = "run,phase,reward_mean,reward_std,toxicity_mean,toxicity_std,kl\n";
  char line[256];
  for (const ComparedResult& r : results) {
    if (!r.summary.has_held_out) continue;
    for (const auto* phase : {&r.summary.held_out_before, &r.summary.held_out_after}) {
      const HeldOutRow row = held_out_row(*phase);
      std::snprintf(line, sizeof line, ",%s,%.6f,%.6f,%.6f,%.6f,%.6f\n",
                    phase == &r.summary.held_out_before ? "before" : "after", row.reward, row.reward_std,
                    row.toxicity, row.toxicity_std, row.kl);
      csv += r.name + line;
    }
  }
  return csv;
}

BarChart rouge_chart(const std::vector<ComparedResult>& results) {
  BarChart chart;
  chart.title = "ROUGE per method";
  chart.y_label = "F-measure";
  chart.series = {{"ROUGE-1", "#1f77b4", {}}, {"ROUGE-2", "#ff7f0e", {}}, {"ROUGE-L", "#2ca02c", {}},
                  {"ROUGE-Lsum", "#9467bd", {}}};
  for (const ComparedResult& r : results) {
    chart.groups.push_back(r.name);
    const RougeScores& rouge = r.summary.rouge;
    chart.series[0].values.push_back(rouge.rouge1);
    chart.series[1].values.push_back(rouge.rouge2);
    chart.series[2].values.push_back(rouge.rougeL);
    chart.series[3].values.push_back(rouge.rougeLsum);
  }
  return chart;
}

int run_comparison(const Comparison& comparison, std::ostream& out) {
  std::vector<ComparedResult> results;
  for (const ComparedRun& run : comparison.runs) {
    out << "=== " << run.name << (run.config.evaluate_only ? " (evaluated, not trained)" : "") << " -> " << run.config.output_dir
        << " ===\n";
    ComparedResult result{run.name, {}, 0.0};
    RunOptions options;
    options.overwrite = true;  // a comparison starts its runs afresh
    // The untrained model is a run of its own (train: false); PPO's table compares the policy before and after.
    options.evaluate_before = run.config.objective == Objective::ppo;
    options.summary = &result.summary;
    const auto start = std::chrono::steady_clock::now();
    const int status = run_training(run.config, options);
    result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (status != 0) return status;  // stopped by a signal: its checkpoint is saved
    results.push_back(result);
  }
  create_folder(comparison.output_dir, "output_dir");
  std::vector<ComparedResult> by_rouge;
  for (const ComparedResult& r : results)
    if (r.summary.has_rouge) by_rouge.push_back(r);
  if (!by_rouge.empty()) {
    out << "\n" << comparison_table(by_rouge);
    const std::string csv_path = (fs::path(comparison.output_dir) / "comparison.csv").string();
    const std::string svg_path = (fs::path(comparison.output_dir) / "rouge.svg").string();
    write_file_atomically(csv_path, comparison_csv(by_rouge));
    write_file_atomically(svg_path, render_bar_svg(rouge_chart(by_rouge)));
    out << "table: " << csv_path << "\nchart: " << svg_path << "\n";
  }
  if (by_rouge.size() < results.size()) {
    out << "\n" << held_out_table(results, kHeldOutSamples);
    const std::string csv_path = (fs::path(comparison.output_dir) / "held_out.csv").string();
    write_file_atomically(csv_path, held_out_csv(results));
    out << "table: " << csv_path << "\n";
  }
  return 0;
}

}  // namespace ft
