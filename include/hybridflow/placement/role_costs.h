// The seconds and bytes of each call a role serves, from first principles: training and forward passes are
// compute-bound (FLOPs / achieved FLOP/s, with the pipeline's bubble), decoding is memory-bound (weights
// and KV cache read per step, batched up to what the KV cache holds), and every collective costs its ring
// volume over the link it crosses (NVLink inside a node, the NIC between nodes). Fixed per-call, per-layer
// and per-step costs (Overheads) come on top. The 3D-HybridEngine's switch and the standalone rollout's
// weight sync take their volumes from the parallel layer's formulas (parallel/resharding.h,
// parallel/weight_sync_volume.h), the same ones the engine's byte counts are tested against.
#pragma once

#include <cstdint>
#include <limits>

#include "hybridflow/placement/hardware.h"
#include "hybridflow/placement/model_shape.h"
#include "hybridflow/placement/plan.h"
#include "hybridflow/placement/workload.h"

namespace hybridflow::placement {

struct CostInputs {
  const ClusterSpec& cluster;
  const ModelShape& model;
  const Workload& workload;
};

struct Breakdown {
  double compute_s = 0, memory_s = 0, comm_s = 0, overhead_s = 0;
  double total() const { return compute_s + memory_s + comm_s + overhead_s; }
  Breakdown& operator+=(const Breakdown& o);
};
Breakdown operator*(double k, const Breakdown& b);

inline constexpr double kInfeasible = std::numeric_limits<double>::infinity();

// A ring all-reduce of `bytes` over `ranks` (one link per rank: NVLink when the group is inside a node).
double allreduce_seconds(const ClusterSpec& c, double bytes, int ranks, bool crosses_nodes);
// An all-gather in which every rank receives `bytes_received`.
double allgather_seconds(const ClusterSpec& c, double bytes_received, int ranks, bool crosses_nodes);

// An all-to-all in which every rank holds `bytes_per_rank` and keeps 1 / ranks of it.
double alltoall_seconds(const ClusterSpec& c, double bytes_per_rank, int ranks, bool crosses_nodes);

// A forward-only pass over `rows` sequences (log-probs, values, scores).
Breakdown forward_seconds(const CostInputs& in, Role role, const Layout& l, int64_t rows);
// An update: ppo_epochs x mini_batches optimizer steps over `rows` sequences (forward + backward, the
// data-parallel gradient reduction, the optimizer step).
Breakdown training_seconds(const CostInputs& in, Role role, const Layout& l, int64_t rows);

struct GenerationCost {
  Breakdown time;
  int64_t waves = 0;           // rounds of decoding when the KV cache cannot hold every sequence at once
  int64_t batch = 0;           // sequences decoded together in a replica
  bool feasible = false;       // false: the KV cache cannot hold one sequence
};
// Generating `rows` responses with the rollout layout `g` when each device has `kv_capacity_bytes` for
// the KV cache.
GenerationCost generation_seconds(const CostInputs& in, const Layout& g, int64_t rows, double kv_capacity_bytes);

// Both switches of the 3D-HybridEngine per iteration (training -> generation: the micro-DP all-gather of
// parallel/resharding.h's hybridflow volume; back: a local copy of the training shard).
Breakdown reshard_seconds(const CostInputs& in, const Layout& actor, const Layout& rollout);
// Standalone rollout: the updated weights from the actor's set to every generation rank.
Breakdown weight_sync_seconds(const CostInputs& in, const Layout& actor, const Layout& rollout, bool same_node);

struct RoleMemory {
  double persistent = 0;  // held for the whole run: weights, gradients, optimizer state
  double transient = 0;   // held only during the role's own calls: activations, generation weights
  double kv_minimum = 0;  // rollout: the part of transient that is one sequence's KV cache per replica
};
// Per device. For the rollout, `with_actor` says whether it shares the actor's devices (the engine then
// reuses the actor's training shard) and transient is the least it needs to generate at all (one sequence's
// KV cache per replica); the KV cache grows into whatever the set leaves free.
RoleMemory role_memory(const CostInputs& in, Role role, const Layout& l, bool with_actor = false,
                       const Layout& actor = {});

// Weight bytes of the whole model as the actor trains and the rollout generates it (M in the paper).
double model_weight_bytes(const CostInputs& in);

}  // namespace hybridflow::placement
