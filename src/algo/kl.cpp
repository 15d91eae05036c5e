#include "hybridflow/algo/kl.h"

#include <torch/torch.h>

#include <algorithm>

#include "checks.h"

namespace hybridflow::algo {

KlType parse_kl_type(const std::string& name) {
  if (name == "kl" || name == "k1") return KlType::kK1;
  if (name == "abs") return KlType::kAbs;
  if (name == "mse" || name == "k2") return KlType::kK2;
  if (name == "low_var_kl" || name == "k3") return KlType::kK3;
  HF_FAIL("algo: unknown kl type '", name, "' (expected kl|k1, abs, mse|k2, low_var_kl|k3)");
}

std::string to_string(KlType type) {
  switch (type) {
    case KlType::kK1: return "k1";
    case KlType::kAbs: return "abs";
    case KlType::kK2: return "k2";
    case KlType::kK3: return "k3";
  }
  return "?";
}

at::Tensor kl_penalty(const at::Tensor& log_prob, const at::Tensor& ref_log_prob, KlType type,
                      std::optional<double> clamp) {
  HF_CHECK(log_prob.defined() && ref_log_prob.defined(), "algo: kl_penalty needs log_prob and ref_log_prob");
  detail::check_same_shape(ref_log_prob, log_prob, "ref_log_prob", "algo: kl_penalty");
  HF_CHECK(!clamp || *clamp > 0, "algo: kl_penalty clamp must be > 0, got ", clamp.value_or(0));
  auto d = log_prob - ref_log_prob.detach();
  at::Tensor kl;
  switch (type) {
    case KlType::kK1: kl = d; break;
    case KlType::kAbs: kl = d.abs(); break;
    case KlType::kK2: kl = 0.5 * d * d; break;
    case KlType::kK3: {
      auto x = (-d).clamp(-20.0, 20.0);  // log(ref / pi), bounded so exp stays finite
      kl = torch::exp(x) - x - 1;
      if (!clamp) clamp = 10.0;
      break;
    }
  }
  return clamp ? kl.clamp(-*clamp, *clamp) : kl;
}

KlRewardOutput apply_kl_penalty(const at::Tensor& token_level_scores, const at::Tensor& log_prob,
                                const at::Tensor& ref_log_prob, const at::Tensor& response_mask, double beta,
                                KlType type, std::optional<double> clamp) {
  constexpr const char* kWhere = "algo: apply_kl_penalty";
  detail::check_response_tensor(token_level_scores, "token_level_scores", kWhere);
  detail::check_same_shape(log_prob, token_level_scores, "log_prob", kWhere);
  detail::check_same_shape(response_mask, token_level_scores, "response_mask", kWhere);
  torch::NoGradGuard no_grad;
  auto scores = detail::as_float(token_level_scores);
  auto mask = response_mask.to(scores.scalar_type());
  auto kl = kl_penalty(log_prob.to(scores.scalar_type()), ref_log_prob.to(scores.scalar_type()), type, clamp) * mask;
  return {scores - beta * kl, masked_mean(kl, mask, -1).mean()};
}

at::Tensor kl_loss(const at::Tensor& log_prob, const at::Tensor& ref_log_prob, const at::Tensor& response_mask,
                   KlType type, LossAggMode agg_mode, std::optional<double> clamp,
                   std::optional<double> loss_scale_factor) {
  detail::check_response_tensor(log_prob, "log_prob", "algo: kl_loss");
  return agg_loss(kl_penalty(log_prob, ref_log_prob, type, clamp), response_mask, agg_mode, loss_scale_factor);
}

KlController::KlController(double value, bool adaptive, double target, double horizon)
    : value_(value), adaptive_(adaptive), target_(target), horizon_(horizon) {}

KlController KlController::fixed(double kl_coef) {
  HF_CHECK(kl_coef >= 0, "algo: kl_ctrl.kl_coef must be >= 0, got ", kl_coef);
  return KlController(kl_coef, false, 0, 0);
}

KlController KlController::adaptive(double init_kl_coef, double target_kl, double horizon) {
  HF_CHECK(init_kl_coef >= 0, "algo: kl_ctrl.kl_coef must be >= 0, got ", init_kl_coef);
  HF_CHECK(target_kl > 0, "algo: kl_ctrl.target_kl must be > 0 for the adaptive controller, got ", target_kl);
  HF_CHECK(horizon > 0, "algo: kl_ctrl.horizon must be > 0 for the adaptive controller, got ", horizon);
  return KlController(init_kl_coef, true, target_kl, horizon);
}

KlController KlController::from_config(const std::string& type, double kl_coef, double target_kl, double horizon) {
  if (type == "fixed") return fixed(kl_coef);
  if (type == "adaptive") return adaptive(kl_coef, target_kl, horizon);
  HF_FAIL("algo: unknown kl_ctrl.type '", type, "' (expected fixed or adaptive)");
}

void KlController::update(double current_kl, double n_steps) {
  if (!adaptive_) return;
  const double error = std::clamp(current_kl / target_ - 1.0, -0.2, 0.2);
  value_ *= 1.0 + error * n_steps / horizon_;
}

}  // namespace hybridflow::algo
