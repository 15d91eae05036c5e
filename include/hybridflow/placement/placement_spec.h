// Which resource pool each role of an RL run lives in, resolved from the config alone: a preset
// (trainer.placement: colocate | split | standalone, the adaptive placement paper's Flattening,
// Interleaving and Separation) or any assignment written in a `pools:` section. Pure (no process is
// touched), so every impossible placement is an error naming the key before anything starts.
// docs/configuration.md ("Placement") lists the presets, the roles and the errors.
#pragma once

#include <string>
#include <vector>

#include "hybridflow/core/config.h"

namespace hybridflow {

// The roles a placement assigns. `rollout` is optional: placed, it generates on its own pool from a
// shadow copy of the actor's weights; otherwise the actor generates. The reference model is no role of
// its own: it lives in the actor's processes.
const std::vector<std::string>& placeable_roles();

struct PoolSpec {
  std::string name;
  int processes = 1;
  std::string processes_key;       // where `processes` came from, e.g. "pools.gen.processes", for errors
  std::vector<std::string> roles;  // in placeable_roles() order
};

struct RolePlacement {
  std::string kind;             // colocate | split | standalone | pools (a `pools:` section)
  std::vector<PoolSpec> pools;  // in start order; only pools that hold a role of the run
  int staleness = 0;            // actor_rollout_ref.rollout.staleness (> 0 only with a rollout pool)
  int sync_every = 1;           // actor_rollout_ref.rollout.trigger_parameter_sync_step (<= staleness + 1)

  bool has(const std::string& role) const;
  // The pool that holds `role`; Error naming the role when none does.
  const PoolSpec& pool_of(const std::string& role) const;
  bool standalone_rollout() const { return has("rollout"); }
};

// `roles`: the roles this run has besides `rollout` (actor always; critic, cost_critic, reward_model,
// cost_model as the algorithm needs them). Reads trainer.placement, the deprecated trainer.colocate,
// pools, the num_processes keys the presets size their pools by and actor_rollout_ref.rollout.staleness.
RolePlacement resolve_placement(const Config& config, const std::vector<std::string>& roles);

// One line per pool ("pool 'train' (2 processes): actor, critic"), for the log.
std::string describe_placement(const RolePlacement& placement);

}  // namespace hybridflow
