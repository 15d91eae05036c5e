// Which plans `hybridflow train` can run, and the config fragment that makes it run one (trainer.placement,
// pools:, rollout.staleness and every role's sizes). Kept in one place so that when the trainer learns more
// (a reference split unlike the actor, a staged standalone rollout) only the capabilities below change.
#pragma once

#include <string>

#include "hybridflow/placement/model_shape.h"
#include "hybridflow/placement/plan.h"

namespace hybridflow::placement {

struct TrainerCapabilities {
  // Any grouping of roles into pools (`pools:`); without it only trainer.placement's presets: everything
  // colocated, split (the actor with rollout and reference, every other model in a second pool) and
  // standalone (the rollout alone, every other model in a second pool).
  bool any_pools = false;
  // The rollout on devices of its own with a shadow copy of the actor's weights (trainer.placement: standalone).
  bool standalone_rollout = false;
  // The reference split differently from the actor, the cost critic differently from the critic; without
  // it they live in the same worker processes and share the layout.
  bool independent_layouts = false;
  // A standalone rollout with pipeline stages (p_g > 1); the trainer's is unstaged.
  bool staged_standalone_rollout = false;

  static TrainerCapabilities today();     // what the trainer runs: any pools, a standalone rollout, shared layouts
  static TrainerCapabilities anything();  // every plan the simulator can cost
};

// "" when `hybridflow train` with `caps` can run the plan, else why not. With the model: a mixture of experts
// whose actor splits over tensor-parallel ranks (its experts then fold over them, as the memory estimate
// assumes) generates on the actor's processes only, since a standalone rollout does not take weights from
// split experts yet.
std::string trainer_cannot_run(const Plan& plan, const TrainerCapabilities& caps, const ModelShape* model = nullptr);

struct FragmentWorkload {
  bool reward_model = false, cost_model = false;
};

// A YAML fragment for `hybridflow train --config` (merged into a user's config, or given as it is): the
// placement (trainer.placement with its presets' num_processes keys, or a pools: section for any other
// grouping; rollout.staleness for a standalone rollout), every role's
// megatron.tensor_model_parallel_size / pipeline_model_parallel_size, the rollout's sizes, the ZeRO switch,
// dtypes and the batch keys the plan assumed (data.train_batch_size, rollout.n, response_length, ppo epochs
// and mini-batch, micro-batches). For a mixture-of-experts model, a training role split over t > 1
// tensor-parallel ranks gets megatron.expert_model_parallel_size t: its experts fold over those ranks, so each
// holds 1/t of them, as the estimate assumed. Error (with trainer_cannot_run's reason) when the trainer cannot
// run it.
std::string trainer_config_fragment(const Plan& plan, const Workload& workload, const TrainerCapabilities& caps,
                                    const ModelShape* model = nullptr);

}  // namespace hybridflow::placement
