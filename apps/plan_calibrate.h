// `hybridflow plan --calibrate`: measures this machine and fits the cost simulator's fixed costs to small PPO
// runs of the trainer, then checks the fitted simulator against runs under other placements
// (docs/placement.md, "Calibration").
#pragma once

#include <string>

#include "hybridflow/placement/calibration.h"

namespace hybridflow::cli {

struct CalibrateOptions {
  int steps = 6;       // RL steps per run; the first is a warm-up, the best of the others is kept
  bool quick = false;  // smaller runs (tests)
  bool verbose = true;
};

placement::Calibration calibrate_this_machine(const CalibrateOptions& options);

}  // namespace hybridflow::cli
