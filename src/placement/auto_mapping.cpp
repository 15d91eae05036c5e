#include "hybridflow/placement/auto_mapping.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <unordered_map>

#include "hybridflow/core/error.h"
#include "hybridflow/placement/set_partitions.h"
#include "trainer_placements.h"

namespace hybridflow::placement {

namespace {

struct Candidate {
  Layout layout;
  double seconds = 0;  // the role's calls in one iteration (generation excluded: it depends on the KV cache)
  RoleMemory memory;
};

// What Algorithm 2 chose for one colocated set on a number of devices.
struct SetChoice {
  bool feasible = false;
  std::array<Layout, kRoleCount> layouts{};
  std::vector<double> call_seconds;  // per call of the iteration; only the set's own calls are filled in
};

class Searcher {
 public:
  Searcher(const ClusterSpec& cluster, const ModelShape& model, const Workload& w, const SearchOptions& options)
      : in_{cluster, model, w}, options_(options), calls_(iteration_calls(w)), roles_(w.roles()) {}

  const std::vector<Role>& roles() const { return roles_; }
  const std::vector<Call>& calls() const { return calls_; }
  const CostInputs& inputs() const { return in_; }
  int64_t set_layouts = 0, layouts_costed = 0;

  const SetChoice& choose(uint32_t mask, int devices) {
    const uint64_t key = (static_cast<uint64_t>(mask) << 32) | static_cast<uint32_t>(devices);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    ++set_layouts;
    return cache_.emplace(key, auto_parallel(mask, devices)).first->second;
  }

 private:
  bool in(uint32_t mask, Role r) const { return (mask >> role_index(r)) & 1U; }

  // Every layout of `role` on `devices` the model and batch allow, sequence-parallel groups (sp dividing dp)
  // included: they cost all-to-alls, so the search takes them where a sequence's activations do not fit whole.
  std::vector<Layout> layouts_of(Role role, int devices) const {
    std::vector<Layout> out;
    const ModelShape& m = in_.model;
    for (int pp = 1; pp <= devices; ++pp) {
      if (m.layers % pp != 0 || devices % pp != 0) continue;
      for (int tp = 1; tp * pp <= devices && tp <= in_.cluster.gpus_per_node; ++tp) {
        if (devices % (tp * pp) != 0) continue;
        const int dp = devices / (tp * pp);
        for (int sp = 1; sp <= dp; ++sp) {
          if (dp % sp != 0) continue;
          const Layout l{pp, tp, dp, sp};
          if (layout_problem(in_.cluster, m, in_.workload, role, l, devices).empty()) out.push_back(l);
        }
      }
    }
    return out;
  }

  // A role's own calls on a layout (the rollout's are costed with the set's KV cache instead).
  Candidate candidate(Role role, const Layout& l) {
    ++layouts_costed;
    Candidate c;
    c.layout = l;
    c.memory = role_memory(in_, role, l);
    for (const Call& call : calls_)
      if (call.role == role) c.seconds += call_cost(in_, call, l, 0.0).total();
    return c;
  }

  // Algorithm 2 for every role of the set at once, since they share the devices' memory: from several starts,
  // twice over the roles, move each to the layout with the least total time of the set's calls that still
  // fits, and keep the best. The actor and its colocated rollout move together (t_g | t, p_g | p); without
  // independent layouts the reference follows the actor and the cost critic the critic (they share worker
  // processes).
  SetChoice auto_parallel(uint32_t mask, int devices) {
    SetChoice out;
    const bool together = in(mask, Role::kActor) && in(mask, Role::kRollout);
    const bool follow = !options_.capabilities.independent_layouts;
    auto leader_of = [&](Role r) {
      if (follow && r == Role::kRef && in(mask, Role::kActor)) return Role::kActor;
      if (follow && r == Role::kCostCritic && in(mask, Role::kCritic)) return Role::kCritic;
      return r;
    };
    std::vector<Role> free_roles;  // chosen on their own; the rollout is handled apart
    for (Role r : roles_)
      if (in(mask, r) && r != Role::kRollout && leader_of(r) == r) free_roles.push_back(r);
    std::map<Role, std::vector<Candidate>> options;
    for (Role r : free_roles) {
      for (const Layout& l : layouts_of(r, devices)) {
        Candidate c = candidate(r, l);
        for (Role f : roles_)  // a follower's calls and memory ride on its leader's layout
          if (f != r && in(mask, f) && leader_of(f) == r) {
            const Candidate fc = candidate(f, l);
            c.seconds += fc.seconds;
            c.memory.persistent += fc.memory.persistent;
            c.memory.transient = std::max(c.memory.transient, fc.memory.transient);
          }
        options[r].push_back(c);
      }
      if (options[r].empty()) return out;
    }
    std::vector<Layout> rollout_layouts;
    if (in(mask, Role::kRollout)) {
      rollout_layouts = layouts_of(Role::kRollout, devices);
      if (!together && !options_.capabilities.staged_standalone_rollout)
        std::erase_if(rollout_layouts, [](const Layout& l) { return l.pp != 1; });
      if (rollout_layouts.empty()) return out;
    }
    const double usable = in_.cluster.usable_memory();
    std::map<Role, size_t> pick;
    Layout rollout{};
    // The set's memory and time with the current picks, or infinity when it does not fit.
    auto evaluate = [&]() {
      double persistent = 0, transient = 0, seconds = 0;
      for (Role r : free_roles) {
        const Candidate& c = options[r][pick[r]];
        persistent += c.memory.persistent;
        transient = std::max(transient, c.memory.transient);
        seconds += c.seconds;
      }
      if (in(mask, Role::kRollout)) {
        const Layout* actor = together ? &options[Role::kActor][pick[Role::kActor]].layout : nullptr;
        if (actor && (actor->tp % rollout.tp != 0 || actor->pp % rollout.pp != 0)) return kInfeasible;
        const RoleMemory rm = role_memory(in_, Role::kRollout, rollout, together, actor ? *actor : Layout{});
        persistent += rm.persistent;
        transient = std::max(transient, rm.transient);
        if (persistent + transient > usable) return kInfeasible;
        const double kv = usable - persistent - (rm.transient - rm.kv_minimum);
        for (const Call& call : calls_)
          if (call.role == Role::kRollout) seconds += call_cost(in_, call, rollout, kv, actor).total();
        ++layouts_costed;
        return seconds;
      }
      return persistent + transient > usable ? kInfeasible : seconds;
    };
    auto least_memory_rollout = [&]() {
      double least = kInfeasible;
      Layout chosen = rollout_layouts.front();
      for (const Layout& g : rollout_layouts) {
        const Layout* actor = together ? &options[Role::kActor][pick[Role::kActor]].layout : nullptr;
        if (actor && (actor->tp % g.tp != 0 || actor->pp % g.pp != 0)) continue;
        const RoleMemory rm = role_memory(in_, Role::kRollout, g, together, actor ? *actor : Layout{});
        if (rm.persistent + rm.transient < least) least = rm.persistent + rm.transient, chosen = g;
      }
      rollout = chosen;
    };
    // Coordinate descent: twice over the roles, each moved to its layout with the least set time that fits.
    auto descend = [&](double current) {
      for (int pass = 0; pass < 2; ++pass) {
        for (Role r : free_roles) {
          const bool joint = together && r == Role::kActor;
          size_t best_pick = pick[r];
          Layout best_rollout = rollout;
          for (size_t i = 0; i < options[r].size(); ++i) {
            pick[r] = i;
            for (size_t g = 0; g < (joint ? rollout_layouts.size() : 1); ++g) {
              if (joint) rollout = rollout_layouts[g];
              const double t = evaluate();
              if (t < current) current = t, best_pick = i, best_rollout = rollout;
            }
          }
          pick[r] = best_pick;
          rollout = best_rollout;
        }
        if (in(mask, Role::kRollout) && !together) {
          Layout best_rollout = rollout;
          for (const Layout& g : rollout_layouts) {
            rollout = g;
            const double t = evaluate();
            if (t < current) current = t, best_rollout = g;
          }
          rollout = best_rollout;
        }
      }
      return current;
    };
    // Starts: each role at the layout with the least seconds + price x bytes, for prices from 0 (the fastest
    // layouts, which may not fit) up to where memory dominates (the least-memory layouts). Memory couples the
    // roles only through the sum, so each start is a point on the time/memory trade-off; the descent then
    // refines it. The best result of all starts is kept.
    double best_time = kInfeasible;
    std::map<Role, size_t> best_picks;
    Layout best_rollout{};
    for (double price : {-1.0, 0.0, 1e-12, 1e-11, 3e-11, 1e-10, 3e-10, 1e-9, 1e-8}) {
      for (Role r : free_roles) {
        size_t chosen = 0;
        double score = kInfeasible;
        for (size_t i = 0; i < options[r].size(); ++i) {
          const Candidate& c = options[r][i];
          const double bytes = c.memory.persistent + c.memory.transient;
          const double s = price < 0 ? bytes : c.seconds + price * bytes;  // -1: least memory
          if (s < score) score = s, chosen = i;
        }
        pick[r] = chosen;
      }
      if (in(mask, Role::kRollout)) least_memory_rollout();
      const double start = evaluate();
      if (!(start < kInfeasible)) continue;
      const double t = descend(start);
      if (t < best_time) best_time = t, best_picks = pick, best_rollout = rollout;
    }
    if (!(best_time < kInfeasible)) return out;
    pick = best_picks;
    rollout = best_rollout;
    return finish(mask, options, pick, rollout, leader_of);
  }

  template <typename LeaderOf>
  SetChoice finish(uint32_t mask, std::map<Role, std::vector<Candidate>>& options, std::map<Role, size_t>& pick,
                   const Layout& rollout, const LeaderOf& leader_of) {
    SetChoice out;
    for (Role r : roles_) {
      if (!in(mask, r)) continue;
      if (r == Role::kRollout) out.layouts[role_index(r)] = rollout;
      else out.layouts[role_index(r)] = options[leader_of(r)][pick[leader_of(r)]].layout;
    }
    // The calls' seconds exactly as simulate() costs them.
    const bool together = in(mask, Role::kActor) && in(mask, Role::kRollout);
    double persistent = 0, transient = 0, extra = 0;
    for (Role r : roles_) {
      if (!in(mask, r)) continue;
      const RoleMemory rm = role_memory(in_, r, out.layouts[role_index(r)], r == Role::kRollout && together,
                                        out.layouts[role_index(Role::kActor)]);
      persistent += rm.persistent;
      transient = std::max(transient, rm.transient);
      if (r == Role::kRollout) extra = rm.transient - rm.kv_minimum;
    }
    const double usable = in_.cluster.usable_memory();
    if (persistent + transient > usable) return out;
    const double kv = usable - persistent - extra;
    out.call_seconds.assign(calls_.size(), 0.0);
    for (size_t i = 0; i < calls_.size(); ++i) {
      const Role r = calls_[i].role;
      if (!in(mask, r)) continue;
      const Layout* actor = together && r == Role::kRollout ? &out.layouts[role_index(Role::kActor)] : nullptr;
      out.call_seconds[i] = call_cost(in_, calls_[i], out.layouts[role_index(r)], kv, actor).total();
      if (!(out.call_seconds[i] < kInfeasible)) return out;
    }
    out.feasible = true;
    return out;
  }

  CostInputs in_;
  const SearchOptions& options_;
  std::vector<Call> calls_;
  std::vector<Role> roles_;
  std::unordered_map<uint64_t, SetChoice> cache_;
};

// Sub-node sets must pack into the nodes whole-node sets leave (first fit, largest first).
bool packs(const std::vector<int>& sizes, const ClusterSpec& c) {
  std::vector<int> small;
  int whole = 0;
  for (int s : sizes) {
    if (s >= c.gpus_per_node) whole += s / c.gpus_per_node;
    else small.push_back(s);
  }
  std::sort(small.rbegin(), small.rend());
  std::vector<int> room(static_cast<size_t>(c.nodes - whole), c.gpus_per_node);
  for (int s : small) {
    auto it = std::find_if(room.begin(), room.end(), [&](int r) { return r >= s; });
    if (it == room.end()) return false;
    *it -= s;
  }
  return true;
}

}  // namespace

std::vector<int> set_sizes(const ClusterSpec& cluster) {
  std::vector<int> sizes;
  const int g = cluster.gpus_per_node;
  for (int s = 1; s < g; ++s)
    if (g % s == 0) sizes.push_back(s);
  for (int n = 1; n <= cluster.nodes; ++n) sizes.push_back(n * g);
  return sizes;
}

SearchResult search_plans(const ClusterSpec& cluster, const ModelShape& model, const Workload& workload,
                          const SearchOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  model.validate();
  workload.validate();
  Searcher searcher(cluster, model, workload, options);
  const std::vector<Role>& roles = searcher.roles();
  const std::vector<int> sizes = set_sizes(cluster);
  const int total = cluster.devices();
  SearchResult result;

  struct Best {
    double seconds = kInfeasible;
    std::vector<std::vector<Role>> sets;
    std::vector<int> devices;
  };
  std::vector<Best> per_placement;
  const std::vector<Call>& calls = searcher.calls();
  std::vector<int> set_of_call(calls.size());
  std::vector<double> seconds(calls.size());

  for_each_set_partition(static_cast<int>(roles.size()), [&](const std::vector<std::vector<int>>& blocks) {
    std::vector<std::vector<Role>> sets;
    for (const auto& b : blocks) {
      sets.emplace_back();
      for (int i : b) sets.back().push_back(roles[static_cast<size_t>(i)]);
    }
    if (!placement_allowed(sets, options.capabilities)) return true;
    ++result.placements;
    const int k = static_cast<int>(sets.size());
    if (k > total) return true;
    std::vector<uint32_t> masks(static_cast<size_t>(k), 0);
    for (int b = 0; b < k; ++b)
      for (Role r : sets[static_cast<size_t>(b)]) masks[static_cast<size_t>(b)] |= 1U << role_index(r);
    // get_min_alloc: the least devices each set can hold its models on.
    std::vector<int> least(static_cast<size_t>(k), 0);
    for (int b = 0; b < k; ++b) {
      for (int s : sizes)
        if (searcher.choose(masks[static_cast<size_t>(b)], s).feasible) {
          least[static_cast<size_t>(b)] = s;
          break;
        }
      if (least[static_cast<size_t>(b)] == 0) return true;
    }
    int actor_set = 0, rollout_set = 0;
    for (int b = 0; b < k; ++b) {
      if (masks[static_cast<size_t>(b)] >> role_index(Role::kActor) & 1U) actor_set = b;
      if (masks[static_cast<size_t>(b)] >> role_index(Role::kRollout) & 1U) rollout_set = b;
    }
    for (size_t i = 0; i < calls.size(); ++i)
      for (int b = 0; b < k; ++b)
        if (masks[static_cast<size_t>(b)] >> role_index(calls[i].role) & 1U) set_of_call[i] = b;
    const int staleness = actor_set == rollout_set ? 0 : workload.staleness;
    Best best;
    std::vector<int> alloc(static_cast<size_t>(k), 0);
    std::vector<int> suffix_least(static_cast<size_t>(k) + 1, 0);
    for (int b = k - 1; b >= 0; --b) suffix_least[static_cast<size_t>(b)] = suffix_least[static_cast<size_t>(b) + 1] + least[static_cast<size_t>(b)];
    // enum_alloc, then d_cost for each allocation.
    auto enumerate = [&](auto&& self, int b, int left) -> void {
      if (b == k) {
        if (left != 0 || !packs(alloc, cluster)) return;
        ++result.allocations;
        std::vector<const SetChoice*> choice(static_cast<size_t>(k));
        for (int j = 0; j < k; ++j) choice[static_cast<size_t>(j)] = &searcher.choose(masks[static_cast<size_t>(j)], alloc[static_cast<size_t>(j)]);
        for (size_t i = 0; i < calls.size(); ++i)
          seconds[i] = choice[static_cast<size_t>(set_of_call[i])]->call_seconds[i];
        double sync = 0;
        if (actor_set != rollout_set) {
          const Layout& a = choice[static_cast<size_t>(actor_set)]->layouts[role_index(Role::kActor)];
          const Layout& g = choice[static_cast<size_t>(rollout_set)]->layouts[role_index(Role::kRollout)];
          const bool same_node = alloc[static_cast<size_t>(actor_set)] + alloc[static_cast<size_t>(rollout_set)] <= cluster.gpus_per_node;
          sync = weight_sync_seconds(searcher.inputs(), a, g, same_node).total();
        }
        ScheduleInput si;
        si.calls = &calls;
        si.set_of_call = set_of_call.data();
        si.seconds_of_call = seconds.data();
        si.sets = k;
        si.actor_set = actor_set;
        si.rollout_set = rollout_set;
        si.sync_s = sync;
        si.controller_s = cluster.overheads.iteration_s;
        si.staleness = staleness;
        si.sync_every = actor_set == rollout_set ? 1 : workload.sync_every;
        const double t = schedule_iteration(si);
        if (t < best.seconds) {
          best.seconds = t;
          best.sets = sets;
          best.devices = alloc;
        }
        return;
      }
      for (int s : sizes) {
        if (s < least[static_cast<size_t>(b)] || s + suffix_least[static_cast<size_t>(b) + 1] > left) continue;
        if (b == k - 1 && s != left) continue;
        if (!searcher.choose(masks[static_cast<size_t>(b)], s).feasible) continue;
        alloc[static_cast<size_t>(b)] = s;
        self(self, b + 1, left - s);
      }
    };
    enumerate(enumerate, 0, total);
    if (best.seconds < kInfeasible) per_placement.push_back(best);
    return true;
  });

  std::sort(per_placement.begin(), per_placement.end(), [](const Best& a, const Best& b) { return a.seconds < b.seconds; });
  auto to_plan = [&](const Best& b) {
    RankedPlan r;
    for (size_t j = 0; j < b.sets.size(); ++j) {
      DeviceSet set;
      set.roles = b.sets[j];
      set.devices = b.devices[j];
      uint32_t mask = 0;
      for (Role role : set.roles) mask |= 1U << role_index(role);
      const SetChoice& c = searcher.choose(mask, set.devices);
      for (Role role : set.roles) r.plan.layout(role) = c.layouts[role_index(role)];
      r.plan.sets.push_back(set);
    }
    if (r.plan.set_of(Role::kActor) != r.plan.set_of(Role::kRollout)) {
      r.plan.staleness = workload.staleness;
      r.plan.sync_every = workload.sync_every;
    }
    r.estimate = simulate(r.plan, cluster, model, workload);
    return r;
  };
  for (size_t i = 0; i < per_placement.size() && static_cast<int>(i) <= options.runners_up; ++i) {
    RankedPlan r = to_plan(per_placement[i]);
    if (i == 0) {
      result.found = r.estimate.feasible;
      result.best = std::move(r);
    } else {
      result.runners_up.push_back(std::move(r));
    }
  }
  result.set_layouts = searcher.set_layouts;
  result.layouts_costed = searcher.layouts_costed;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

}  // namespace hybridflow::placement
