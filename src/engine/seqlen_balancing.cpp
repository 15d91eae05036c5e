#include "hybridflow/engine/seqlen_balancing.h"

#include <algorithm>
#include <numeric>

#include "hybridflow/core/error.h"

namespace hybridflow {

std::vector<int64_t> balanced_row_order(const std::vector<int64_t>& lengths, int64_t parts) {
  const auto rows = static_cast<int64_t>(lengths.size());
  HF_CHECK(parts >= 1 && rows % parts == 0, "balance_batch: ", rows, " rows do not split into ", parts,
           " equal parts");
  const int64_t room = rows / parts;
  std::vector<int64_t> by_length(static_cast<size_t>(rows));
  std::iota(by_length.begin(), by_length.end(), 0);
  // Ties keep the batch order, so the result is a function of the lengths alone.
  std::stable_sort(by_length.begin(), by_length.end(),
                   [&](int64_t a, int64_t b) { return lengths[static_cast<size_t>(a)] > lengths[static_cast<size_t>(b)]; });
  std::vector<std::vector<int64_t>> members(static_cast<size_t>(parts));
  std::vector<int64_t> tokens(static_cast<size_t>(parts), 0);
  for (int64_t row : by_length) {
    size_t best = members.size();
    for (size_t p = 0; p < members.size(); ++p)
      if (static_cast<int64_t>(members[p].size()) < room && (best == members.size() || tokens[p] < tokens[best])) best = p;
    members[best].push_back(row);
    tokens[best] += lengths[static_cast<size_t>(row)];
  }
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(rows));
  for (auto& part : members) {
    std::sort(part.begin(), part.end());
    order.insert(order.end(), part.begin(), part.end());
  }
  return order;
}

std::vector<int64_t> chunk_token_sums(const std::vector<int64_t>& lengths, int64_t parts,
                                      const std::vector<int64_t>& order) {
  const auto rows = static_cast<int64_t>(lengths.size());
  HF_CHECK(parts >= 1 && rows % parts == 0, "balance_batch: ", rows, " rows do not split into ", parts,
           " equal parts");
  HF_CHECK(order.empty() || static_cast<int64_t>(order.size()) == rows, "balance_batch: an order of ", order.size(),
           " rows for ", rows);
  std::vector<int64_t> sums(static_cast<size_t>(parts), 0);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t row = order.empty() ? i : order[static_cast<size_t>(i)];
    sums[static_cast<size_t>(i / (rows / parts))] += lengths[static_cast<size_t>(row)];
  }
  return sums;
}

}  // namespace hybridflow
