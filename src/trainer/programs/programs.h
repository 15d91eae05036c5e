// Internal to trainer/: the built-in RL programs (one file each), registered by rl_program.cpp.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "hybridflow/trainer/rl_program.h"

namespace hybridflow::programs {

// PPO (estimator gae), GRPO, RLOO, REINFORCE++ or any registered estimator: one step, the estimator its
// parameter. with_estimator binds one; with_configured_estimator takes algorithm.adv_estimator.
nlohmann::json policy_gradient(RLStep& step, const std::string& estimator);
RLProgram with_estimator(const std::string& estimator);
RLProgram with_configured_estimator();
nlohmann::json remax(RLStep& step);
nlohmann::json safe_rlhf(RLStep& step);
nlohmann::json dapo(RLStep& step);

}  // namespace hybridflow::programs
