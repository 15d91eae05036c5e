// verl_derived_overrides(): the settings verl computes from others (see verl_keys.h). Only verl's own keys
// (project_name, experiment_name, total_epochs, n_gpus_per_node) are read here; the data keys and
// trainer.nnodes a derivation needs come through the run spec's readers of them (run_spec_builders.h), so
// every key keeps one reader.
#include <algorithm>
#include <string>
#include <vector>

#include "hybridflow/core/error.h"
#include "hybridflow/core/logging.h"
#include "hybridflow/tasks/prompt_rows.h"
#include "hybridflow/trainer/verl_keys.h"
#include "run_spec_builders.h"

namespace hybridflow {

std::vector<std::string> verl_derived_overrides(const Config& config, RoleSpecKeys* keys) {
  const ConfigReader verl(config, keys ? &(*keys)["verl"] : nullptr);
  std::vector<std::string> out;
  // total_training_steps (read as total_steps) wins over total_epochs, as in verl.
  if (!verl.is_null("trainer.total_epochs") && config.is_default("trainer.total_steps")) {
    const int64_t epochs = verl.get<int64_t>("trainer.total_epochs");
    const DataSpec data = build_data_spec(config, keys);
    const int64_t batch = data.train_batch_size;
    HF_CHECK(epochs > 0 && batch > 0, "trainer.total_epochs (", epochs, ") and data.train_batch_size (", batch,
             ") must be > 0");
    // Training prompts before filtering: generated ones, or the rows of data.train_file.
    int64_t prompts = data.train_size;
    if (!data.train_files.empty())
      prompts = static_cast<int64_t>(read_prompt_rows(data.train_files, {data.prompt_key, data.reward_fn_key}).size());
    if (data.train_max_samples > 0) prompts = std::min(prompts, data.train_max_samples);
    const int64_t steps = epochs * (prompts / batch);
    HF_CHECK(steps > 0, "trainer.total_epochs: ", epochs, " epoch(s) of ", prompts,
             " training prompts make no full batch of data.train_batch_size ", batch);
    log_info("trainer.total_steps ", steps, " from trainer.total_epochs ", epochs);
    out.push_back("trainer.total_steps=" + std::to_string(steps));
  }
  const ConfigReader trainer(config, keys ? &(*keys)["trainer"] : nullptr);
  const std::optional<int64_t> nnodes = run_spec_nnodes(trainer);
  const bool gpus = !verl.is_null("trainer.n_gpus_per_node");
  if (gpus || nnodes) {
    const int64_t procs = (gpus ? verl.get<int64_t>("trainer.n_gpus_per_node") : 1) * nnodes.value_or(1);
    HF_CHECK(procs > 0, "trainer.n_gpus_per_node x trainer.nnodes must be > 0, got ", procs);
    for (const char* key : {"actor_rollout_ref.num_processes", "critic.num_processes"})
      if (config.is_default(key)) out.push_back(std::string(key) + "=" + std::to_string(procs));
  }
  const std::string project = verl.get<std::string>("trainer.project_name");
  const std::string experiment = verl.get<std::string>("trainer.experiment_name");
  if (!project.empty() && !experiment.empty() && config.is_default("trainer.run_dir"))
    out.push_back("trainer.run_dir=checkpoints/" + project + "/" + experiment);
  return out;
}

std::vector<std::string> verl_derived_overrides(const Config& config) { return verl_derived_overrides(config, nullptr); }

}  // namespace hybridflow
