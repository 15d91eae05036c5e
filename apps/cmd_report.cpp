// `hybridflow report RUN_DIR [--out FILE]`: one self-contained HTML file (charts of every metric, time
// per stage, timeline, rollout samples, config) from what a run wrote to its directory.
#include <cstdio>
#include <memory>
#include <string>

#include "commands.h"
#include "hybridflow/report/html_report.h"

namespace hybridflow::cli {

void add_report_command(CLI::App& app, Action& action) {
  auto run_dir = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "report", "Write a self-contained HTML report (curves, time per stage, samples) of a run directory");
  cmd->add_option("run_dir", *run_dir, "the run's trainer.run_dir (metrics.jsonl inside)")->required();
  cmd->add_option("--out", *out, "where to write the HTML (default: RUN_DIR/report.html)");
  cmd->callback([run_dir, out, &action] {
    action = [run_dir, out] {
      const std::string path = out->empty() ? *run_dir + "/report.html" : *out;
      std::printf("%s\n", report::write_html_report(*run_dir, path).describe().c_str());
      return 0;
    };
  });
}

}  // namespace hybridflow::cli
