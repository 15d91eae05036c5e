#include "hybridflow/parallel/resharding.h"

#include "hybridflow/core/error.h"

namespace hybridflow {

at::Tensor gather_generation_shard(Communicator& micro_dp, const GenerationLayout& layout, int world_rank,
                                   const at::Tensor& train_shard, int64_t dim) {
  HF_CHECK(layout.gen_pp() == layout.train().pp(), "gather_generation_shard: gen pp=", layout.gen_pp(),
           " differs from training pp=", layout.train().pp(), "; only tp resharding is supported");
  HF_CHECK(micro_dp.group().world_ranks() == layout.micro_dp_group_of(world_rank),
           "gather_generation_shard: communicator is not the micro-DP group of world rank ", world_rank);
  // Members are ordered by micro_dp_rank, which with equal pp is the training tp rank within the block, so
  // concatenating in group order rebuilds the contiguous generation shard.
  return micro_dp.all_gather_cat(train_shard, dim);
}

}  // namespace hybridflow
