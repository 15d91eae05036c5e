// Reading the algo settings from a Config with verl's key names. The defaults (verl's) are in the schema
// fragments below and nowhere else: a trainer composes its schema from them, and a key it lacks is an
// error naming the key.
#pragma once

#include <string>

#include "hybridflow/algo/advantage.h"
#include "hybridflow/algo/kl.h"
#include "hybridflow/algo/losses.h"
#include "hybridflow/algo/safe_rlhf.h"
#include "hybridflow/core/config.h"

namespace hybridflow::algo {

// The `algorithm:` section alone, for trainers that nest the actor/critic keys elsewhere (verl's
// actor_rollout_ref.actor) and compose their schema from this fragment.
extern const char* const kAlgorithmSectionYaml;
// The actor's loss keys (read by policy_loss_config and actor_loss_terms), unindented: a trainer places
// them in its actor section (indent_yaml).
extern const char* const kActorLossYaml;
// Top-level sections `algorithm:` and `actor:` (the loss keys only).
extern const std::string kAlgoDefaultsYaml;
// `yaml`'s lines indented by `spaces`, to place a fragment under a section.
std::string indent_yaml(const std::string& yaml, int spaces);

// From the `algorithm` section: gamma, lam, norm_adv_by_std_in_grpo (tensors left unset).
AdvantageInput advantage_params(const Config& algorithm);
// algorithm.adv_estimator, checked against the registry.
std::string advantage_estimator_name(const Config& algorithm);
// algorithm.kl_ctrl.{type, kl_coef, target_kl, horizon}.
KlController kl_controller(const Config& algorithm);
// algorithm.kl_penalty: the estimator used when the KL goes into the reward.
KlType reward_kl_type(const Config& algorithm);
// algorithm.safe_rlhf.{lambda_init, lambda_lr, cost_limit, use_log_lambda, lambda_max, lambda_update_delay_steps}.
LagrangeConfig lagrange_config(const Config& algorithm);

// From the `actor` section: clip_ratio, clip_ratio_low, clip_ratio_high, clip_ratio_c, loss_agg_mode,
// loss_scale_factor, policy_loss.loss_mode, tau_pos, tau_neg, policy_loss.{clip_cov_ratio, clip_cov_lb,
// clip_cov_ub, kl_cov_ratio, ppo_kl_coef}. Logs a warning (once per clip_ratio value and process) when
// clip_ratio is not 0.2 and clip_ratio_low or clip_ratio_high is null: hybridflow then clips that side at
// clip_ratio, where verl would clip it at its own default 0.2.
PolicyLossConfig policy_loss_config(const Config& actor);
// actor.{use_kl_loss, kl_loss_coef, kl_loss_type, entropy_coeff}.
struct ActorLossTerms {
  bool use_kl_loss = false;
  double kl_loss_coef = 0.001;
  KlType kl_loss_type = KlType::kK3;
  double entropy_coeff = 0.0;
};
ActorLossTerms actor_loss_terms(const Config& actor);

}  // namespace hybridflow::algo
