// KL between the actor and the reference policy, estimated per token from log-probs, applied either as a
// reward penalty (algorithm.use_kl_in_reward) or as a loss term (actor.use_kl_loss), and its coefficient
// controllers (algorithm.kl_ctrl).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

#include "hybridflow/algo/masked.h"

namespace hybridflow::algo {

// Estimators of KL(pi || ref) from samples of pi, with d = log_prob - ref_log_prob (Schulman's k1/k2/k3).
enum class KlType {
  kK1,   // "kl" | "k1": d
  kAbs,  // "abs": |d|
  kK2,   // "mse" | "k2": 0.5 d^2
  kK3,   // "low_var_kl" | "k3": exp(-d) + d - 1, unbiased, never negative
};

// Throws hybridflow::Error naming the accepted spellings.
KlType parse_kl_type(const std::string& name);
std::string to_string(KlType type);

// Per-token KL estimate [B, R]. clamp bounds the result to [-clamp, clamp]; unset means k3 uses verl's 10
// (its exp can explode when the policies drift apart) and the others are left unbounded.
at::Tensor kl_penalty(const at::Tensor& log_prob, const at::Tensor& ref_log_prob, KlType type,
                      std::optional<double> clamp = std::nullopt);

struct KlRewardOutput {
  at::Tensor token_level_rewards;  // scores - beta * kl, kl zeroed outside the mask
  at::Tensor mean_kl;              // mean over sequences of the per-sequence mean KL: feed to KlController::update
};

// KL as a reward penalty: token_level_scores [B, R] minus beta times the per-token KL.
KlRewardOutput apply_kl_penalty(const at::Tensor& token_level_scores, const at::Tensor& log_prob,
                                const at::Tensor& ref_log_prob, const at::Tensor& response_mask, double beta,
                                KlType type, std::optional<double> clamp = std::nullopt);

// KL as a loss term (aggregated, differentiable w.r.t. log_prob); the actor adds kl_loss_coef times it.
at::Tensor kl_loss(const at::Tensor& log_prob, const at::Tensor& ref_log_prob, const at::Tensor& response_mask,
                   KlType type, LossAggMode agg_mode = LossAggMode::kTokenMean,
                   std::optional<double> clamp = std::nullopt,
                   std::optional<double> loss_scale_factor = std::nullopt);

// The reward-penalty coefficient beta. Fixed keeps kl_coef; adaptive steers the observed KL toward target_kl
// (Ziegler et al. 2019): e = clip(kl / target - 1, -0.2, 0.2), beta *= 1 + e * n_steps / horizon.
class KlController {
 public:
  static KlController fixed(double kl_coef);
  static KlController adaptive(double init_kl_coef, double target_kl, double horizon);
  // From algorithm.kl_ctrl.type: "fixed" | "adaptive".
  static KlController from_config(const std::string& type, double kl_coef, double target_kl, double horizon);

  double value() const { return value_; }
  bool is_adaptive() const { return adaptive_; }
  // current_kl: the batch's mean KL; n_steps: samples (or steps) since the last update.
  void update(double current_kl, double n_steps);

 private:
  KlController(double value, bool adaptive, double target, double horizon);
  double value_;
  bool adaptive_;
  double target_;
  double horizon_;
};

}  // namespace hybridflow::algo
