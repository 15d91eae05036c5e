// What a standalone rollout's weight synchronisation moves (the adaptive placement paper's Separation,
// HybridFlow's standalone placement): after each actor update the rollout pool's shadow copy receives the new
// weights. Every generation replica needs the whole model once; each of its t_g * p_g ranks receives its
// generation shard. The senders are one data-parallel replica of the training layout: its t * p ranks each
// send their training shard to every generation rank that holds part of it. Pure arithmetic, beside the
// 3D-HybridEngine's volumes (resharding.h), for the cost model and for byte counts a sync can be tested against.
#pragma once

#include <cstdint>

#include "hybridflow/parallel/device_mesh.h"

namespace hybridflow {

struct WeightSyncVolume {
  int64_t bytes_received_per_rollout_rank = 0;  // M / (t_g * p_g)
  int64_t bytes_sent_per_actor_rank = 0;        // d_g * M / (t * p): its shard, once per generation replica
  int64_t total_bytes = 0;                      // d_g * M
};

// `model_bytes` = M, the weights in the rollout's dtype. Throws hybridflow::Error for a size below 1.
WeightSyncVolume standalone_weight_sync_volume(const DeviceMesh& train, int gen_tp, int gen_pp, int gen_replicas,
                                               int64_t model_bytes);

}  // namespace hybridflow
