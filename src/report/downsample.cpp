#include "hybridflow/report/downsample.h"

#include <algorithm>
#include <cmath>

namespace hybridflow::report {

XY downsample_min_max(const std::vector<double>& x, const std::vector<double>& y, size_t max_points) {
  const size_t n = std::min(x.size(), y.size());
  if (n <= max_points || max_points < 4) return {std::vector<double>(x.begin(), x.begin() + static_cast<long>(n)),
                                                std::vector<double>(y.begin(), y.begin() + static_cast<long>(n))};
  XY out;
  const size_t buckets = max_points / 2;
  for (size_t b = 0; b < buckets; ++b) {
    const size_t begin = b * n / buckets, end = (b + 1) * n / buckets;
    if (begin >= end) continue;
    size_t lo = begin, hi = begin;
    for (size_t i = begin; i < end; ++i) {
      if (y[i] < y[lo]) lo = i;
      if (y[i] > y[hi]) hi = i;
    }
    const size_t first = std::min(lo, hi), second = std::max(lo, hi);
    out.x.push_back(x[first]);
    out.y.push_back(y[first]);
    if (second != first) {
      out.x.push_back(x[second]);
      out.y.push_back(y[second]);
    }
  }
  return out;
}

std::vector<double> smooth_ema(const std::vector<double>& y, double weight) {
  std::vector<double> out;
  out.reserve(y.size());
  double last = 0, debias = 1;
  for (double v : y) {
    last = last * weight + (1 - weight) * v;
    debias *= weight;
    out.push_back(weight >= 1 ? v : last / (1 - debias));
  }
  return out;
}

}  // namespace hybridflow::report
