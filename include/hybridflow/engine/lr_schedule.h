// Learning-rate schedule: linear warm-up, then constant, linear or cosine decay to a floor.
#pragma once

#include <cstdint>
#include <string>

namespace hybridflow {

struct LrSchedule {
  double lr = 1e-3;             // peak learning rate, reached at the end of warm-up
  int64_t warmup_steps = 0;     // lr ramps (step + 1) / warmup_steps * lr over steps 0 .. warmup_steps-1
  std::string kind = "constant";  // constant | linear | cosine
  int64_t total_steps = 0;      // decay ends here (needed for linear / cosine)
  double min_lr_ratio = 0.0;    // floor of the decay, as a fraction of lr
};

// Learning rate used by optimizer step `step` (0-based). Throws hybridflow::Error for an unknown kind
// or a decaying schedule without total_steps.
double lr_at_step(const LrSchedule& schedule, int64_t step);

}  // namespace hybridflow
