// 3D-HybridEngine weight resharding (HybridFlow paper, section 5): training tp -> generation tp.
#pragma once

#include <ATen/core/Tensor.h>

#include "hybridflow/parallel/collectives.h"
#include "hybridflow/parallel/device_mesh.h"

namespace hybridflow {

// This rank's generation tp shard of a weight that training shards over tp along dim: one all-gather inside
// the rank's micro-DP group (a Communicator over layout.micro_dp_group_of(rank), e.g. from
// ProcessGroup::split(layout.micro_dp_groups())). Only the tp part of resharding: needs gen pp == train pp
// (pipeline stages then keep their layers). Throws when the communicator is not that micro-DP group.
at::Tensor gather_generation_shard(Communicator& micro_dp, const GenerationLayout& layout, int world_rank,
                                   const at::Tensor& train_shard, int64_t dim);

}  // namespace hybridflow
