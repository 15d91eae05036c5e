// `hybridflow train`: an RL run (one of the algorithm programs, trainer/rl_program.h) from a YAML config plus dotted
// overrides. The controller runs in this process; worker groups are spawned as child processes of
// this same binary (see main.cpp's worker mode).
#include <iomanip>
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
namespace {

// What `train --check` found: the run as it would start.
void print_run_check(const nlohmann::json& c, std::ostream& out) {
  const auto text = [&](const char* key) { return c.at(key).get<std::string>(); };
  const auto count = [&](const char* key) { return c.at(key).get<int64_t>(); };
  out << "config ok: program " << text("program") << " (adv_estimator " << text("adv_estimator") << ") on "
      << text("device") << "\n";
  const double parameters = c.at("parameters").get<double>();
  out << "model: " << text("model") << ", " << std::fixed << std::setprecision(parameters >= 1e9 ? 2 : 1)
      << (parameters >= 1e9 ? parameters / 1e9 : parameters / 1e6) << (parameters >= 1e9 ? " B" : " M")
      << " parameters" << std::defaultfloat << (c.at("reference").get<bool>() ? ", with a reference copy" : "")
      << "\n";
  out << "data: " << count("train_prompts") << " training prompts, " << count("test_prompts") << " held-out; "
      << count("train_batch_size") << " prompts x " << count("n") << " samples of up to " << count("response_length")
      << " tokens a step, " << count("total_steps") << " steps\n";
  out << "placement " << text("placement") << ":\n";
  for (const auto& pool : c.at("pools")) {
    out << "  pool '" << pool.at("name").get<std::string>() << "' (" << pool.at("processes").get<int>()
        << (pool.at("processes").get<int>() == 1 ? " process): " : " processes): ");
    std::string roles;
    for (const auto& r : pool.at("roles")) roles += (roles.empty() ? "" : ", ") + r.get<std::string>();
    out << roles << "\n";
  }
  const std::string run_dir = c.at("run_dir").get<std::string>(), resume = c.at("resume_from").get<std::string>();
  out << "run directory: " << (run_dir.empty() ? "(none: nothing saved)" : run_dir)
      << (resume.empty() ? "" : "; would resume from " + resume) << "\n";
}

}  // namespace

void add_train_command(CLI::App& app, Action& action) {
  auto config_file = std::make_shared<std::string>();
  auto overrides = std::make_shared<std::vector<std::string>>();
  CLI::App* cmd = app.add_subcommand("train", "RL post-training (algorithm.adv_estimator: gae | grpo | rloo | remax | "
                                             "reinforce_plus_plus | reinforce_plus_plus_baseline | gpg; "
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
  auto check = std::make_shared<bool>(false);
  cmd->add_flag("--check", *check,
                "check the config, data files, model and placement as a run would, print what the run would be, and "
                "exit without starting a worker or writing anything (before a long job or a cluster allocation)");
  cmd->callback([config_file, overrides, dashboard, dashboard_port, check, &action] {
    action = [config_file, overrides, dashboard, dashboard_port, check] {
      const Config config = load_rl_config(*config_file, *overrides);
      if (*check) {
        print_run_check(RLTrainer::check(config), std::cout);
        return 0;
      }
      warn_if_slow_blas();
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
