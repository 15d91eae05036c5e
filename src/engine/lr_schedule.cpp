#include "hybridflow/engine/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "hybridflow/core/error.h"

namespace hybridflow {

double lr_at_step(const LrSchedule& s, int64_t step) {
  HF_CHECK(s.kind == "constant" || s.kind == "linear" || s.kind == "cosine", "lr schedule: unknown kind '",
           s.kind, "', expected constant | linear | cosine");
  HF_CHECK(s.min_lr_ratio >= 0 && s.min_lr_ratio <= 1, "lr schedule: min_lr_ratio must be in [0, 1], got ",
           s.min_lr_ratio);
  HF_CHECK(s.num_cycles > 0, "lr schedule: num_cycles must be > 0, got ", s.num_cycles);
  if (step < s.warmup_steps)
    return s.lr * static_cast<double>(s.warmup_from_zero ? step : step + 1) / static_cast<double>(s.warmup_steps);
  if (s.kind == "constant") return s.lr;
  HF_CHECK(s.total_steps > s.warmup_steps, "lr schedule: '", s.kind, "' decay needs total_steps (",
           s.total_steps, ") > warmup_steps (", s.warmup_steps, ")");
  const double progress = std::min(
      1.0, static_cast<double>(step - s.warmup_steps) / static_cast<double>(s.total_steps - s.warmup_steps));
  const double shape = s.kind == "linear" ? 1.0 - progress : 0.5 * (1.0 + std::cos(2.0 * M_PI * s.num_cycles * progress));
  return s.lr * (s.min_lr_ratio + (1.0 - s.min_lr_ratio) * shape);
}

}  // namespace hybridflow
