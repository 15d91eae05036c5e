// Internal to trainer/: what a sequence score must be before it reaches the advantages. A scorer is
// code the run does not control (a reward command, an HTTP service, a reward model): one NaN or inf
// poisons every advantage of its group and, through the losses, every weight. So a NaN always stops
// the run naming the step, the scorer, the row and the value; an inf stops it too unless
// reward_model.reward_clip is set (checked in the run spec, trainer/run_spec.h), which then clamps every part of the score and the sum into [lo, hi].
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <utility>

#include <cstdint>

namespace hybridflow {

// `scores` (one per row) from `source` at 1-based `step`, checked and, with `clip`, clamped. `clipped`
// (optional) is increased by the number of finite values that were outside the range and by every inf.
at::Tensor guard_scores(const at::Tensor& scores, const std::string& source, int64_t step,
                        const std::optional<std::pair<double, double>>& clip, int64_t* clipped = nullptr);

}  // namespace hybridflow
