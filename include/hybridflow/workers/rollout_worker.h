// The standalone rollout (the adaptive placement paper's Separation): generation on a pool of its own,
// from a shadow copy of the actor's weights that the actor sends after each update (engine/weight_sync.h).
// It samples exactly as a colocated actor does (workers/rollout_generation.h), so with the same weights and
// seed it returns the same tokens. Methods:
//   generate_sequences  as the actor's (rollout_protocol: prompts split over its replicas); every row also
//                       gets policy_version [rows] int64: the version of the weights that generated it
//                       (with rollout.partial_rollout: that began it, and token_policy_version [rows, R]
//                       int64 the version that drew each token). With partial_rollout a checkpoint's
//                       pause (kRolloutPauseKey) stops it between two tokens: it then returns the
//                       responses so far (workers/partial_rollout_state.h), and a request that holds
//                       them continues them
//                       With rollout.stream_groups a request whose meta has stream_step t (the controller's
//                       streams_groups) runs every prompt its meta stream_pending lists that this process
//                       has not returned (workers/stream_prompts.h), and step t + 1's once the controller
//                       publishes them in the weight-sync store (kRolloutStreamKeyPrefix) and the weights
//                       held are at most stream_staleness versions behind t + 1; it returns the first
//                       batch-size groups to end, named in meta stream_returned, and keeps the others'
//                       samples for the next call (tokens recorded as partial rollouts do)
//   join_weight_sync    meta weight_sync (workers/weight_sync_link.h)
//   receive_weights     meta policy_version: receives the actor's weights into this rank's shard
//                       (collective with the actor's send_weights); out: meta weight_sync per rank
//   parameter_norm      out: param_sq_norm [1] (tests compare the shadow copy with the actor)
//   memory_stats        this process's memory (workers/role_memory.h)
// Config JSON: model (ModelSpec), threads, rollout (RolloutSpec, workers/role_specs.h: its dtype, when
// set, is the model's). Layout: tp = the rollout's tensor-parallel size, no stages.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <utility>
#include <nlohmann/json.hpp>

#include "hybridflow/workers/agent_rollout.h"
#include "hybridflow/engine/decode_graph_cache.h"
#include "hybridflow/engine/generation.h"
#include "hybridflow/engine/weight_sync.h"
#include "hybridflow/model/transformer.h"
#include "hybridflow/runtime/worker.h"
#include "hybridflow/workers/role_process_groups.h"
#include "hybridflow/workers/role_specs.h"

namespace hybridflow {

class RolloutWorker : public Worker {
 public:
  void register_methods(MethodTable& table) override;

  DataProto generate_sequences(const DataProto& in);
  DataProto join_weight_sync(const DataProto& in);
  DataProto receive_weights(const DataProto& in);
  DataProto parameter_norm(const DataProto& in);
  DataProto memory_stats(const DataProto& in);

 private:
  ModelSpec model_spec_;  // with the rollout's dtype
  RolloutSpec rollout_spec_;
  std::unique_ptr<RoleProcessGroups> groups_;  // with a tensor-parallel split; outlives the model
  CausalLM model_{nullptr};
  // rollout.free_cache_engine false: the KV pools and decode graphs kept between rollouts
  std::shared_ptr<DecodeGraphCache> kept_decode_graphs_ = std::make_shared<DecodeGraphCache>();
  std::unique_ptr<WeightSync> weight_sync_;
  std::unique_ptr<AgentRolloutRuntime> agent_;  // rollout.multi_turn.enable: one episode per sample
  int64_t policy_version_ = 0;  // the actor updates behind the weights held
  // Partial rollouts: receives the weights of a sync the controller announced, if newer than those held,
  // and returns the version held. The last version so taken before its receive_weights call, and its figures.
  int64_t take_announced_weights();
  int64_t taken_early_ = -1;
  WeightSyncStats early_stats_;
  // policy_version [rows] (the version that began each row) and token_policy_version [rows, R] from a
  // generation's token_versions.
  void set_versions(DataProto& result, const GenerationOutput& out) const;
  // rollout.stream_groups (rollout_stream.cpp): generate_sequences of a request marked stream_step.
  DataProto generate_streaming(const DataProto& in, GenerationConfig g);
  // The pending prompts a streaming call began and did not return, with what they drew and the version that
  // began their oldest sample, for the next call that lists them; and the prompts returned, which a request
  // sent before the reply reached the controller still lists.
  struct CarriedGroup {
    PartialSequences state;
    int64_t begin_version = 0;
  };
  std::map<std::pair<int64_t, int64_t>, CarriedGroup> carried_;
  std::set<std::pair<int64_t, int64_t>> returned_;
};

}  // namespace hybridflow
