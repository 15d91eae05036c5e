// Thinning a long series for drawing: a 10,000-step run has far more points than an SVG chart has pixels.
#pragma once

#include <cstddef>
#include <vector>

namespace hybridflow::report {

struct XY {
  std::vector<double> x, y;
};

// At most about `max_points` points. Each bucket of consecutive points keeps its minimum and maximum (in
// x order), so spikes such as a loss blow-up stay visible; a series already short enough is unchanged.
XY downsample_min_max(const std::vector<double>& x, const std::vector<double>& y, size_t max_points);

// Exponential moving average with TensorBoard's debiasing (early points are not pulled toward zero).
std::vector<double> smooth_ema(const std::vector<double>& y, double weight);

}  // namespace hybridflow::report
