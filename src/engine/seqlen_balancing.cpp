#include "hybridflow/engine/seqlen_balancing.h"

#include <algorithm>
#include <numeric>

#include "hybridflow/core/error.h"

namespace hybridflow {
namespace {

void check_even_split(size_t rows, int64_t parts) {
  HF_CHECK(parts >= 1 && static_cast<int64_t>(rows) % parts == 0, "balance_batch: ", rows,
           " rows do not split into ", parts, " equal parts");
}

// A partial partition of the differencing method: `parts` subsets, kept heaviest first.
struct Subset {
  int64_t sum = 0;
  std::vector<int64_t> rows;
};
struct PartialPartition {
  std::vector<Subset> subsets;
  int64_t first_row = 0;  // the smallest row it holds: a tie-break that does not depend on the heap's order
  int64_t spread() const { return subsets.front().sum - subsets.back().sum; }
  void sort_heaviest_first() {
    std::sort(subsets.begin(), subsets.end(), [](const Subset& a, const Subset& b) {
      return a.sum != b.sum ? a.sum > b.sum : a.rows.front() < b.rows.front();
    });
  }
};

// Heap order: the partition with the largest spread comes out first, then the one with the heaviest subset.
bool comes_out_later(const PartialPartition& a, const PartialPartition& b) {
  if (a.spread() != b.spread()) return a.spread() < b.spread();
  if (a.subsets.front().sum != b.subsets.front().sum) return a.subsets.front().sum < b.subsets.front().sum;
  return a.first_row > b.first_row;
}

}  // namespace

int64_t sequence_workload(int64_t tokens, int64_t hidden_size) {
  HF_CHECK(tokens >= 0 && hidden_size > 0, "sequence_workload: ", tokens, " tokens at hidden size ", hidden_size);
  return 6 * hidden_size * tokens + tokens * tokens;
}

std::vector<int64_t> balanced_row_order(const std::vector<int64_t>& costs, int64_t parts) {
  check_even_split(costs.size(), parts);
  std::vector<int64_t> by_cost(costs.size());
  std::iota(by_cost.begin(), by_cost.end(), 0);
  std::stable_sort(by_cost.begin(), by_cost.end(),
                   [&](int64_t a, int64_t b) { return costs[static_cast<size_t>(a)] < costs[static_cast<size_t>(b)]; });
  // Rows of like cost dealt one to each part: every partial partition starts with equal row counts, and
  // merging heaviest with lightest keeps them equal.
  std::vector<PartialPartition> heap;
  for (size_t at = 0; at < by_cost.size(); at += static_cast<size_t>(parts)) {
    PartialPartition p;
    p.first_row = *std::min_element(by_cost.begin() + static_cast<std::ptrdiff_t>(at),
                                    by_cost.begin() + static_cast<std::ptrdiff_t>(at) + parts);
    for (int64_t i = 0; i < parts; ++i) {
      const int64_t row = by_cost[at + static_cast<size_t>(i)];
      p.subsets.push_back({costs[static_cast<size_t>(row)], {row}});
    }
    p.sort_heaviest_first();
    heap.push_back(std::move(p));
  }
  std::make_heap(heap.begin(), heap.end(), comes_out_later);
  while (heap.size() > 1) {
    std::pop_heap(heap.begin(), heap.end(), comes_out_later);
    PartialPartition a = std::move(heap.back());
    heap.pop_back();
    std::pop_heap(heap.begin(), heap.end(), comes_out_later);
    PartialPartition& b = heap.back();
    for (size_t i = 0; i < a.subsets.size(); ++i) {
      Subset& light = b.subsets[b.subsets.size() - 1 - i];
      a.subsets[i].sum += light.sum;
      a.subsets[i].rows.insert(a.subsets[i].rows.end(), light.rows.begin(), light.rows.end());
    }
    a.first_row = std::min(a.first_row, b.first_row);
    a.sort_heaviest_first();
    b = std::move(a);
    std::push_heap(heap.begin(), heap.end(), comes_out_later);
  }
  std::vector<int64_t> order;
  order.reserve(costs.size());
  if (heap.empty()) return order;
  for (Subset& part : heap.front().subsets) {
    std::sort(part.rows.begin(), part.rows.end());
    order.insert(order.end(), part.rows.begin(), part.rows.end());
  }
  return order;
}

std::vector<int64_t> chunk_token_sums(const std::vector<int64_t>& values, int64_t parts,
                                      const std::vector<int64_t>& order) {
  check_even_split(values.size(), parts);
  const auto rows = static_cast<int64_t>(values.size());
  HF_CHECK(order.empty() || static_cast<int64_t>(order.size()) == rows, "balance_batch: an order of ", order.size(),
           " rows for ", rows);
  std::vector<int64_t> sums(static_cast<size_t>(parts), 0);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t row = order.empty() ? i : order[static_cast<size_t>(i)];
    sums[static_cast<size_t>(i / (rows / parts))] += values[static_cast<size_t>(row)];
  }
  return sums;
}

}  // namespace hybridflow
