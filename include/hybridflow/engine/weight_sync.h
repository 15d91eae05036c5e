// The actor's weights to a standalone rollout pool (the adaptive placement paper's Separation): after each
// update every actor rank sends the parts of its training shards that each rollout rank's generation shard
// needs, point to point over one c10d group spanning both pools, packed into buckets. Nothing passes through
// the controller and no rank gathers a whole model: a rollout rank receives exactly its shard (from the
// actor's tp ranks whose shards overlap it), and a weight reaches each rollout replica once.
//
// The sync world: ranks [0, A) are the actor's in its own order (tp fastest, then dp, then pp), ranks
// [A, A + R) the rollout's (tp fastest, then replica). Rollout replica r reads from actor data-parallel
// replica r % d, so several actor replicas share the sending. The plan is a pure function of the weights'
// full shapes and the two layouts, so both sides compute the same pieces and buckets without talking.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "hybridflow/model/model_config.h"
#include "hybridflow/model/transformer.h"
#include "hybridflow/parallel/process_group.h"

namespace hybridflow {

struct WeightSyncLayout {
  int actor_tp = 1, actor_dp = 1, actor_pp = 1;
  int rollout_tp = 1, rollout_replicas = 1;  // the rollout generates unstaged

  int actor_world() const { return actor_tp * actor_dp * actor_pp; }
  int rollout_world() const { return rollout_tp * rollout_replicas; }
  int world() const { return actor_world() + rollout_world(); }
  int actor_rank(int tp, int dp, int pp) const { return (pp * actor_dp + dp) * actor_tp + tp; }
  int rollout_rank(int tp, int replica) const { return actor_world() + replica * rollout_tp + tp; }
};

// One contiguous slice of one weight from one actor rank to one rollout rank: [begin, end) along `axis`
// (0: rows, 1: columns) in the full tensor's coordinates, or the whole tensor (axis -1).
struct WeightPiece {
  std::string name;
  int axis = -1;
  int64_t begin = 0, end = 0;
  int src = 0, dst = 0;  // sync-world ranks
  int64_t numel = 0;
};

// The pieces for weights `full_shapes` (by Hugging Face name; a sender passes only the weights it holds),
// sorted by (src, dst, name, begin). Throws when a split dimension does not divide by a tensor-parallel size.
std::vector<WeightPiece> weight_sync_plan(const std::map<std::string, std::vector<int64_t>>& full_shapes,
                                          const ModelConfig& config, const WeightSyncLayout& layout);

// Consecutive pieces of one (src, dst) pair, at most `bucket_bytes` (a piece larger than that is a bucket
// of its own), in plan order; the buckets' order is the order both sides transfer them in.
struct WeightBucket {
  int src = 0, dst = 0;
  std::vector<size_t> pieces;  // indices into the plan
  int64_t numel = 0;
};
std::vector<WeightBucket> weight_sync_buckets(const std::vector<WeightPiece>& plan, int64_t bucket_bytes,
                                              int64_t element_size);

// The full shapes of a tensor-parallel model's weights: each local shape with its split axis times `tp`.
std::map<std::string, std::vector<int64_t>> full_weight_shapes(const CausalLM& model, int tp);
// The weights a sync moves: all of full_weight_shapes, or with LoRA adapters only the adapters (the base
// weights are frozen, and both sides built them from the same spec).
std::map<std::string, std::vector<int64_t>> synced_weight_shapes(const CausalLM& model, int tp);

struct WeightSyncStats {
  int64_t bytes_sent = 0, bytes_received = 0;
  int64_t buckets = 0;  // buckets this rank sent or received
  double seconds = 0;
};

// The store key under which the controller announces the policy version of the sync it starts.
inline constexpr const char* kWeightSyncAnnounceKey = "hf/weight_sync/announced_version";
// The store key under which the controller asks the partial rollouts in flight to stop between two tokens
// ("1") while a checkpoint saves them, and lets them go on ("0").
inline constexpr const char* kRolloutPauseKey = "hf/rollout/pause";
// Streaming rollouts (rollout.stream_groups): the key prefix under which the controller publishes a step's
// prompts (the suffix is the step) once it has sent that step's request, for the call before it to start.
inline constexpr const char* kRolloutStreamKeyPrefix = "hf/rollout/stream/";

class WeightSync {
 public:
  // `world`: this rank's handle on the sync world (world.size() == layout.world()). `dtype`: the rollout's
  // parameter dtype, which the buckets carry (a sender casts its pieces into it).
  WeightSync(ProcessGroup world, WeightSyncLayout layout, int64_t bucket_bytes, at::ScalarType dtype);

  // Collective over the sync world: every actor rank calls send with its training-layout model, every
  // rollout rank receive with its generation model, at the same sync. An actor whose experts are split sends
  // with them gathered (CausalLM::gather_experts(true)), so that every rank holds each expert whole as the
  // rollout model does; the plan is then the unsplit model's.
  WeightSyncStats send(const CausalLM& actor);
  WeightSyncStats receive(CausalLM& rollout);

  const WeightSyncLayout& layout() const { return layout_; }

  // Partial rollouts: the controller announces a sync's version under kWeightSyncAnnounceKey in the store it
  // hosts before the actor sends, so that a rollout rank in mid-generation can join it between two tokens.
  // The newest version announced, -1 before the first.
  int64_t announced_version() const;
  // Whether the controller asks generations to stop (kRolloutPauseKey is "1").
  bool pause_requested() const;
  // Streaming rollouts: what the controller published for `step` under kRolloutStreamKeyPrefix, "" if nothing.
  std::string streamed_prompts(int64_t step) const;

 private:
  ProcessGroup world_;
  WeightSyncLayout layout_;
  int64_t bucket_bytes_;
  at::ScalarType dtype_;
};

}  // namespace hybridflow
