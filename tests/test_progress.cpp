// Progress's metrics.jsonl writer: a failed write (here the file-size limit,
// as a full disk would) warns once, keeps the rows, and writes them all with
// the next row that fits, in order. Without a metrics path (a data-parallel
// rank other than 0) it writes no file at all.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "trainer/report/progress.h"

namespace fs = std::filesystem;

TEST_CASE("rows whose write failed are kept and written, in order, by the next write that succeeds") {
  const fs::path path = fs::path(FT_BINARY_DIR) / "progress_metrics.jsonl";
  fs::remove(path);
  rlimit saved{};
  REQUIRE(getrlimit(RLIMIT_FSIZE, &saved) == 0);
  signal(SIGXFSZ, SIG_IGN);  // over the limit, write fails with EFBIG instead of killing the process
  {
    ft::Progress progress(path.string(), 4, 0, 1);
    progress.on_eval(0, {{"eval_loss", 1.0}});
    const size_t first_row_bytes = fs::file_size(path);
    rlimit tight = saved;
    tight.rlim_cur = first_row_bytes;  // no room for another byte
    REQUIRE(setrlimit(RLIMIT_FSIZE, &tight) == 0);
    progress.on_eval(1, {{"eval_loss", 2.0}});
    progress.on_eval(2, {{"eval_loss", 3.0}});
    CHECK(fs::file_size(path) == first_row_bytes);
    REQUIRE(setrlimit(RLIMIT_FSIZE, &saved) == 0);
    progress.on_eval(3, {{"eval_loss", 4.0}});
  }
  signal(SIGXFSZ, SIG_DFL);
  std::ifstream in(path);
  std::vector<int64_t> steps;
  std::string line;
  while (std::getline(in, line)) steps.push_back(nlohmann::json::parse(line).at("step").get<int64_t>());
  CHECK(steps == std::vector<int64_t>{0, 1, 2, 3});
}

TEST_CASE("a Progress without a metrics path writes no file, neither metrics nor loss.svg") {
  const fs::path folder = fs::path(FT_BINARY_DIR) / "progress_no_files";
  fs::remove_all(folder);
  fs::create_directories(folder);
  const fs::path previous = fs::current_path();
  fs::current_path(folder);  // where a relative loss.svg beside "" would land
  {
    ft::Progress progress("", 2, 0, 1);
    progress.start();
    ft::StepReport report;
    report.step = 1;
    report.loss = 2.0;
    progress.on_step(report);
    progress.on_eval(1, {{"eval_loss", 1.5}});
    progress.finish();
  }
  fs::current_path(previous);
  CHECK(fs::is_empty(folder));
}

TEST_CASE("under log_every, a printed line's loss is the mean over its steps, as transformers' logging_steps") {
  const fs::path lines = fs::path(FT_BINARY_DIR) / "progress_lines.txt";
  std::cout.flush();
  std::fflush(stdout);
  const int saved = dup(STDOUT_FILENO), file = open(lines.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE(dup2(file, STDOUT_FILENO) >= 0);  // not a terminal: the lines are printed, not a bar
  {
    ft::Progress progress("", 5, 0, 2);
    progress.start();
    for (int step = 1; step <= 5; ++step) {
      ft::StepReport report;
      report.step = step;
      report.loss = step;
      progress.on_step(report);
    }
    progress.finish();
  }
  std::cout.flush();
  std::fflush(stdout);
  dup2(saved, STDOUT_FILENO);
  close(saved);
  close(file);
  std::stringstream text;
  text << std::ifstream(lines).rdbuf();
  std::vector<std::string> losses;
  for (std::string line; std::getline(text, line);) losses.push_back(line.substr(line.find("loss "), 11));
  CHECK(losses == std::vector<std::string>{"loss 1.5000", "loss 3.5000", "loss 5.0000"});  // steps 1-2, 3-4, 5
}
