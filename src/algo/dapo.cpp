#include "hybridflow/algo/dapo.h"

#include <torch/torch.h>

#include <limits>

#include "hybridflow/core/error.h"

namespace hybridflow::algo {

at::Tensor overlong_penalty(const at::Tensor& response_lengths, int64_t max_response_length,
                            int64_t overlong_buffer_len, double penalty_factor) {
  constexpr const char* kWhere = "algo: overlong_penalty";
  HF_CHECK(response_lengths.defined() && response_lengths.dim() == 1, kWhere,
           ": response_lengths must be [B], got shape ", response_lengths.sizes());
  HF_CHECK(overlong_buffer_len > 0 && overlong_buffer_len <= max_response_length, kWhere,
           ": overlong_buffer_len must be in (0, max_response_length = ", max_response_length, "], got ",
           overlong_buffer_len);
  HF_CHECK(penalty_factor >= 0, kWhere, ": penalty_factor must be >= 0, got ", penalty_factor);
  auto len = response_lengths.to(torch::kDouble);
  const double expected = static_cast<double>(max_response_length - overlong_buffer_len);
  auto penalty = -(len - expected) / static_cast<double>(overlong_buffer_len) * penalty_factor;
  return penalty.clamp_max(0.0).to(torch::kFloat);
}

at::Tensor dynamic_sampling_keep(const at::Tensor& metric, const at::Tensor& index) {
  constexpr const char* kWhere = "algo: dynamic_sampling_keep";
  HF_CHECK(metric.defined() && metric.dim() == 1, kWhere, ": metric must be [B], got shape ", metric.sizes());
  HF_CHECK(index.defined() && index.dim() == 1 && index.size(0) == metric.size(0), kWhere,
           ": index must be [B] with B = ", metric.size(0), ", got shape ", index.sizes());
  // Dense group ids: return_inverse maps every row to its group's position among the unique ids.
  auto [groups, dense, counts] = torch::_unique2(index.to(torch::kLong), /*sorted=*/true,
                                                 /*return_inverse=*/true, /*return_counts=*/true);
  const int64_t g = groups.size(0);
  auto values = metric.to(torch::kDouble);
  auto inf = std::numeric_limits<double>::infinity();
  auto max = torch::full({g}, -inf, values.options()).scatter_reduce(0, dense, values, "amax");
  auto min = torch::full({g}, inf, values.options()).scatter_reduce(0, dense, values, "amin");
  auto keep_group = (max > min) | (counts == 1);
  return keep_group.index_select(0, dense);
}

}  // namespace hybridflow::algo
