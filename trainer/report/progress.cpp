#include "trainer/report/progress.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "kernels/error.h"
#include "trainer/report/loss_plot.h"

namespace ft {

std::string format_bytes(size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = double(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, unit ? "%.1f %s" : "%.0f %s", value, units[unit]);
  return text;
}

std::string format_duration(double seconds) {
  int64_t total = int64_t(seconds + 0.5);
  char text[32];
  if (total >= 3600)
    std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", (long long)(total / 3600), (long long)(total / 60 % 60),
                  (long long)(total % 60));
  else
    std::snprintf(text, sizeof text, "%02lld:%02lld", (long long)(total / 60), (long long)(total % 60));
  return text;
}

Progress::Progress(const std::string& metrics_path, int64_t total_steps, int64_t first_step, int64_t log_every)
    : metrics_path_(metrics_path),
      metrics_fd_(metrics_path.empty() ? -1 : ::open(metrics_path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644)),
      total_steps_(total_steps),
      first_step_(first_step),
      log_every_(log_every > 0 ? log_every : 1),
      is_terminal_(isatty(STDOUT_FILENO)),
      start_(std::chrono::steady_clock::now()),
      last_step_(start_) {
  FT_CHECK(metrics_path.empty() || metrics_fd_ >= 0, metrics_path, ": cannot open for appending (", std::strerror(errno), ")");
}

Progress::~Progress() {
  if (!unwritten_rows_.empty())
    std::cerr << "warning: " << metrics_path_ << ": " << std::count(unwritten_rows_.begin(), unwritten_rows_.end(), '\n')
              << " metrics rows could not be written\n";
  if (metrics_fd_ >= 0) ::close(metrics_fd_);
}

void Progress::write_metrics(const nlohmann::json& row) {
  if (metrics_path_.empty()) return;
  unwritten_rows_ += row.dump() + "\n";
  while (!unwritten_rows_.empty()) {
    const ssize_t written = ::write(metrics_fd_, unwritten_rows_.data(), unwritten_rows_.size());
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) {
      if (!warned_write_failure_)
        std::cerr << "warning: " << metrics_path_ << ": cannot write a metrics row (" << std::strerror(errno)
                  << "); kept in memory and retried with each later row\n";
      warned_write_failure_ = true;
      return;
    }
    unwritten_rows_.erase(0, size_t(written));
  }
}

std::string Progress::format_bar(const StepReport& report, double tokens_per_s, double elapsed_s) const {
  const int64_t done = report.step - first_step_, remaining = total_steps_ - report.step;
  const double eta_s = done > 0 ? elapsed_s / double(done) * double(remaining) : 0.0;
  const int width = 20;
  const int filled = int(width * report.step / (total_steps_ ? total_steps_ : 1));
  std::string bar = std::string(size_t(filled), '=') + std::string(size_t(width - filled), ' ');
  char text[256];
  std::snprintf(text, sizeof text, "step %lld/%lld [%s] loss %.4f lr %.2e %.0f tok/s %s<%s peak %s",
                (long long)report.step, (long long)total_steps_, bar.c_str(), report.loss, report.lr, tokens_per_s,
                format_duration(elapsed_s).c_str(), format_duration(eta_s).c_str(),
                format_bytes(report.peak_memory_bytes).c_str());
  std::string line = text;
  for (const auto& item : report.figures.items()) {
    char figure[96];
    std::snprintf(figure, sizeof figure, " %s %.4g", item.key().c_str(), item.value().get<double>());
    line += figure;
  }
  return line;
}

void Progress::start() {
  start_ = std::chrono::steady_clock::now();
  last_step_ = start_;
  tokens_since_start_ = 0;
}

void Progress::on_step(const StepReport& report) {
  const auto now = std::chrono::steady_clock::now();
  const double step_s = std::chrono::duration<double>(now - last_step_).count();
  const double elapsed_s = std::chrono::duration<double>(now - start_).count();
  last_step_ = now;
  tokens_since_start_ += report.tokens;
  const double tokens_per_s = elapsed_s > 0 ? double(tokens_since_start_) / elapsed_s : 0.0;
  nlohmann::json row = {{"step", report.step}, {"loss", report.loss}, {"lr", report.lr}, {"grad_norm", report.grad_norm},
                        {"tokens", report.tokens}, {"loss_tokens", report.loss_tokens}, {"step_s", step_s}, {"tokens_per_s", tokens_per_s},
                        {"peak_memory_bytes", report.peak_memory_bytes}};
  for (const auto& item : report.figures.items()) row[item.key()] = item.value();
  if (report.update_skipped) row["update_skipped"] = true;  // loss or grad_norm is null (NaN or Inf)
  write_metrics(row);
  const bool last = report.step == total_steps_;
  if (is_terminal_) {
    std::cout << "\r\033[K" << format_bar(report, tokens_per_s, elapsed_s) << std::flush;
    bar_drawn_ = true;
  }
  interval_loss_sum_ += report.loss;
  interval_steps_++;
  if (report.step % log_every_ == 0 || last) {
    StepReport line = report;
    line.loss = interval_loss_sum_ / double(interval_steps_);
    if (!is_terminal_) std::cout << format_bar(line, tokens_per_s, elapsed_s) << "\n" << std::flush;
    interval_loss_sum_ = 0.0, interval_steps_ = 0;
  }
}

void Progress::message(const std::string& text) {
  if (bar_drawn_) std::cout << "\r\033[K";
  std::cout << text << "\n" << std::flush;
  bar_drawn_ = false;
}

void Progress::on_eval(int64_t step, const nlohmann::json& figures) {
  nlohmann::json row = figures;
  row["step"] = step;
  write_metrics(row);
  redraw_plot();
}

void Progress::finish() {
  if (bar_drawn_) std::cout << "\n" << std::flush;
  bar_drawn_ = false;
  redraw_plot();
}

// Like a metrics row, the picture failing to write (a full disk) warns once and the run goes on.
void Progress::redraw_plot() {
  std::string error;
  if (metrics_path_.empty()) return;
  if (write_loss_plot(metrics_path_, &error) || warned_plot_failure_) return;
  std::cerr << "warning: " << error << "; training goes on without the picture\n";
  warned_plot_failure_ = true;
}

}  // namespace ft
