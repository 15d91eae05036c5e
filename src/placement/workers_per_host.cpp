#include "hybridflow/placement/workers_per_host.h"

#include <algorithm>

namespace hybridflow {

int workers_per_host(const RolePlacement& placement, int64_t nnodes, const LaunchEnv& env) {
  if (env.launcher != "single") {
    if (env.local_world_size <= 0) return 0;
    return env.world_size > env.local_world_size ? env.local_world_size : env.local_world_size - 1;
  }
  int64_t processes = 0;
  for (const PoolSpec& pool : placement.pools) processes += pool.processes;
  const int64_t nodes = std::max<int64_t>(1, nnodes);
  return static_cast<int>((processes + nodes - 1) / nodes);
}

}  // namespace hybridflow
