// Which heads a Ulysses group splits (parallel/sequence_parallel.h) inside tensor parallelism: a tensor-parallel
// rank's share of the query heads, and of the KV heads or, where there are fewer KV heads than tensor-parallel
// ranks, the one it keeps (model/tensor_parallel_layout.h: kv_heads_replicated). The model checks its groups with
// it, and the placement search its candidate layouts and their all-to-all volumes.
#pragma once

#include <cstdint>

namespace hybridflow {

struct RankHeads {
  int64_t query = 0, kv = 0;
};

// The heads one of `tp` tensor-parallel ranks attends with (tp divides `heads`).
RankHeads tensor_parallel_rank_heads(int64_t heads, int64_t kv_heads, int tp);
// Whether a sequence-parallel group of `n` splits them: an equal share of the query heads each, and whole KV
// heads (the KV heads divide by n, or n by them: each is then repeated onto the ranks whose query heads read it).
bool sequence_parallel_splits(const RankHeads& heads, int n);

}  // namespace hybridflow
