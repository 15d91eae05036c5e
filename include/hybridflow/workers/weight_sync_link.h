// The worker side of a standalone rollout's weight sync (engine/weight_sync.h): the controller sends both
// groups one `weight_sync` description (store_port of the c10d store it hosts, world_size, this group's
// rank_offset in the sync world, the two layouts, bucket_bytes, dtype), and every rank of both joins.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>

#include "hybridflow/core/data_proto.h"
#include "hybridflow/engine/weight_sync.h"

namespace hybridflow {

nlohmann::json weight_sync_layout_json(const WeightSyncLayout& layout);
WeightSyncLayout weight_sync_layout_from_json(const nlohmann::json& layout);

// Collective over the sync world: this rank (`role_rank` in its group) joins the group `link` describes.
std::unique_ptr<WeightSync> join_weight_sync(const nlohmann::json& link, int role_rank, torch::Device device);

// One sync's figures as a worker reply: meta "weight_sync" {bytes_sent, bytes_received, buckets, seconds},
// one row per rank (the runtime's collect drops the meta of row-less outputs).
DataProto weight_sync_reply(const WeightSyncStats& stats, int rank);

}  // namespace hybridflow
