// Registration of the RL worker types under the names the trainer asks for. A static library drops
// object files nobody references, so instead of HF_REGISTER_WORKER lines in the workers' sources the
// binary calls this before run_worker_if_requested() (first thing in main, or in a static initializer):
//   static const bool ok = (hybridflow::register_rl_workers(), hybridflow::run_worker_if_requested());
#pragma once

namespace hybridflow {

inline constexpr const char* kActorRolloutRefWorkerType = "actor_rollout_ref";
inline constexpr const char* kCriticWorkerType = "critic";
inline constexpr const char* kRewardModelWorkerType = "reward_model";
inline constexpr const char* kRolloutWorkerType = "rollout";

// Idempotent.
void register_rl_workers();

}  // namespace hybridflow
