// What the user sees while training: a one-line progress bar redrawn in place
// on a terminal, plain log lines otherwise (CI logs, pipes, files), every
// figure appended as JSON to output_dir/metrics.jsonl, and loss.svg beside it
// (loss_plot.h) redrawn at each evaluation and when training ends.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace ft {

struct StepReport {
  int64_t step = 0;  // optimizer steps done
  double loss = 0.0;
  double lr = 0.0;
  double grad_norm = 0.0;
  int64_t tokens = 0;       // tokens processed in this step (padding and prompts included)
  int64_t loss_tokens = 0;  // of them, those whose prediction carries loss
  size_t peak_memory_bytes = 0;
  bool update_skipped = false;  // the loss or gradient norm was not finite: no optimizer update
  // The objective's own figures (DPO's rewards/... and logps/...), by name:
  // written to metrics.jsonl and shown after the bar.
  nlohmann::json figures = nlohmann::json::object();
};

class Progress {
 public:
  // An empty metrics_path writes no file at all (a data-parallel rank other
  // than 0: only rank 0 writes metrics.jsonl and loss.svg).
  Progress(const std::string& metrics_path, int64_t total_steps, int64_t first_step, int64_t log_every);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  // Starts the clocks for elapsed time, tokens/s and ETA (after the
  // evaluation that precedes training, so it does not count as step time).
  void start();
  void on_step(const StepReport& report);
  // Records an evaluation's figures and redraws loss.svg.
  void on_eval(int64_t step, const nlohmann::json& figures);
  // Prints a line above the bar (eval results, samples).
  void message(const std::string& text);
  // Ends the bar's line and redraws loss.svg.
  void finish();

 private:
  void write_metrics(const nlohmann::json& row);
  void redraw_plot();
  std::string format_bar(const StepReport& report, double tokens_per_s, double elapsed_s) const;

  // metrics.jsonl rows not yet written: a failed write (a full disk for a
  // moment) warns once and keeps its rows here, and the next row retries them.
  std::string metrics_path_, unwritten_rows_;
  int metrics_fd_ = -1;
  bool warned_write_failure_ = false, warned_plot_failure_ = false;
  int64_t total_steps_, first_step_, log_every_;
  // The losses since the last printed line: a line shows their mean, as
  // transformers' logging_steps logs it (the bar on a terminal shows the step's).
  double interval_loss_sum_ = 0.0;
  int64_t interval_steps_ = 0;
  bool is_terminal_;
  bool bar_drawn_ = false;
  std::chrono::steady_clock::time_point start_, last_step_;
  int64_t tokens_since_start_ = 0;
};

std::string format_bytes(size_t bytes);
std::string format_duration(double seconds);

}  // namespace ft
