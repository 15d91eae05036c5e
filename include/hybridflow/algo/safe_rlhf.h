// Safe-RLHF (Dai et al. 2023): maximise reward subject to expected cost <= cost_limit via a Lagrangian.
// The multiplier lambda >= 0 rises while the episode cost exceeds the limit and falls otherwise.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace hybridflow::algo {

struct LagrangeConfig {
  double lambda_init = 1.0;
  double lambda_lr = 0.1;
  double cost_limit = 0.0;
  // Log parameterisation: log_lambda += lr * (cost - limit), so lambda stays > 0 and moves by a bounded
  // factor per step. (Plain ascent on log_lambda would step by lr * lambda * violation, which compounds into
  // overflow within a few steps unless an adaptive optimiser such as Safe-RLHF's Adam rescales it.)
  // Otherwise plain projected ascent: lambda = max(0, lambda + lr * (cost - limit)).
  bool use_log_lambda = true;
  std::optional<double> lambda_max;  // optional upper bound
  int update_delay_steps = 0;        // updates ignored before this many calls (lets the cost model settle)
};

class LagrangeMultiplier {
 public:
  explicit LagrangeMultiplier(const LagrangeConfig& config);

  double value() const;
  // One ascent step on lambda * (episode_cost - cost_limit); returns the new lambda.
  double update(double episode_cost);

  // (reward_adv - lambda * cost_adv) / (1 + lambda): the division keeps the advantage scale independent of lambda.
  at::Tensor combine_advantages(const at::Tensor& reward_advantages, const at::Tensor& cost_advantages) const;

 private:
  LagrangeConfig config_;
  double lambda_;
  int steps_ = 0;
};

}  // namespace hybridflow::algo
