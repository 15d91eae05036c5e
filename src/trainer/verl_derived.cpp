// verl_derived_overrides(): the settings verl computes from others (see verl_keys.h).
#include <string>
#include <vector>

#include "hybridflow/core/error.h"
#include "hybridflow/core/logging.h"
#include "hybridflow/tasks/prompt_rows.h"
#include "hybridflow/trainer/verl_keys.h"

namespace hybridflow {

namespace {

// Training prompts before filtering: generated ones, or the rows of data.train_file.
int64_t training_prompts(const Config& config) {
  const std::string file = config.get<std::string>("data.train_file");
  if (file.empty()) return config.get<int64_t>("data.train_size");
  return static_cast<int64_t>(read_prompt_rows(file).size());
}

}  // namespace

std::vector<std::string> verl_derived_overrides(const Config& config) {
  std::vector<std::string> out;
  // total_training_steps (read as total_steps) wins over total_epochs, as in verl.
  if (!config.is_null("trainer.total_epochs") && config.is_default("trainer.total_steps")) {
    const int64_t epochs = config.get<int64_t>("trainer.total_epochs");
    const int64_t batch = config.get<int64_t>("data.train_batch_size");
    HF_CHECK(epochs > 0 && batch > 0, "trainer.total_epochs (", epochs, ") and data.train_batch_size (", batch,
             ") must be > 0");
    const int64_t steps = epochs * (training_prompts(config) / batch);
    HF_CHECK(steps > 0, "trainer.total_epochs: ", epochs, " epoch(s) of ", training_prompts(config),
             " training prompts make no full batch of data.train_batch_size ", batch);
    log_info("trainer.total_steps ", steps, " from trainer.total_epochs ", epochs);
    out.push_back("trainer.total_steps=" + std::to_string(steps));
  }
  const bool gpus = !config.is_null("trainer.n_gpus_per_node"), nodes = !config.is_null("trainer.nnodes");
  if (gpus || nodes) {
    const int64_t procs = (gpus ? config.get<int64_t>("trainer.n_gpus_per_node") : 1) *
                          (nodes ? config.get<int64_t>("trainer.nnodes") : 1);
    HF_CHECK(procs > 0, "trainer.n_gpus_per_node x trainer.nnodes must be > 0, got ", procs);
    for (const char* key : {"actor_rollout_ref.num_processes", "critic.num_processes"})
      if (config.is_default(key)) out.push_back(std::string(key) + "=" + std::to_string(procs));
  }
  const std::string project = config.get<std::string>("trainer.project_name");
  const std::string experiment = config.get<std::string>("trainer.experiment_name");
  if (!project.empty() && !experiment.empty() && config.is_default("trainer.run_dir"))
    out.push_back("trainer.run_dir=checkpoints/" + project + "/" + experiment);
  return out;
}

}  // namespace hybridflow
