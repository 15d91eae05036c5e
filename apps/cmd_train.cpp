// `hybridflow train`: an RL run (one of the algorithm programs, trainer/rl_program.h) from a YAML config plus dotted
// overrides. The controller runs in this process; worker groups are spawned as child processes of
// this same binary (see main.cpp's worker mode).
#include <string>
#include <vector>

#include "commands.h"
#include "hybridflow/core/config.h"
#include "hybridflow/core/platform.h"
#include "hybridflow/trainer/rl_trainer.h"

namespace hybridflow::cli {

void add_train_command(CLI::App& app, Action& action) {
  auto config_file = std::make_shared<std::string>();
  auto overrides = std::make_shared<std::vector<std::string>>();
  CLI::App* cmd = app.add_subcommand("train", "RL post-training (algorithm.adv_estimator: gae | grpo | rloo | remax | reinforce_plus_plus; "
                                             "algorithm.program: auto | ppo | grpo | rloo | remax | reinforce_plus_plus | safe_rlhf | dapo)");
  cmd->add_option("-c,--config", *config_file, "YAML config (examples/*.yaml; keys: docs/configuration.md)");
  cmd->add_option("overrides", *overrides,
                  "dotted overrides, e.g. algorithm.adv_estimator=grpo trainer.total_steps=20 trainer.save_freq=10; "
                  "run again with the same trainer.run_dir to resume from its newest checkpoint");
  cmd->callback([config_file, overrides, &action] {
    action = [config_file, overrides] {
      warn_if_slow_blas();
      return run_rl_training(load_rl_config(*config_file, *overrides));
    };
  });
}

}  // namespace hybridflow::cli
