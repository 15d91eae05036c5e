// The HTML run report: one self-contained file (inline SVG and CSS, no network, no scripts) that shows a
// run directory at a glance: summary, training curves, time per stage, resharding and memory, the worker
// timeline, rollout samples and the config.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hybridflow::report {

struct ReportSummary {
  std::string out_path;
  int64_t steps = 0;                    // records in metrics.jsonl
  int64_t first_step = 0, last_step = 0;
  size_t charts = 0;                    // charts drawn (those whose metrics were all missing are skipped)
  size_t samples = 0;                   // sample rows shown
  std::vector<std::string> notes;       // what was skipped, e.g. a cut-off last line

  // One line for the console, e.g. "report: 300 steps (1..300), 11 charts, 24 samples -> run/report.html".
  std::string describe() const;
};

// Reads `run_dir` (see run_data.h) and writes the report to `out_path` atomically (a temporary file
// renamed over it), so a browser reloading it never sees half a file. Throws hybridflow::Error naming the
// file and line of unreadable input, or the output path when it cannot be written.
ReportSummary write_html_report(const std::string& run_dir, const std::string& out_path);

// The report's HTML for `run_dir`, without writing it (`summary` may be null).
std::string render_html_report(const std::string& run_dir, ReportSummary* summary = nullptr);

}  // namespace hybridflow::report
