#include "hybridflow/placement/simulator.h"

#include <algorithm>
#include <set>

#include "hybridflow/parallel/sequence_parallel_heads.h"

namespace hybridflow::placement {

namespace {

std::string text(const std::string& a, int64_t b) { return a + std::to_string(b); }

}  // namespace

std::string layout_problem(const ClusterSpec& cluster, const ModelShape& model, const Workload& w, Role role,
                           const Layout& l, int devices) {
  const std::string who = role_name(role) + " " + layout_text(role, l) + ": ";
  if (l.pp < 1 || l.tp < 1 || l.dp < 1 || l.sp < 1) return who + "sizes must be at least 1";
  if (l.devices() != devices) return who + text("p x t x d is not its set's ", devices) + " devices";
  if (model.heads % l.tp != 0) return who + text("tensor-parallel size does not divide the ", model.heads) + " heads";
  if (model.kv_heads % l.tp != 0 && l.tp % model.kv_heads != 0)
    return who + text("tensor-parallel size and the ", model.kv_heads) + " KV heads do not divide one another";
  if (l.tp > cluster.gpus_per_node) return who + "tensor parallelism would span nodes";
  if (model.layers % l.pp != 0) return who + text("pipeline stages do not divide the ", model.layers) + " layers";
  if (l.sp > 1) {
    // What the model splits (model/transformer.cpp): the actor's, reference's and critic's whole-sequence
    // passes; a rank's query heads (its tensor-parallel share) split evenly, its KV heads into
    // whole heads or repeated when fewer than the group.
    if (role != Role::kActor && role != Role::kRef && role != Role::kCritic)
      return who + "sequence parallelism covers the actor, reference and critic only";
    if (l.dp % l.sp != 0) return who + text("sequence-parallel groups do not divide the ", l.dp) + " data-parallel ranks";
    const RankHeads heads = tensor_parallel_rank_heads(model.heads, model.kv_heads, l.tp);
    if (!sequence_parallel_splits(heads, l.sp))
      return who + text("sequence-parallel size does not split a rank's ", heads.query) + " heads and its KV heads";
  }
  if (role == Role::kRollout) {
    if (w.prompts % l.dp != 0) return who + text("the ", w.prompts) + " prompts do not divide over the replicas";
    return "";
  }
  const int replicas = l.replicas();
  if (w.sequences() % replicas != 0) return who + text("the ", w.sequences()) + " sequences do not divide over the replicas";
  if (trains(role) && (w.sequences() / w.mini_batches) % replicas != 0)
    return who + text("a mini-batch of ", w.sequences() / w.mini_batches) + " sequences does not divide over the replicas";
  if (trains(role) && (w.sequences() / w.mini_batches / replicas) % w.train_micro_rows != 0)
    return who + text("a replica's mini-batch does not divide into micro-batches of ", w.train_micro_rows) + " sequences";
  return "";
}

Breakdown call_cost(const CostInputs& in, const Call& call, const Layout& layout, double kv_capacity,
                    const Layout* actor) {
  switch (call.kind) {
    case CallKind::kGenerate:
    case CallKind::kGenerateGreedy: {
      const GenerationCost g = generation_seconds(in, layout, call.rows, kv_capacity);
      Breakdown b = g.time;
      if (g.feasible && actor != nullptr) b += reshard_seconds(in, *actor, layout);
      return b;
    }
    case CallKind::kUpdate: return training_seconds(in, call.role, layout, call.rows);
    default: return forward_seconds(in, call.role, layout, call.rows);
  }
}

double schedule_iteration(const ScheduleInput& in, std::vector<ScheduledCall>* out) {
  const std::vector<Call>& calls = *in.calls;
  const int n = static_cast<int>(calls.size());
  const bool sync = in.sync_s > 0 && in.rollout_set != in.actor_set;
  const int staleness = sync ? std::max(0, in.staleness) : 0;
  // Weights reach the rollout after every sync_every-th update only (trigger_parameter_sync_step).
  const int sync_every = sync ? std::clamp(in.sync_every, 1, staleness + 1) : 1;
  // The schedule repeats every sync_every iterations: measure over a whole number of repeats, after the
  // buffer has filled, and before the tail where no later generation competes for the rollout's set.
  const int window = std::max(2, sync_every);
  const int last = (staleness == 0 ? 1 : staleness + 2 * sync_every + 1) + window;
  const int iterations = last + std::max(2, staleness + 1);
  int first_training = n, actor_update = -1;
  for (int i = 0; i < n; ++i) {
    if (calls[i].stage == Stage::kTraining) first_training = std::min(first_training, i);
    if (calls[i].role == Role::kActor && calls[i].kind == CallKind::kUpdate) actor_update = i;
  }
  // Tasks per iteration: the calls, then the controller's work (index n), then the weight sync (n + 1).
  const int per_iteration = n + 2;
  std::vector<double> end(static_cast<size_t>(iterations * per_iteration), -1.0);
  std::vector<double> start(end.size(), 0.0);
  std::vector<double> free_at(static_cast<size_t>(in.sets + 1), 0.0);  // the last is the controller
  auto task = [&](int k, int i) { return static_cast<size_t>(k * per_iteration + i); };
  auto finished = [&](int k, int i) { return k < 0 ? 0.0 : end[task(k, i)]; };

  auto run = [&](int k, int i, double ready, std::initializer_list<int> sets, double seconds) {
    double t = ready;
    for (int s : sets) t = std::max(t, free_at[static_cast<size_t>(s)]);
    for (int s : sets) free_at[static_cast<size_t>(s)] = t + seconds;
    start[task(k, i)] = t;
    end[task(k, i)] = t + seconds;
  };
  // The weights a generation starts from: those of the last update (on-policy), or for a standalone
  // rollout the last sync's; with staleness k the rollout may run k batches ahead of them, and pauses
  // (the buffer is full) until the next sync.
  auto run_generation = [&](int k, int weights_of) {
    for (int i = 0; i < n; ++i) {
      if (calls[i].stage != Stage::kGeneration) continue;
      double ready = sync ? finished(weights_of, n + 1) : (actor_update >= 0 ? finished(weights_of, actor_update) : 0.0);
      for (int j : calls[i].after) ready = std::max(ready, end[task(k, j)]);
      run(k, i, ready, {in.set_of_call[i]}, in.seconds_of_call[i]);
    }
  };
  auto run_rest = [&](int k) {
    for (int i = 0; i < n; ++i) {
      if (calls[i].stage == Stage::kGeneration) continue;
      if (i == first_training) {
        double ready = 0;
        for (int j = 0; j < first_training; ++j) ready = std::max(ready, end[task(k, j)]);
        run(k, n, ready, {in.sets}, in.controller_s);
      }
      double ready = i >= first_training ? end[task(k, n)] : 0.0;
      for (int j : calls[i].after) ready = std::max(ready, end[task(k, j)]);
      run(k, i, ready, {in.set_of_call[i]}, in.seconds_of_call[i]);
    }
    if (first_training == n) run(k, n, 0.0, {in.sets}, in.controller_s);
    if (sync && (k + 1) % sync_every == 0) run(k, n + 1, finished(k, actor_update), {in.actor_set, in.rollout_set}, in.sync_s);
    else start[task(k, n + 1)] = end[task(k, n + 1)] = -1;
  };
  // Each set takes its calls in the order the controller submits them: after each step, the rollout of
  // every later step whose samples, from the weights the rollout holds (version v, after iteration v - 1),
  // stay at most k updates old (step <= v + k).
  int generated = 0, version = 0, version_from = -1;
  for (int k = 0; k < iterations; ++k) {
    for (; generated < iterations && generated <= version + staleness; ++generated) run_generation(generated, version_from);
    run_rest(k);
    if (!sync || (k + 1) % sync_every == 0) {
      version = k + 1;
      version_from = k;
    }
  }
  auto iteration_end = [&](int k) {
    double t = 0;
    for (int i = 0; i < per_iteration; ++i) t = std::max(t, end[task(k, i)]);
    return t;
  };
  const double period = (iteration_end(last) - iteration_end(last - window)) / window;
  if (out) {
    out->clear();
    const int k = last - 1;
    double origin = -1;
    for (int i = 0; i < per_iteration; ++i)
      if (end[task(k, i)] >= 0 && (origin < 0 || start[task(k, i)] < origin)) origin = start[task(k, i)];
    for (int i = 0; i < per_iteration; ++i) {
      if (end[task(k, i)] < 0) continue;
      out->push_back({i < n ? i : (i == n ? -2 : -1), start[task(k, i)] - origin, end[task(k, i)] - origin});
    }
  }
  return period;
}

Estimate simulate(const Plan& plan, const ClusterSpec& cluster, const ModelShape& model, const Workload& workload) {
  Estimate e;
  const CostInputs in{cluster, model, workload};
  auto fail = [&](const std::string& why) {
    e.feasible = false;
    e.why_not = why;
    return e;
  };
  // Shape: every role of the algorithm exactly once, sets with devices, no more devices than the cluster has.
  const std::vector<Role> roles = workload.roles();
  std::multiset<Role> placed;
  for (const auto& s : plan.sets) {
    if (s.roles.empty()) return fail("a set holds no role");
    if (s.devices < 1) return fail("a set has no device");
    placed.insert(s.roles.begin(), s.roles.end());
  }
  if (!workload.reference && placed.count(Role::kRef) > 0)
    return fail("the reference is placed, but the workload has none (no KL loss or KL in the reward)");
  for (Role r : roles)
    if (placed.count(r) != 1) return fail(role_name(r) + " is placed " + std::to_string(placed.count(r)) + " times");
  if (placed.size() != roles.size()) return fail("a role that " + algorithm_name(workload.algorithm) + " does not use is placed");
  if (plan.devices() > cluster.devices())
    return fail("the sets take " + std::to_string(plan.devices()) + " devices of " + std::to_string(cluster.devices()));
  const int actor_set = plan.set_of(Role::kActor), rollout_set = plan.set_of(Role::kRollout);
  const bool together = actor_set == rollout_set;
  if (plan.staleness > 0 && together) return fail("staleness needs a standalone rollout");
  if (plan.staleness < 0 || plan.sync_every < 1 || plan.sync_every > plan.staleness + 1)
    return fail("weight syncs every " + std::to_string(plan.sync_every) + " updates need staleness >= 0 and 1 <= N <= " +
                "staleness + 1");
  for (Role r : roles) {
    const std::string problem =
        layout_problem(cluster, model, workload, r, plan.layout(r), plan.sets[static_cast<size_t>(plan.set_of(r))].devices);
    if (!problem.empty()) return fail(problem);
  }
  const Layout& actor = plan.layout(Role::kActor);
  const Layout& rollout = plan.layout(Role::kRollout);
  if (together && (actor.tp % rollout.tp != 0 || actor.pp % rollout.pp != 0))
    return fail("the rollout's t_g and p_g must divide the actor's t and p to switch layouts in place");

  // Memory per device of each set: everything persistent plus the largest transient need.
  std::vector<double> extra_generation(plan.sets.size(), 0.0);
  for (size_t s = 0; s < plan.sets.size(); ++s) {
    SetMemory mem;
    mem.usable = cluster.usable_memory();
    double transient = 0;
    for (Role r : plan.sets[s].roles) {
      const RoleMemory rm = role_memory(in, r, plan.layout(r), r == Role::kRollout && together, actor);
      mem.persistent += rm.persistent;
      transient = std::max(transient, rm.transient);
      if (r == Role::kRollout) extra_generation[s] = rm.transient - rm.kv_minimum;
    }
    mem.peak = mem.persistent + transient;
    if (static_cast<int>(s) == rollout_set) mem.kv_capacity = mem.usable - mem.persistent - extra_generation[s];
    mem.fits = mem.peak <= mem.usable;
    e.memory.push_back(mem);
    if (!mem.fits) {
      std::string names;
      for (Role r : plan.sets[s].roles) names += (names.empty() ? "" : ",") + role_name(r);
      return fail("{" + names + "} needs " + std::to_string(mem.peak / 1e9) + " GB per device of " +
                  std::to_string(mem.usable / 1e9) + " GB usable");
    }
  }

  // Each call's seconds on its set.
  const std::vector<Call> calls = iteration_calls(workload);
  std::vector<int> set_of_call;
  std::vector<Breakdown> cost;
  for (const Call& call : calls) {
    const double kv = call.role == Role::kRollout ? e.memory[static_cast<size_t>(rollout_set)].kv_capacity : 0.0;
    const Breakdown b = call_cost(in, call, plan.layout(call.role), kv, together ? &actor : nullptr);
    if (!(b.total() < kInfeasible)) return fail("the rollout's KV cache cannot hold one sequence per replica");
    if (call.kind == CallKind::kGenerate) {
      const GenerationCost g = generation_seconds(in, rollout, call.rows, kv);
      e.generation_waves = g.waves;
      e.generation_batch = g.batch;
    }
    if (together && call.role == Role::kRollout) e.reshard_s += reshard_seconds(in, actor, rollout).total();
    set_of_call.push_back(plan.set_of(call.role));
    cost.push_back(b);
  }
  Breakdown sync;
  if (!together) {
    const bool same_node = plan.sets[static_cast<size_t>(actor_set)].devices +
                               plan.sets[static_cast<size_t>(rollout_set)].devices <= cluster.gpus_per_node;
    sync = weight_sync_seconds(in, actor, rollout, same_node);
  }
  std::vector<double> seconds;
  for (const auto& b : cost) seconds.push_back(b.total());
  ScheduleInput si;
  si.calls = &calls;
  si.set_of_call = set_of_call.data();
  si.seconds_of_call = seconds.data();
  si.sets = static_cast<int>(plan.sets.size());
  si.actor_set = actor_set;
  si.rollout_set = rollout_set;
  si.sync_s = sync.total();
  si.controller_s = cluster.overheads.iteration_s;
  si.staleness = plan.staleness;
  si.sync_every = plan.sync_every;
  std::vector<ScheduledCall> spans;
  e.iteration_s = schedule_iteration(si, &spans);
  e.feasible = true;
  e.tokens_per_s = static_cast<double>(workload.sequences() * workload.sequence_length()) / e.iteration_s;
  for (const ScheduledCall& s : spans) {
    CallEstimate c;
    c.start_s = s.start_s;
    c.end_s = s.end_s;
    if (s.call >= 0) {
      const Call& call = calls[static_cast<size_t>(s.call)];
      c.name = timeline_name(call, !together);
      c.stage = call.stage;
      c.set = set_of_call[static_cast<size_t>(s.call)];
      c.cost = cost[static_cast<size_t>(s.call)];
      (call.stage == Stage::kGeneration ? e.generation_s
                                        : call.stage == Stage::kPreparation ? e.preparation_s : e.training_s) +=
          c.cost.total();
    } else if (s.call == -1) {
      c.name = "weight_sync";
      c.stage = Stage::kTraining;
      c.set = actor_set;
      c.cost = sync;
      e.sync_s += sync.total();
    } else {
      c.name = "controller";
      c.stage = Stage::kPreparation;
      c.cost.overhead_s = si.controller_s;
      e.controller_s += si.controller_s;
    }
    e.calls.push_back(c);
  }
  return e;
}

std::vector<StalenessPoint> staleness_sweep(const Plan& plan, const ClusterSpec& cluster, const ModelShape& model,
                                            const Workload& workload, const std::vector<int>& ks) {
  std::vector<StalenessPoint> points;
  const int rollout_set = plan.set_of(Role::kRollout);
  if (rollout_set < 0 || rollout_set == plan.set_of(Role::kActor)) return points;
  auto at = [&](int k) {
    Plan p = plan;
    p.staleness = k;
    p.sync_every = std::clamp(plan.sync_every, 1, k + 1);
    return std::make_pair(p.sync_every, simulate(p, cluster, model, workload));
  };
  const Estimate synchronous = at(0).second;
  if (!synchronous.feasible) return points;
  for (int k : ks) {
    const auto [sync_every, e] = at(k);
    if (!e.feasible) return {};
    points.push_back({k, sync_every, e.iteration_s, synchronous.iteration_s / e.iteration_s});
  }
  return points;
}

}  // namespace hybridflow::placement
