// Plain-vector helpers so the algo tests can compute expected values with explicit loops, independently of
// the tensor code under test.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <utility>
#include <vector>

namespace hybridflow::algo::testing {

using Rows = std::vector<std::vector<double>>;

inline torch::Tensor to_tensor(const Rows& rows, torch::Dtype dtype = torch::kFloat) {
  const int64_t b = static_cast<int64_t>(rows.size());
  const int64_t r = b == 0 ? 0 : static_cast<int64_t>(rows[0].size());
  auto t = torch::zeros({b, r}, torch::kDouble);
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < r; ++j) t[i][j] = rows[i][j];
  return t.to(dtype);
}

inline Rows to_rows(const torch::Tensor& t) {
  auto d = t.to(torch::kDouble).contiguous();
  Rows rows(d.size(0), std::vector<double>(d.size(1)));
  for (int64_t i = 0; i < d.size(0); ++i)
    for (int64_t j = 0; j < d.size(1); ++j) rows[i][j] = d[i][j].item<double>();
  return rows;
}

// Mean and unbiased variance over the entries where mask is 1.
inline std::pair<double, double> masked_moments(const Rows& v, const Rows& mask) {
  double sum = 0, n = 0;
  for (size_t i = 0; i < v.size(); ++i)
    for (size_t j = 0; j < v[i].size(); ++j)
      if (mask[i][j] != 0) sum += v[i][j], n += 1;
  const double mean = sum / n;
  double ss = 0;
  for (size_t i = 0; i < v.size(); ++i)
    for (size_t j = 0; j < v[i].size(); ++j)
      if (mask[i][j] != 0) ss += (v[i][j] - mean) * (v[i][j] - mean);
  return {mean, n > 1 ? ss / (n - 1) : 0.0};
}

inline Rows whiten_ref(const Rows& v, const Rows& mask) {
  auto [mean, var] = masked_moments(v, mask);
  Rows out = v;
  for (size_t i = 0; i < v.size(); ++i)
    for (size_t j = 0; j < v[i].size(); ++j) out[i][j] = mask[i][j] != 0 ? (v[i][j] - mean) / std::sqrt(var + 1e-8) : 0;
  return out;
}

#define EXPECT_ROWS_NEAR(actual, expected, tol)                                                   \
  do {                                                                                             \
    const auto& a_ = (actual);                                                                     \
    const auto& e_ = (expected);                                                                   \
    ASSERT_EQ(a_.size(), e_.size());                                                               \
    for (size_t i_ = 0; i_ < a_.size(); ++i_) {                                                    \
      ASSERT_EQ(a_[i_].size(), e_[i_].size());                                                     \
      for (size_t j_ = 0; j_ < a_[i_].size(); ++j_)                                                \
        EXPECT_NEAR(a_[i_][j_], e_[i_][j_], tol) << "at [" << i_ << "][" << j_ << "]";             \
    }                                                                                              \
  } while (0)

}  // namespace hybridflow::algo::testing
