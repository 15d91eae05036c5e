// hf_report RUN_DIR [OUT.html]: writes the HTML run report of a run directory (default RUN_DIR/report.html).
// hf_report --tensorboard RUN_DIR [LOGDIR]: writes metrics.jsonl and samples.jsonl as a TensorBoard event
// file (default LOGDIR: RUN_DIR/tensorboard), for `tensorboard --logdir`.
// A stand-in without libtorch until `hybridflow report` is wired; scripts/report_screenshot.sh uses it.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "hybridflow/report/html_report.h"
#include "hybridflow/report/tensorboard_export.h"

namespace {

int usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s RUN_DIR [OUT.html]                writes the HTML run report (default RUN_DIR/report.html)\n"
               "       %s --tensorboard RUN_DIR [LOGDIR]    writes TensorBoard events (default RUN_DIR/tensorboard)\n",
               argv0, argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  const bool tensorboard = !args.empty() && args[0] == "--tensorboard";
  if (tensorboard) args.erase(args.begin());
  if (args.empty() || args.size() > 2 || args[0] == "-h" || args[0] == "--help") return usage(argv[0]);
  const std::string& run_dir = args[0];
  try {
    if (tensorboard) {
      const std::string logdir = args.size() == 2 ? args[1] : run_dir + "/tensorboard";
      const auto r = hybridflow::report::export_run_to_tensorboard(run_dir, logdir);
      std::printf("tensorboard: %zu steps, %zu scalars, %zu steps of samples -> %s\n", r.steps, r.scalars, r.text_steps,
                  r.event_file.c_str());
    } else {
      const std::string out = args.size() == 2 ? args[1] : run_dir + "/report.html";
      std::printf("%s\n", hybridflow::report::write_html_report(run_dir, out).describe().c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hf_report: %s\n", e.what());
    return 1;
  }
  return 0;
}
