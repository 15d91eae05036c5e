#include "hybridflow/algo/pf_ppo.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <random>

#include "hybridflow/core/error.h"

namespace hybridflow::algo {

PfPpoReweight parse_pf_ppo_reweight(const std::string& name) {
  if (name == "pow") return PfPpoReweight::kPow;
  if (name == "max_min") return PfPpoReweight::kMaxMin;
  if (name == "max_random") return PfPpoReweight::kMaxRandom;
  HF_FAIL("algorithm.pf_ppo.reweight_method: expected pow | max_min | max_random (verl's), got '", name, "'");
}

std::string to_string(PfPpoReweight method) {
  switch (method) {
    case PfPpoReweight::kPow: return "pow";
    case PfPpoReweight::kMaxMin: return "max_min";
    case PfPpoReweight::kMaxRandom: return "max_random";
  }
  return "?";
}

at::Tensor pf_ppo_weights(const at::Tensor& scores, const PfPpoConfig& config) {
  HF_CHECK(scores.dim() == 1 && scores.size(0) > 0, "pf_ppo_weights: expected non-empty scores [B], got ",
           scores.sizes());
  const at::Tensor s = scores.to(at::kCPU, at::kDouble);
  at::Tensor w;
  switch (config.reweight) {
    case PfPpoReweight::kPow: w = s.abs().pow(config.weight_pow); break;
    case PfPpoReweight::kMaxMin: w = ((s == s.max()) | (s == s.min())).to(at::kDouble); break;
    case PfPpoReweight::kMaxRandom: w = at::where(s == s.max(), at::full_like(s, 0.4), at::full_like(s, 0.1)); break;
  }
  return (w + 1e-8).clamp_min(1e-8);
}

std::vector<int64_t> pf_ppo_resample(const at::Tensor& scores, const PfPpoConfig& config, uint64_t seed) {
  const at::Tensor w = pf_ppo_weights(scores, config).contiguous();
  HF_CHECK(at::isfinite(w).all().item<bool>(), "pf_ppo: a row's weight is not finite (a score of inf or nan, or ",
           "weight_pow too large for the scores)");
  const int64_t rows = w.size(0);
  // Inverse-CDF draws over the cumulative weights, from the raw generator's 53-bit uniforms.
  std::vector<double> cumulative(static_cast<size_t>(rows));
  const double* weight = w.data_ptr<double>();
  double total = 0;
  for (int64_t i = 0; i < rows; ++i) cumulative[static_cast<size_t>(i)] = total += weight[i];
  std::mt19937_64 rng(seed);
  std::vector<int64_t> drawn(static_cast<size_t>(rows));
  for (auto& row : drawn) {
    const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * total;
    row = std::min<int64_t>(rows - 1, std::upper_bound(cumulative.begin(), cumulative.end(), u) - cumulative.begin());
  }
  return drawn;
}

}  // namespace hybridflow::algo
