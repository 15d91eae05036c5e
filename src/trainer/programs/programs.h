// Internal to trainer/: the built-in RL programs (one file each), registered by rl_program.cpp.
#pragma once

#include <nlohmann/json.hpp>

#include "hybridflow/trainer/rl_program.h"

namespace hybridflow::programs {

nlohmann::json ppo(RLStages& rl);
nlohmann::json grpo(RLStages& rl);
nlohmann::json rloo(RLStages& rl);
nlohmann::json remax(RLStages& rl);
nlohmann::json reinforce_plus_plus(RLStages& rl);
nlohmann::json safe_rlhf(RLStages& rl);
nlohmann::json dapo(RLStages& rl);
// Any other registered advantage estimator (algo/advantage.h) as a critic-free policy-gradient step.
nlohmann::json policy_gradient(RLStages& rl);

}  // namespace hybridflow::programs
