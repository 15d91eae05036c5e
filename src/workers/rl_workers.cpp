#include "hybridflow/workers/rl_workers.h"

#include "hybridflow/workers/actor_rollout_ref_worker.h"
#include "hybridflow/workers/critic_worker.h"
#include "hybridflow/workers/rollout_worker.h"

namespace hybridflow {

void register_rl_workers() {
  auto& registry = WorkerRegistry::instance();
  if (!registry.has(kActorRolloutRefWorkerType)) registry.add<ActorRolloutRefWorker>(kActorRolloutRefWorkerType);
  if (!registry.has(kCriticWorkerType)) registry.add<CriticWorker>(kCriticWorkerType);
  if (!registry.has(kRewardModelWorkerType)) registry.add<RewardModelWorker>(kRewardModelWorkerType);
  if (!registry.has(kRolloutWorkerType)) registry.add<RolloutWorker>(kRolloutWorkerType);
}

}  // namespace hybridflow
