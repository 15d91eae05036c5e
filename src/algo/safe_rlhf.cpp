#include "hybridflow/algo/safe_rlhf.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "hybridflow/core/error.h"

namespace hybridflow::algo {

LagrangeMultiplier::LagrangeMultiplier(const LagrangeConfig& config) : config_(config), lambda_(config.lambda_init) {
  HF_CHECK(config.use_log_lambda ? config.lambda_init > 0 : config.lambda_init >= 0,
           "algo: safe_rlhf lambda_init must be ", config.use_log_lambda ? "> 0 (log parameterisation)" : ">= 0",
           ", got ", config.lambda_init);
  HF_CHECK(config.lambda_lr >= 0, "algo: safe_rlhf lambda_lr must be >= 0, got ", config.lambda_lr);
  HF_CHECK(!config.lambda_max || *config.lambda_max >= config.lambda_init,
           "algo: safe_rlhf lambda_max must be >= lambda_init, got ", config.lambda_max.value_or(0));
}

double LagrangeMultiplier::value() const { return lambda_; }

double LagrangeMultiplier::update(double episode_cost) {
  if (steps_++ < config_.update_delay_steps) return lambda_;
  const double violation = episode_cost - config_.cost_limit;
  if (config_.use_log_lambda) {
    lambda_ = std::exp(std::log(lambda_) + config_.lambda_lr * violation);
  } else {
    lambda_ = std::max(0.0, lambda_ + config_.lambda_lr * violation);
  }
  if (config_.lambda_max) lambda_ = std::min(lambda_, *config_.lambda_max);
  return lambda_;
}

at::Tensor LagrangeMultiplier::combine_advantages(const at::Tensor& reward_advantages,
                                                  const at::Tensor& cost_advantages) const {
  HF_CHECK(reward_advantages.defined() && cost_advantages.defined(),
           "algo: safe_rlhf combine_advantages needs reward and cost advantages");
  HF_CHECK(reward_advantages.sizes() == cost_advantages.sizes(), "algo: safe_rlhf cost advantages shape ",
           cost_advantages.sizes(), " must equal reward advantages shape ", reward_advantages.sizes());
  return (reward_advantages - lambda_ * cost_advantages) / (1.0 + lambda_);
}

}  // namespace hybridflow::algo
