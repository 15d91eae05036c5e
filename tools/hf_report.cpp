// hf_report RUN_DIR [OUT.html]: writes the HTML run report of a run directory (default RUN_DIR/report.html).
// A stand-in without libtorch until `hybridflow report` is wired; scripts/report_screenshot.sh uses it.
#include <cstdio>
#include <exception>
#include <string>

#include "hybridflow/report/html_report.h"

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3 || std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help") {
    std::fprintf(stderr, "usage: %s RUN_DIR [OUT.html]\n  writes the HTML run report (default RUN_DIR/report.html)\n",
                 argv[0]);
    return 2;
  }
  const std::string run_dir = argv[1];
  const std::string out = argc == 3 ? argv[2] : run_dir + "/report.html";
  try {
    std::printf("%s\n", hybridflow::report::write_html_report(run_dir, out).describe().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hf_report: %s\n", e.what());
    return 1;
  }
  return 0;
}
