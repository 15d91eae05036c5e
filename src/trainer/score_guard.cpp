#include "score_guard.h"

#include <torch/torch.h>

#include <cmath>

#include "hybridflow/core/error.h"

namespace hybridflow {

at::Tensor guard_scores(const at::Tensor& scores, const std::string& source, int64_t step,
                        const std::optional<std::pair<double, double>>& clip, int64_t* clipped) {
  const at::Tensor values = scores.to(torch::kDouble).contiguous();
  const double* v = values.data_ptr<double>();
  for (int64_t i = 0; i < values.numel(); ++i) {
    // A float32 tensor holds any |x| > 3.4e38 as inf: such a score is named as inf, which is what training would see.
    HF_CHECK(!std::isnan(v[i]), "step ", step, ": ", source, " gave a score of NaN for row ", i, " of ",
             values.numel(), "; a score must be a finite number (fix the scorer; NaN cannot be clipped)");
    HF_CHECK(std::isfinite(v[i]) || clip.has_value(), "step ", step, ": ", source, " gave a score of ", v[i],
             " for row ", i, " of ", values.numel(), " (scores are 32-bit floats: |x| <= 3.4e38); fix the scorer ",
             "or set reward_model.reward_clip: [lo, hi] to clamp scores into a range");
  }
  if (!clip) return scores;
  if (clipped) *clipped += ((values < clip->first) | (values > clip->second)).sum().item<int64_t>();
  return scores.clamp(clip->first, clip->second);
}

}  // namespace hybridflow
