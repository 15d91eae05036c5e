#include "hybridflow/placement/placement_spec.h"

#include <algorithm>
#include <map>

#include "hybridflow/core/error.h"
#include "hybridflow/core/logging.h"

namespace hybridflow {

namespace {

bool contains(const std::vector<std::string>& items, const std::string& item) {
  return std::find(items.begin(), items.end(), item) != items.end();
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out.empty() ? "(none)" : out;
}

// The roles of `wanted` the run has, in placeable_roles() order.
std::vector<std::string> present(const std::vector<std::string>& run_roles, std::initializer_list<const char*> wanted) {
  std::vector<std::string> out;
  for (const std::string& role : placeable_roles())
    if (contains(run_roles, role) && std::find(wanted.begin(), wanted.end(), role) != wanted.end()) out.push_back(role);
  return out;
}

PoolSpec preset_pool(const Config& config, const std::string& name, const std::string& processes_key,
                     std::vector<std::string> roles) {
  PoolSpec pool;
  pool.name = name;
  pool.processes = config.get<int>(processes_key);
  pool.processes_key = processes_key;
  pool.roles = std::move(roles);
  HF_CHECK(pool.processes >= 1, processes_key, " must be >= 1 (the processes of pool '", name, "'), got ", pool.processes);
  return pool;
}

std::vector<PoolSpec> preset_pools(const Config& config, const std::string& kind, const std::vector<std::string>& roles) {
  if (kind == "colocate")
    return {preset_pool(config, "global", "actor_rollout_ref.num_processes",
                        present(roles, {"actor", "critic", "cost_critic", "reward_model", "cost_model"}))};
  if (kind == "split") {
    std::vector<PoolSpec> pools = {preset_pool(config, "actor", "actor_rollout_ref.num_processes", {"actor"})};
    const auto others = present(roles, {"critic", "cost_critic", "reward_model", "cost_model"});
    if (others.empty()) {
      log_warn("trainer.placement: split puts the actor and the reference in one pool and the critic and reward ",
               "models in another; this run has neither, so it runs on one pool, as colocate would");
    } else if (contains(others, "critic")) {
      pools.push_back(preset_pool(config, "critic", "critic.num_processes", others));
    } else {
      pools.push_back(preset_pool(config, "reward",
                                  contains(others, "reward_model") ? "reward_model.num_processes" : "cost_model.num_processes",
                                  others));
    }
    return pools;
  }
  if (kind == "standalone")
    return {preset_pool(config, "train", "actor_rollout_ref.num_processes",
                        present(roles, {"actor", "critic", "cost_critic", "reward_model", "cost_model"})),
            preset_pool(config, "rollout", "actor_rollout_ref.rollout.num_processes", {"rollout"})};
  HF_FAIL("trainer.placement: expected colocate | split | standalone (or null with a pools: section), got '", kind, "'");
}

bool valid_pool_name(const std::string& name) {
  if (name.empty() || name == "controller") return false;  // "controller" is the controller's own row in the timeline
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

// The `pools:` section as written, every role checked against the roles the run has.
std::vector<PoolSpec> written_pools(const Config& config, const std::vector<std::string>& run_roles) {
  const Config section = config.subtree("pools");
  std::vector<PoolSpec> pools;
  std::map<std::string, std::string> placed;  // role -> pool
  for (const std::string& name : section.keys()) {
    const std::string key = "pools." + name;
    HF_CHECK(valid_pool_name(name), key, ": a pool name is letters, digits, '_' and '-' (and not 'controller'), got '",
             name, "' (", config.origin(key), ")");
    const Config pool_config = config.subtree(key);
    for (const std::string& field : pool_config.keys())
      HF_CHECK(field == "processes" || field == "roles", "unknown key '", key, ".", field, "' (",
               config.origin(key + "." + field), "); a pool has processes and roles");
    HF_CHECK(pool_config.has("processes") && !pool_config.is_null("processes"), key,
             ".processes is missing: how many worker processes the pool has");
    HF_CHECK(pool_config.has("roles") && !pool_config.is_null("roles"), key,
             ".roles is missing: the list of roles the pool runs (", joined(placeable_roles()), ")");
    PoolSpec pool;
    pool.name = name;
    pool.processes = config.get<int>(key + ".processes");
    pool.processes_key = key + ".processes";
    HF_CHECK(pool.processes >= 1, key, ".processes must be >= 1, got ", pool.processes, " (",
             config.origin(key + ".processes"), ")");
    std::vector<std::string> listed = config.get<std::vector<std::string>>(key + ".roles");
    for (const std::string& role : listed) {
      if (role == "ref" || role == "reference")
        HF_FAIL(key, ".roles: '", role, "': the reference model lives in the actor's processes (it is split like the ",
                "actor and read on the actor's batches); place 'actor' and the reference comes with it (",
                config.origin(key + ".roles"), ")");
      HF_CHECK(contains(placeable_roles(), role), key, ".roles: unknown role '", role, "' (", config.origin(key + ".roles"),
               "); the roles are ", joined(placeable_roles()));
      auto [it, first] = placed.emplace(role, name);
      HF_CHECK(first, "role '", role, "' is in two pools: pools.", it->second, " and ", key,
               " (a role runs on all processes of exactly one pool)");
    }
    for (const std::string& role : placeable_roles()) {
      if (!contains(listed, role)) continue;
      if (role == "rollout" || contains(run_roles, role))
        pool.roles.push_back(role);
      else
        log_warn(key, ".roles: this run has no '", role, "' (algorithm.adv_estimator, reward_model.enable and the cost ",
                 "settings decide), so it is not started");
    }
    if (pool.roles.empty()) {
      log_warn(key, ": none of its roles runs in this run, so the pool is not started");
      continue;
    }
    pools.push_back(std::move(pool));
  }
  for (const std::string& role : run_roles)
    HF_CHECK(placed.count(role), "pools: role '", role, "' is not placed; this run needs ", joined(run_roles),
             " (plus rollout, optional) and every one must be listed in exactly one pool's roles");
  return pools;
}

}  // namespace

const std::vector<std::string>& placeable_roles() {
  static const std::vector<std::string> roles = {"actor", "rollout", "critic", "cost_critic", "reward_model", "cost_model"};
  return roles;
}

bool RolePlacement::has(const std::string& role) const {
  for (const auto& pool : pools)
    if (contains(pool.roles, role)) return true;
  return false;
}

const PoolSpec& RolePlacement::pool_of(const std::string& role) const {
  for (const auto& pool : pools)
    if (contains(pool.roles, role)) return pool;
  HF_FAIL("placement ", kind, ": no pool holds role '", role, "'");
}

RolePlacement resolve_placement(const Config& config, const std::vector<std::string>& roles) {
  for (const std::string& role : roles)
    HF_CHECK(role != "rollout" && contains(placeable_roles(), role), "resolve_placement: '", role,
             "' is not a role the run can have");
  HF_CHECK(contains(roles, "actor"), "resolve_placement: every run has an actor");
  const bool has_pools = !config.subtree("pools").keys().empty();
  const bool has_preset = !config.is_null("trainer.placement");
  const bool has_alias = !config.is_null("trainer.colocate");
  HF_CHECK(!(has_preset && has_alias), "trainer.placement (", config.origin("trainer.placement"),
           ") and the deprecated trainer.colocate (", config.origin("trainer.colocate"), ") are both set; keep trainer.placement");
  HF_CHECK(!(has_pools && (has_preset || has_alias)), "a pools: section (", config.origin("pools"), ") and ",
           has_preset ? "trainer.placement" : "trainer.colocate", " are both set; the pools: section is the placement, ",
           "so leave ", has_preset ? "trainer.placement" : "trainer.colocate", " null");
  RolePlacement placement;
  if (has_pools) {
    placement.kind = "pools";
    placement.pools = written_pools(config, roles);
  } else {
    if (has_preset) {
      placement.kind = config.get<std::string>("trainer.placement");
    } else if (has_alias) {
      placement.kind = config.get<bool>("trainer.colocate") ? "colocate" : "split";
      log_warn("trainer.colocate is deprecated: write trainer.placement: ", placement.kind);
    } else {
      placement.kind = "colocate";
    }
    placement.pools = preset_pools(config, placement.kind, roles);
  }
  placement.staleness = config.get<int>("actor_rollout_ref.rollout.staleness");
  HF_CHECK(placement.staleness >= 0,
           "actor_rollout_ref.rollout.staleness: expected k >= 0 (0: on-policy; k: at most k updates off-policy), got ",
           placement.staleness);
  placement.sync_every = config.get<int>("actor_rollout_ref.rollout.trigger_parameter_sync_step");
  // Between two syncs the rollout's weights fall up to sync_every - 1 versions behind: with more than
  // staleness + 1, a step would need samples newer than the rollout can have.
  HF_CHECK(placement.sync_every >= 1 && placement.sync_every <= placement.staleness + 1,
           "actor_rollout_ref.rollout.trigger_parameter_sync_step: expected 1 to staleness + 1 = ",
           placement.staleness + 1, " (weights synced every N updates lag up to N - 1 versions), got ",
           placement.sync_every);
  HF_CHECK(placement.staleness == 0 || placement.standalone_rollout(),
           "actor_rollout_ref.rollout.staleness: ", placement.staleness,
           " overlaps generation with training, which needs generation on its own ",
           "pool: trainer.placement: standalone, or a pools: section with a 'rollout' role (placement here: ",
           placement.kind, ")");
  return placement;
}

std::string describe_placement(const RolePlacement& placement) {
  std::string out;
  for (const auto& pool : placement.pools)
    out += (out.empty() ? "" : "\n") + std::string("pool '") + pool.name + "' (" + std::to_string(pool.processes) +
           (pool.processes == 1 ? " process" : " processes") + ", " + pool.processes_key + "): " + joined(pool.roles);
  return out;
}

}  // namespace hybridflow
