// Reading the algo settings from a Config with verl's key names. Every key is optional: a key the schema
// lacks, or one set to null, takes verl's default (except clip_ratio_low/high: see policy_loss_config), so a
// trainer may declare only the keys it exposes.
// kAlgoDefaultsYaml / kAlgorithmSectionYaml hold those defaults as schema fragments.
#pragma once

#include <nlohmann/json_fwd.hpp>

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
// Top-level sections `algorithm:`, `actor:` (loss keys only) and `critic:` (cliprange_value only).
extern const std::string kAlgoDefaultsYaml;

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
// loss_scale_factor, policy_loss.loss_mode. Logs a warning (once per clip_ratio value and process) when
// clip_ratio is not 0.2 and clip_ratio_low or clip_ratio_high is null: hybridflow then clips that side at
// clip_ratio, where verl would clip it at its own default 0.2.
PolicyLossConfig policy_loss_config(const Config& actor);
// The same keys from the actor's JSON as the trainer hands it to its workers (absent or null = default).
PolicyLossConfig policy_loss_config(const nlohmann::json& actor);
// actor.{use_kl_loss, kl_loss_coef, kl_loss_type, entropy_coeff}.
struct ActorLossTerms {
  bool use_kl_loss = false;
  double kl_loss_coef = 0.001;
  KlType kl_loss_type = KlType::kK3;
  double entropy_coeff = 0.0;
};
ActorLossTerms actor_loss_terms(const Config& actor);

}  // namespace hybridflow::algo
