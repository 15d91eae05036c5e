// One RL iteration of a plan, simulated: every call's duration from placement/role_costs.h, then the
// dataflow's schedule. Each set runs its calls one at a time in program order (colocated roles share
// devices); sets on disjoint devices run concurrently as soon as the data a call needs exists, which is how
// the runtime's pools behave and how HybridFlow's simulator overlaps the models of a stage. A standalone
// rollout with staleness k generates up to k later steps while step s trains. The iteration time is the steady-state
// period over several simulated iterations.
#pragma once

#include <string>
#include <vector>

#include "hybridflow/placement/plan.h"
#include "hybridflow/placement/role_costs.h"

namespace hybridflow::placement {

struct CallEstimate {
  std::string name;  // "actor.update_actor", "rollout.generate_sequences", "weight_sync", "controller"
  Stage stage = Stage::kGeneration;
  int set = -1;      // -1: the controller
  double start_s = 0, end_s = 0;  // inside the steady-state iteration, from its first call's start
  Breakdown cost;
};

struct SetMemory {
  double persistent = 0;    // per device: weights, gradients, optimizer state of every role in the set
  double peak = 0;          // persistent + the largest transient need of one role
  double kv_capacity = 0;   // what the rollout's KV cache may use (0 when the set has no rollout)
  double usable = 0;        // the device's memory less the reserve
  bool fits = false;
};

struct Estimate {
  bool feasible = false;
  std::string why_not;       // for an infeasible plan: the first reason found
  double iteration_s = 0;
  double tokens_per_s = 0;   // (prompt + response tokens of the batch) / iteration_s
  std::vector<CallEstimate> calls;
  std::vector<SetMemory> memory;  // per set
  int64_t generation_waves = 0;
  int64_t generation_batch = 0;   // sequences decoded together per replica
  // Sums over the iteration's calls, by what they are: the paper's three stages, the switch or sync.
  double generation_s = 0, preparation_s = 0, training_s = 0, reshard_s = 0, sync_s = 0, controller_s = 0;
};

// Checks the plan's shape (every role placed once, layouts that fill their sets and divide the model and
// the batch) and its memory, then simulates. An impossible plan is returned with feasible = false and a
// reason, never thrown: the search calls this for plans it builds itself.
Estimate simulate(const Plan& plan, const ClusterSpec& cluster, const ModelShape& model, const Workload& workload);

// The async speed-up of a plan with a standalone rollout: the same placement and layouts simulated at each
// staleness k of `ks`, with weight syncs every min(plan.sync_every, k + 1) updates, and each k's step time
// against the same plan's at k = 0 (speed-up = iteration at 0 / iteration at k). Empty for a plan whose
// rollout shares the actor's devices (it cannot run ahead) or that is infeasible.
struct StalenessPoint {
  int staleness = 0;
  int sync_every = 1;
  double iteration_s = 0;
  double speedup = 1;
};
std::vector<StalenessPoint> staleness_sweep(const Plan& plan, const ClusterSpec& cluster, const ModelShape& model,
                                            const Workload& workload, const std::vector<int>& ks);

// Why a layout cannot run `role` of this model and workload on a set of `devices` ("" when it can): sizes
// below 1, a product other than `devices`, a tensor-parallel size that does not divide the attention
// heads or spans nodes, pipeline stages that do not divide the layers, a batch that does not divide into
// the data-parallel replicas.
std::string layout_problem(const ClusterSpec& cluster, const ModelShape& model, const Workload& w, Role role,
                           const Layout& l, int devices);

// One call's cost on its layout: a generation with `kv_capacity` bytes of KV cache per device (and the
// engine's two switches when `actor` is given: the rollout shares the actor's devices), a forward pass, or
// an update. Infinite seconds for a generation whose KV cache cannot hold one sequence.
Breakdown call_cost(const CostInputs& in, const Call& call, const Layout& layout, double kv_capacity,
                    const Layout* actor = nullptr);

// The schedule alone: given each call's seconds, the steady-state iteration time (and, when `out` is
// given, the calls of one iteration with their start and end). `set_of_call[i]` is the set of calls[i];
// `sync_s` > 0 adds a weight sync on the actor's and the rollout's sets after every actor update;
// `controller_s` is the controller's work between preparation and training. With staleness k the rollout
// runs up to k batches ahead of its weights and pauses when that buffer is full; with sync_every N a sync
// follows every N-th update only, and the period is averaged over whole N-update cycles.
struct ScheduleInput {
  const std::vector<Call>* calls = nullptr;
  const int* set_of_call = nullptr;
  const double* seconds_of_call = nullptr;
  int sets = 0;
  int actor_set = -1, rollout_set = -1;
  double sync_s = 0;
  double controller_s = 0;
  int staleness = 0;   // the rollout runs up to this many batches ahead of the weights it holds
  int sync_every = 1;  // a weight sync after every sync_every-th actor update (1 to staleness + 1)
};
struct ScheduledCall {
  int call = -1;  // index into calls; -1 = weight sync, -2 = controller
  double start_s = 0, end_s = 0;
};
double schedule_iteration(const ScheduleInput& in, std::vector<ScheduledCall>* out = nullptr);

}  // namespace hybridflow::placement
