// A standalone rollout pool whose workers died (trainer.max_rollout_restarts): the pool is started again,
// the rollout role created on it, the weight-sync group joined anew by both pools, the actor's current
// weights sent, and the generations that died with the old processes sent again. The trainer does this on
// its own thread, where it waits for the rollout pool: a step's generation, the weight sync, the held-out
// evaluation, the memory figures every step and a checkpoint's buffered rollouts. A restartable pool keeps
// no result on its workers (rl_trainer_setup.cpp turns its data plane off), so nothing trained depends on a
// rollout process after its generation returned, and every prompt is generated into training exactly once.
#include "rl_trainer_state.h"

namespace hybridflow {

namespace {

// Whether a resolved call failed (it may have: it was pending on a pool that died).
bool generation_failed(const Future& generation) {
  if (!generation.valid() || !generation.is_ready()) return false;
  try {
    generation.result();
    return false;
  } catch (const Error&) {
    return true;
  }
}

}  // namespace

std::optional<nlohmann::json> RLTrainer::State::recover_rollout(const std::vector<LostGeneration>& lost) {
  if (!rollout || !rollout->pool().wait_failed()) return std::nullopt;
  const int64_t limit = run.trainer.max_rollout_restarts;
  const std::string pool_name = placement.pool_of("rollout").name;
  for (;;) {
    // The pool's failure names the rank, its pid and host, how it ended and what it was running.
    const std::string why = controller.pool(pool_name)->failure();
    HF_CHECK(rollout_restarts < limit, why, "; the run stops: ",
             limit == 0 ? std::string("trainer.max_rollout_restarts is 0 (set it to N > 0 to restart a dead rollout "
                                      "pool up to N times without stopping training)")
                        : "the rollout pool was already restarted trainer.max_rollout_restarts = " +
                              std::to_string(limit) + " times");
    ++rollout_restarts;
    log_warn(why, "; restarting resource pool '", pool_name, "' (restart ", rollout_restarts, " of ",
             "trainer.max_rollout_restarts = ", limit, "), sending it the actor's weights (policy version ",
             actor_version, ") and regenerating the rollouts it lost");
    // The old sync group's store outlives the actor ranks' handles on that group, which they drop only when
    // they join the new one.
    const std::shared_ptr<StoreServer> old_store = weight_sync_store;
    rollout.reset();
    try {
      controller.restart_pool(pool_name);  // the old pool's calls have all failed once this returns
    } catch (const Error& e) {
      HF_FAIL(why, "; the rollout pool cannot be restarted: ", e.what());
    }
    try {
      const RolePlan<RolloutSpec>& role = *specs.standalone_rollout;
      rollout = make_group("rollout", kRolloutWorkerType, role.layout, role.model, {{"rollout", role.spec}});
      connect_rollout_weight_sync();
      const WeightSyncCalls sync = dispatch_weight_sync(actor_version);
      wait_all({sync.send, sync.receive});
      nlohmann::json figures = finish_weight_sync(sync);
      // rollout.stream_groups: the samples the dead processes carried are gone; what the replies that did come
      // back returned is off the list, and every prompt still on it is sent again with the requests.
      for (const Prefetch& p : prefetch)
        if (p.batch.valid() && p.batch.is_ready() && !generation_failed(p.batch)) stream_pending.note_reply(p.batch.get());
      // In the order they were asked for: the caller's (the step it waits for) first, then the buffer's.
      for (const LostGeneration& g : lost)
        if (generation_failed(*g.generation)) *g.generation = rollout->call("generate_sequences", as_sent(*g.request));
      for (Prefetch& p : prefetch)
        if (generation_failed(p.batch)) p.batch = rollout->call("generate_sequences", as_sent(p.request));
      return figures;
    } catch (const Error&) {
      // The new pool died too: counted as another restart.
      if (!controller.pool(pool_name)->wait_failed()) throw;
    }
  }
}

Future RLTrainer::State::surviving_rollout_deaths(Future generation, const DataProto& request) {
  if (!rollout) return generation;
  for (;;) {
    try {
      generation.result();
      return generation;
    } catch (const Error&) {
      if (!recover_rollout({{&generation, &request}})) throw;
    }
  }
}

}  // namespace hybridflow
