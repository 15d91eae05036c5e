#include "hybridflow/parallel/weight_sync_volume.h"

#include "hybridflow/core/error.h"

namespace hybridflow {

WeightSyncVolume standalone_weight_sync_volume(const DeviceMesh& train, int gen_tp, int gen_pp, int gen_replicas,
                                               int64_t model_bytes) {
  HF_CHECK(gen_tp >= 1 && gen_pp >= 1 && gen_replicas >= 1, "weight sync: generation sizes must be >= 1, got tp ",
           gen_tp, " pp ", gen_pp, " replicas ", gen_replicas);
  HF_CHECK(model_bytes >= 0, "weight sync: negative model size ", model_bytes);
  const int64_t shards = static_cast<int64_t>(train.tp()) * train.pp();
  WeightSyncVolume v;
  v.bytes_received_per_rollout_rank = model_bytes / (static_cast<int64_t>(gen_tp) * gen_pp);
  v.bytes_sent_per_actor_rank = gen_replicas * (model_bytes / shards);
  v.total_bytes = gen_replicas * model_bytes;
  return v;
}

}  // namespace hybridflow
