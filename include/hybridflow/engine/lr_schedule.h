// Learning-rate schedule: linear warm-up, then constant, linear or cosine decay to a floor.
#pragma once

#include <cstdint>
#include <string>

namespace hybridflow {

struct LrSchedule {
  double lr = 1e-3;             // peak learning rate, reached at the end of warm-up
  int64_t warmup_steps = 0;     // lr ramps to lr over steps 0 .. warmup_steps-1 (see warmup_from_zero)
  std::string kind = "constant";  // constant | linear | cosine
  int64_t total_steps = 0;      // decay ends here (needed for linear / cosine)
  double min_lr_ratio = 0.0;    // floor of the decay, as a fraction of lr
  // cosine: the waves over the decay, verl's num_cycles. 0.5 = half a cosine from lr down to the floor; 1 goes
  // down and back up to lr at total_steps.
  double num_cycles = 0.5;
  // verl's warm-up: step k < warmup_steps uses k / warmup_steps x lr, so the first step's lr is 0
  // (transformers' and verl's schedulers); false: (k + 1) / warmup_steps.
  bool warmup_from_zero = false;
};

// Learning rate used by optimizer step `step` (0-based). Throws hybridflow::Error for an unknown kind
// or a decaying schedule without total_steps.
double lr_at_step(const LrSchedule& schedule, int64_t step);

}  // namespace hybridflow
