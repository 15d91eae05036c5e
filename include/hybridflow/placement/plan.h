// A device mapping of an RL dataflow (HybridFlow section 6): a placement (a set partition of the roles into
// colocated sets), the devices of each set, and every role's parallel layout on its set's devices.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "hybridflow/placement/workload.h"

namespace hybridflow::placement {

inline constexpr int kRoleCount = 7;
inline int role_index(Role r) { return static_cast<int>(r); }

// A role's layout on its set: pipeline stages x tensor-parallel ranks x data-parallel ranks = the set's
// devices. For the rollout it is the generation layout (p_g, t_g, and d_g replicas). sp: groups of that many
// data-parallel ranks split each sequence (Ulysses, ulysses_sequence_parallel_size), so dp / sp replicas
// take distinct sequences; 1 for the rollout.
struct Layout {
  int pp = 1, tp = 1, dp = 1, sp = 1;
  int devices() const { return pp * tp * dp; }
  int replicas() const { return dp / sp; }
  bool operator==(const Layout&) const = default;
};

struct DeviceSet {
  std::vector<Role> roles;  // colocated: they share these devices and run one after another
  int devices = 0;
};

struct Plan {
  std::vector<DeviceSet> sets;
  std::array<Layout, kRoleCount> layouts{};
  int staleness = 0;   // > 0 only when the rollout is standalone
  int sync_every = 1;  // trigger_parameter_sync_step: 1 to staleness + 1

  // Index of the set holding `r`, or -1.
  int set_of(Role r) const;
  const Layout& layout(Role r) const { return layouts[role_index(r)]; }
  Layout& layout(Role r) { return layouts[role_index(r)]; }
  int devices() const;
  // "colocate" (one set holds every role), "standalone" (the rollout apart from the actor) or "split".
  std::string placement_name() const;
  // "{actor,rollout,ref}x8 {critic,reward_model}x8"
  std::string describe() const;
};

// "p2 t4 d1" (rollout: "p_g1 t_g2 d_g4"; with sequence parallelism "p1 t1 d8 s4").
std::string layout_text(Role r, const Layout& l);

}  // namespace hybridflow::placement
