// Policy-filtered PPO (PF-PPO, arXiv 2409.06957; verl's algorithm.use_pf_ppo): before the updates, the batch is
// resampled with replacement, each row drawn with a weight of its sequence score, so that the updates see more of
// the rows whose reward is the most reliable. Pure functions; the trainer decides when to use them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace hybridflow::algo {

enum class PfPpoReweight {
  kPow,       // "pow": |score| ^ weight_pow
  kMaxMin,    // "max_min": 1 for the rows with the batch's highest or lowest score, else 0
  kMaxRandom  // "max_random": 0.4 for the rows with the highest score, 0.1 for the others
};
PfPpoReweight parse_pf_ppo_reweight(const std::string& name);  // throws naming pow | max_min | max_random
std::string to_string(PfPpoReweight method);

struct PfPpoConfig {
  PfPpoReweight reweight = PfPpoReweight::kPow;  // algorithm.pf_ppo.reweight_method
  double weight_pow = 2.0;                       // algorithm.pf_ppo.weight_pow
};

// verl's weights of the rows: scores [B] (any floating dtype) -> [B] float64, each at least 1e-8 (verl adds 1e-8,
// so that a batch whose weights are all 0 is drawn uniformly).
at::Tensor pf_ppo_weights(const at::Tensor& scores, const PfPpoConfig& config);

// B rows drawn with replacement in proportion to pf_ppo_weights, as indices into the batch. The draw is a function
// of `seed` alone (a 64-bit Mersenne twister, the same on every platform), so a resumed run draws the same rows.
std::vector<int64_t> pf_ppo_resample(const at::Tensor& scores, const PfPpoConfig& config, uint64_t seed);

}  // namespace hybridflow::algo
