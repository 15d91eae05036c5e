#include "hybridflow/core/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace hybridflow {

ProgressLine::ProgressLine(std::string label, int64_t total_steps, int64_t print_every)
    : label_(std::move(label)),
      total_(total_steps),
      every_(print_every < 1 ? 1 : print_every),
      tty_(::isatty(STDOUT_FILENO) != 0),
      start_(Clock::now()) {}

double eta_seconds(double elapsed_s, int64_t steps_done, int64_t steps_left) {
  if (steps_done <= 0) return NAN;
  return elapsed_s / static_cast<double>(steps_done) * static_cast<double>(std::max<int64_t>(0, steps_left));
}

std::string ProgressLine::format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto s = static_cast<int64_t>(std::llround(seconds));
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", static_cast<long long>(s / 3600), static_cast<long long>(s % 3600 / 60));
  } else if (s >= 60) {
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%llds", static_cast<long long>(s));
  }
  return buf;
}

std::string ProgressLine::render(int64_t step, const std::vector<std::pair<std::string, double>>& figures) const {
  double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
  std::ostringstream out;
  out << label_ << " step " << step << "/" << total_;
  for (const auto& [name, value] : figures) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), " %s %.4g", name.c_str(), value);
    out << buf;
  }
  if (elapsed > 0 && tokens_total_ > 0) {
    char buf[48];
    std::snprintf(buf, sizeof(buf), " | %.0f tok/s", static_cast<double>(tokens_total_) / elapsed);
    out << buf;
  }
  const double eta = eta_seconds(elapsed, step, total_ - step);
  out << " | " << format_duration(elapsed) << " elapsed, ETA " << format_duration(eta);
  return out.str();
}

void ProgressLine::update(int64_t step, int64_t tokens, const std::vector<std::pair<std::string, double>>& figures) {
  tokens_total_ += tokens;
  last_step_ = step;
  bool due = step % every_ == 0 || step == total_ || step == 1;
  if (tty_) {
    std::printf("\r\033[K%s", render(step, figures).c_str());
  } else if (due) {
    std::printf("%s\n", render(step, figures).c_str());
  }
  std::fflush(stdout);
}

void ProgressLine::finish(const std::vector<std::pair<std::string, double>>& figures) {
  double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
  if (tty_) std::printf("\n");
  std::ostringstream out;
  out << label_ << " done: " << last_step_ << " steps in " << format_duration(elapsed);
  if (elapsed > 0 && tokens_total_ > 0) {
    char buf[48];
    std::snprintf(buf, sizeof(buf), ", %.0f tok/s", static_cast<double>(tokens_total_) / elapsed);
    out << buf;
  }
  for (const auto& [name, value] : figures) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), ", %s %.4g", name.c_str(), value);
    out << buf;
  }
  std::printf("%s\n", out.str().c_str());
  std::fflush(stdout);
}

}  // namespace hybridflow
