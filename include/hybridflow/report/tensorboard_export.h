// A finished (or running) run directory into TensorBoard event files: metrics.jsonl as scalars and
// samples.jsonl as text, so existing runs can be compared in TensorBoard before the trainer writes events
// itself.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "hybridflow/report/run_data.h"

namespace hybridflow::report {

struct TensorBoardExport {
  std::string event_file;
  size_t steps = 0, scalars = 0, text_steps = 0;
};

// Writes one new event file under `logdir` (see TensorBoardWriter). Non-finite and null metrics are left
// out, as in the HTML report; errors are those of load_run (file and line).
TensorBoardExport export_run_to_tensorboard(const std::string& run_dir, const std::string& logdir);

// Samples become one text per step for TensorBoard's Text tab: reward and advantage, then prompt and
// response in indented code blocks, which show any model output verbatim (no markdown or HTML inside is
// interpreted). The trainer writes its samples' text with this too.
std::string samples_markdown(const std::vector<const Sample*>& samples);

}  // namespace hybridflow::report
