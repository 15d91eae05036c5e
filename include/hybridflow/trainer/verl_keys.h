// verl's config names (verl/trainer/config/ppo_trainer.yaml and the actor/critic/rollout/ref/... files it
// composes) that the RL schema lacks: read under hybridflow's name, or accepted with one warning and
// dropped because only verl's Python stack (FSDP, vLLM, Ray, ...) gives them a meaning. The table in
// docs/configuration.md ("verl configs") lists the same data; a test keeps the two in step.
#pragma once

#include <string>
#include <vector>

#include "hybridflow/core/config.h"

namespace hybridflow {

// The aliases (verl key -> hybridflow key) and the keys ignored with a warning. A key the RL schema has
// under verl's own path is read as it is and appears in neither list.
const KeyCompat& verl_key_compat();

// Overrides for what verl derives from keys the user set (each only where the hybridflow key it sets was
// left at its default): trainer.total_epochs -> trainer.total_steps (epochs x training prompts /
// data.train_batch_size, verl's dataloader dropping the last partial batch); trainer.n_gpus_per_node x
// trainer.nnodes -> actor_rollout_ref.num_processes and critic.num_processes; trainer.project_name and
// experiment_name -> trainer.run_dir checkpoints/<project>/<experiment> (verl's default_local_dir).
// Only verl's own keys are read here; the data keys and trainer.nnodes come through the run spec's readers.
std::vector<std::string> verl_derived_overrides(const Config& config);

}  // namespace hybridflow
