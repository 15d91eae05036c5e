// Which plans `hybridflow train` can run, and the config fragment that makes it run one. Kept in one place
// so that when the trainer learns a placement (branch `place`: standalone rollout, a `pools:` section for
// any grouping) only the capabilities below and the writer change.
#pragma once

#include <string>

#include "hybridflow/placement/plan.h"

namespace hybridflow::placement {

struct TrainerCapabilities {
  // Any grouping of roles into pools (`pools:`); without it: everything colocated (trainer.colocate: true)
  // or the actor, rollout and reference in one pool and every other model in a pool of its own (the cost
  // critic beside the critic), trainer.colocate: false.
  bool any_pools = false;
  // The rollout on devices of its own with a shadow copy of the actor's weights (trainer.placement: standalone).
  bool standalone_rollout = false;
  // The reference split differently from the actor, the cost critic differently from the critic; without
  // it they live in the same worker processes and share the layout.
  bool independent_layouts = false;

  static TrainerCapabilities today();     // what main's trainer runs
  static TrainerCapabilities anything();  // every plan the simulator can cost
};

// "" when `hybridflow train` with `caps` can run the plan, else why not.
std::string trainer_cannot_run(const Plan& plan, const TrainerCapabilities& caps);

struct FragmentWorkload {
  bool reward_model = false, cost_model = false;
};

// A YAML fragment for `hybridflow train --config` (merged into a user's config, or given as it is): the
// placement keys (trainer.colocate and each pool's num_processes), every role's
// megatron.tensor_model_parallel_size / pipeline_model_parallel_size, the rollout's sizes, the ZeRO switch,
// dtypes and the batch keys the plan assumed (data.train_batch_size, rollout.n, response_length, ppo epochs
// and mini-batch, micro-batches). Error (with trainer_cannot_run's reason) when the trainer cannot run it.
std::string trainer_config_fragment(const Plan& plan, const Workload& workload, const TrainerCapabilities& caps);

}  // namespace hybridflow::placement
