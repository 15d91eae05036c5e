// `hybridflow train`: an RL run (one of the algorithm programs, trainer/rl_program.h) from a YAML config plus dotted
// overrides. The controller runs in this process; worker groups are spawned as child processes of
// this same binary (see main.cpp's worker mode).
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "hybridflow/core/config.h"
#include "hybridflow/core/error.h"
#include "hybridflow/core/platform.h"
#include "hybridflow/report/dashboard.h"
#include "hybridflow/trainer/rl_trainer.h"

namespace hybridflow::cli {

void add_train_command(CLI::App& app, Action& action) {
  auto config_file = std::make_shared<std::string>();
  auto overrides = std::make_shared<std::vector<std::string>>();
  CLI::App* cmd = app.add_subcommand("train", "RL post-training (algorithm.adv_estimator: gae | grpo | rloo | remax | reinforce_plus_plus | "
                                             "reinforce_plus_plus_baseline | gpg; "
                                             "algorithm.program: auto | ppo | grpo | rloo | remax | reinforce_plus_plus | safe_rlhf | dapo)");
  cmd->add_option("-c,--config", *config_file, "YAML config (examples/*.yaml; keys: docs/configuration.md)");
  cmd->add_option("overrides", *overrides,
                  "dotted overrides, e.g. algorithm.adv_estimator=grpo trainer.total_steps=20 trainer.save_freq=10; "
                  "run again with the same trainer.run_dir to resume from its newest checkpoint");
  auto dashboard = std::make_shared<bool>(false);
  auto dashboard_port = std::make_shared<int>(0);
  cmd->add_flag("--dashboard", *dashboard,
                "serve the run's HTML report live on http://127.0.0.1:PORT/ while it trains (docs/report.md)");
  cmd->add_option("--dashboard-port", *dashboard_port, "port for --dashboard (default 0: any free port)");
  cmd->callback([config_file, overrides, dashboard, dashboard_port, &action] {
    action = [config_file, overrides, dashboard, dashboard_port] {
      warn_if_slow_blas();
      const Config config = load_rl_config(*config_file, *overrides);
      std::unique_ptr<report::DashboardServer> server;
      if (*dashboard) {
        const std::string run_dir = rl_run_spec(config).trainer.run_dir;
        HF_CHECK(!run_dir.empty(), "--dashboard shows trainer.run_dir, which is not set");
        server = std::make_unique<report::DashboardServer>(run_dir, *dashboard_port);
        std::cerr << "dashboard: " << server->url() << " (the report of " << run_dir << ", reloading every 10 s)\n";
      }
      return run_rl_training(config);
    };
  });
}

}  // namespace hybridflow::cli
