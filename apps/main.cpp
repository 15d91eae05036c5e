// hybridflow: one binary for every job. Subcommands live in cmd_*.cpp, one file each.
#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>

#include <cstdio>

#include "commands.h"
#include "hybridflow/core/error.h"
#include "hybridflow/core/heap_reuse.h"
#include "hybridflow/core/platform.h"
#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/workers/rl_workers.h"

int main(int argc, char** argv) {
  // Before anything large is allocated; worker processes (this binary again) take it here too.
  hybridflow::keep_freed_heap_for_reuse();
  // A worker process is this same binary, exec'd by the controller with HF_WORKER_* set: it serves
  // its worker group and never returns from here.
  hybridflow::register_rl_workers();
  hybridflow::run_worker_if_requested();

  CLI::App app{"hybridflow: RL post-training of language models (HybridFlow), one native binary"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "hybridflow 0.1.0");
  hybridflow::cli::Action action;
  hybridflow::cli::add_init_command(app, action);
  hybridflow::cli::add_info_command(app, action);
  hybridflow::cli::add_generate_command(app, action);
  hybridflow::cli::add_sft_command(app, action);
  hybridflow::cli::add_rm_command(app, action);
  hybridflow::cli::add_dpo_command(app, action);
  hybridflow::cli::add_train_command(app, action);
  hybridflow::cli::add_tokenize_command(app, action);
  hybridflow::cli::add_report_command(app, action);
  hybridflow::cli::add_data_command(app, action);
  hybridflow::cli::add_bench_command(app, action);
  hybridflow::cli::add_plan_command(app, action);
  hybridflow::cli::add_lora_command(app, action);
  CLI11_PARSE(app, argc, argv);
  try {
    return action ? action() : 0;
  } catch (const hybridflow::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "error (libtorch): %s\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
  }
  return 1;
}
