#include "hybridflow/placement/set_partitions.h"

#include "hybridflow/core/error.h"

namespace hybridflow::placement {

namespace {

// Restricted growth strings: element i joins one of the blocks so far or opens the next one.
bool extend(int i, int n, std::vector<std::vector<int>>& blocks,
            const std::function<bool(const std::vector<std::vector<int>>&)>& visit) {
  if (i == n) return visit(blocks);
  for (size_t b = 0; b < blocks.size(); ++b) {
    blocks[b].push_back(i);
    const bool go_on = extend(i + 1, n, blocks, visit);
    blocks[b].pop_back();
    if (!go_on) return false;
  }
  blocks.push_back({i});
  const bool go_on = extend(i + 1, n, blocks, visit);
  blocks.pop_back();
  return go_on;
}

}  // namespace

void for_each_set_partition(int n, const std::function<bool(const std::vector<std::vector<int>>&)>& visit) {
  HF_CHECK(n >= 0, "set partitions of a negative count ", n);
  std::vector<std::vector<int>> blocks;
  extend(0, n, blocks, visit);
}

uint64_t bell_number(int n) {
  HF_CHECK(n >= 0 && n <= 25, "bell_number: n must be in 0..25, got ", n);
  std::vector<uint64_t> row = {1};
  for (int i = 0; i < n; ++i) {
    std::vector<uint64_t> next = {row.back()};
    for (uint64_t v : row) next.push_back(next.back() + v);
    row = std::move(next);
  }
  return row.front();
}

}  // namespace hybridflow::placement
