// Auto device mapping after HybridFlow's Algorithms 1 and 2. For every placement (a set partition of the
// roles, get_placements), the least devices each colocated set needs to hold its models (get_min_alloc),
// then every allocation of the cluster's devices to the sets (enum_alloc: whole nodes, or power-of-two
// parts of a node that pack into nodes), then for every set and role the parallel layout with the least
// simulated time of that role's calls (auto_parallel: p >= p_min, t >= t_min, d = the rest; for the actor
// colocated with its rollout, the generation layout t_g | t, p_g | p with it), and the whole plan's
// iteration time by the dataflow simulator (d_cost). Set choices are cached by (roles, devices), so each is
// simulated once however many placements and allocations share it.
#pragma once

#include <cstdint>
#include <vector>

#include "hybridflow/placement/simulator.h"
#include "hybridflow/placement/trainer_support.h"

namespace hybridflow::placement {

struct SearchOptions {
  TrainerCapabilities capabilities = TrainerCapabilities::anything();
  int runners_up = 5;  // the best plan of this many other placements
};

struct RankedPlan {
  Plan plan;
  Estimate estimate;
};

struct SearchResult {
  bool found = false;
  RankedPlan best;
  std::vector<RankedPlan> runners_up;  // fastest first, one per placement (set partition)
  int64_t placements = 0;              // set partitions considered
  int64_t allocations = 0;             // device allocations simulated
  int64_t set_layouts = 0;             // (set, devices) choices made (each cached)
  int64_t layouts_costed = 0;          // role layouts whose calls were costed
  double seconds = 0;                  // wall time of the search
};

SearchResult search_plans(const ClusterSpec& cluster, const ModelShape& model, const Workload& workload,
                          const SearchOptions& options = {});

// Sizes a set may take on this cluster: 1, 2, 4, ... up to a node, then whole nodes.
std::vector<int> set_sizes(const ClusterSpec& cluster);

}  // namespace hybridflow::placement
