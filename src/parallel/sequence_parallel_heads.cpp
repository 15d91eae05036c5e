#include "hybridflow/parallel/sequence_parallel_heads.h"

namespace hybridflow {

RankHeads tensor_parallel_rank_heads(int64_t heads, int64_t kv_heads, int tp) {
  return {heads / tp, kv_heads < tp ? 1 : kv_heads / tp};
}

bool sequence_parallel_splits(const RankHeads& heads, int n) {
  return heads.query % n == 0 && (heads.kv % n == 0 || n % heads.kv == 0);
}

}  // namespace hybridflow
