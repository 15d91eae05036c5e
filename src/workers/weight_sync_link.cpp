#include "hybridflow/workers/weight_sync_link.h"

#include "hybridflow/core/error.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/workers/role_process_groups.h"

namespace hybridflow {

nlohmann::json weight_sync_layout_json(const WeightSyncLayout& l) {
  return {{"actor_tp", l.actor_tp}, {"actor_dp", l.actor_dp}, {"actor_pp", l.actor_pp},
          {"rollout_tp", l.rollout_tp}, {"rollout_replicas", l.rollout_replicas}};
}

WeightSyncLayout weight_sync_layout_from_json(const nlohmann::json& j) {
  WeightSyncLayout l;
  l.actor_tp = j.at("actor_tp").get<int>();
  l.actor_dp = j.at("actor_dp").get<int>();
  l.actor_pp = j.at("actor_pp").get<int>();
  l.rollout_tp = j.at("rollout_tp").get<int>();
  l.rollout_replicas = j.at("rollout_replicas").get<int>();
  return l;
}

std::unique_ptr<WeightSync> join_weight_sync(const nlohmann::json& link, int role_rank, torch::Device device) {
  HF_CHECK(link.is_object() && link.contains("store_port") && link.contains("layout"),
           "join_weight_sync: meta 'weight_sync' must hold store_port, world_size, rank_offset, layout, bucket_bytes, dtype");
  const WeightSyncLayout layout = weight_sync_layout_from_json(link.at("layout"));
  const int world = link.at("world_size").get<int>();
  HF_CHECK(world == layout.world(), "join_weight_sync: world_size ", world, " but the layouts need ", layout.world());
  const int rank = link.at("rank_offset").get<int>() + role_rank;
  ProcessGroup group = join_controller_store_group(link, rank, world, device);
  return std::make_unique<WeightSync>(std::move(group), layout, link.at("bucket_bytes").get<int64_t>(),
                                      parse_dtype(link.at("dtype").get<std::string>(), "weight sync dtype"));
}

DataProto weight_sync_reply(const WeightSyncStats& stats, int rank) {
  DataProto out;
  out.set_tensor("sync_rank", torch::full({1}, static_cast<int64_t>(rank), torch::kLong));
  out.meta()["weight_sync"] = {{"bytes_sent", stats.bytes_sent},
                               {"bytes_received", stats.bytes_received},
                               {"buckets", stats.buckets},
                               {"seconds", stats.seconds}};
  return out;
}

}  // namespace hybridflow
