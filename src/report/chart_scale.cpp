#include "hybridflow/report/chart_scale.h"

#include <array>
#include <cmath>
#include <cstdio>

namespace hybridflow::report {

AxisTicks nice_ticks(double lo, double hi, int target) {
  if (hi < lo) std::swap(lo, hi);
  if (hi - lo <= 0) {
    // One value (or a constant series): centre it in a small range that still has readable ticks.
    const double pad = lo == 0 ? 1.0 : std::fabs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / std::max(target, 1);
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double fraction = raw / magnitude;
  const double nice = fraction <= 1 ? 1 : fraction <= 2 ? 2 : fraction <= 5 ? 5 : 10;
  AxisTicks t;
  t.step = nice * magnitude;
  t.lo = std::floor(lo / t.step) * t.step;
  t.hi = std::ceil(hi / t.step) * t.step;
  const int n = static_cast<int>(std::lround((t.hi - t.lo) / t.step));
  for (int i = 0; i <= n; ++i) {
    double v = t.lo + i * t.step;
    if (std::fabs(v) < t.step * 1e-9) v = 0;  // no "-0" or "1e-17" from accumulated rounding
    t.values.push_back(v);
  }
  return t;
}

std::string format_tick(double value, double step) {
  if (value == 0) return "0";  // not "0.000000" on an axis of small values
  char buf[32];
  const double magnitude = std::max(std::fabs(value), step);
  if (magnitude >= 1e6 || step < 1e-3) {
    std::snprintf(buf, sizeof buf, "%.2g", value);
  } else {
    const int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
    std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  }
  return buf;
}

std::string format_number(double value) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", value);
  return buf;
}

const char* series_color(size_t i) {
  static constexpr std::array<const char*, 10> kPalette = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                                           "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
  return kPalette[i % kPalette.size()];
}

}  // namespace hybridflow::report
