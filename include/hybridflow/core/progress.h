// A one-line progress report for long loops: step/total, named figures, throughput and ETA.
// On a terminal the line rewrites itself; otherwise (CI, pipes) it prints one line every `every` steps.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace hybridflow {

// Seconds left at the mean pace so far: `elapsed_s` took `steps_done` steps, `steps_left` remain. NaN when
// nothing is done yet (format_duration shows it as "?").
double eta_seconds(double elapsed_s, int64_t steps_done, int64_t steps_left);

class ProgressLine {
 public:
  ProgressLine(std::string label, int64_t total_steps, int64_t print_every = 1);

  // Reports that `step` (1-based) is done, having processed `tokens` tokens since the last update.
  void update(int64_t step, int64_t tokens, const std::vector<std::pair<std::string, double>>& figures);
  // Ends the line and prints a one-line summary (steps, wall time, mean tokens/s).
  void finish(const std::vector<std::pair<std::string, double>>& figures = {});

  // Formats seconds as "1m05s" / "12s"; exposed for tests.
  static std::string format_duration(double seconds);
  // The text of one update, without terminal control characters; exposed for tests.
  std::string render(int64_t step, const std::vector<std::pair<std::string, double>>& figures) const;

 private:
  using Clock = std::chrono::steady_clock;
  std::string label_;
  int64_t total_;
  int64_t every_;
  bool tty_;
  Clock::time_point start_;
  int64_t tokens_total_ = 0;
  int64_t last_step_ = 0;
};

}  // namespace hybridflow
