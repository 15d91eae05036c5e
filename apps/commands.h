// Each subcommand of the `hybridflow` binary registers itself on the app; main() runs the chosen one.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace hybridflow::cli {

using Action = std::function<int()>;

// Each adds a subcommand and sets `action` to run it when that subcommand is chosen.
void add_init_command(CLI::App& app, Action& action);
void add_info_command(CLI::App& app, Action& action);
void add_generate_command(CLI::App& app, Action& action);
void add_sft_command(CLI::App& app, Action& action);
void add_rm_command(CLI::App& app, Action& action);
void add_dpo_command(CLI::App& app, Action& action);
void add_train_command(CLI::App& app, Action& action);
void add_tokenize_command(CLI::App& app, Action& action);
void add_report_command(CLI::App& app, Action& action);
void add_data_command(CLI::App& app, Action& action);
void add_bench_command(CLI::App& app, Action& action);
void add_plan_command(CLI::App& app, Action& action);
void add_lora_command(CLI::App& app, Action& action);

}  // namespace hybridflow::cli
