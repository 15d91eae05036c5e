// Axis arithmetic shared by the SVG charts: "nice" tick values (1, 2 or 5 times a power of ten) covering a
// data range, compact tick labels, and the series colour palette.
#pragma once

#include <string>
#include <vector>

namespace hybridflow::report {

struct AxisTicks {
  double lo = 0, hi = 1;      // the axis range, widened to whole ticks
  double step = 1;            // distance between ticks
  std::vector<double> values;
};

// About `target` ticks covering [lo, hi]; a zero-width range is widened around its value.
AxisTicks nice_ticks(double lo, double hi, int target = 5);

// A tick label with as many decimals as the tick spacing needs; exponent form for very large or small.
std::string format_tick(double value, double step);

// A short human number for summaries and tables (4 significant digits).
std::string format_number(double value);

// The i-th colour of a palette readable on white and distinguishable in order.
const char* series_color(size_t i);

}  // namespace hybridflow::report
