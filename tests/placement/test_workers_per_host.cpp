#include "hybridflow/placement/workers_per_host.h"

#include <gtest/gtest.h>

namespace hybridflow {
namespace {

RolePlacement pools(std::initializer_list<int> sizes) {
  RolePlacement p;
  int i = 0;
  for (int size : sizes) p.pools.push_back({"pool" + std::to_string(i++), size, "", {}});
  return p;
}

LaunchEnv launched(const std::string& launcher, int world_size, int local_world_size) {
  LaunchEnv env;
  env.launcher = launcher;
  env.world_size = world_size;
  env.local_world_size = local_world_size;
  return env;
}

TEST(WorkersPerHost, SpawnedPoolsAllRunOnThisHostOrSpreadOverNnodes) {
  const LaunchEnv single;
  EXPECT_EQ(workers_per_host(pools({1}), 1, single), 1);
  EXPECT_EQ(workers_per_host(pools({1, 1}), 1, single), 2) << "standalone: trainer and rollout pools";
  EXPECT_EQ(workers_per_host(pools({4, 2, 1}), 1, single), 7);
  EXPECT_EQ(workers_per_host(pools({8, 8}), 2, single), 8);
  EXPECT_EQ(workers_per_host(pools({8, 1}), 2, single), 5) << "rounded up: one host holds the odd one";
  EXPECT_EQ(workers_per_host(pools({2}), 0, single), 2) << "nnodes below 1 counts as one host";
}

TEST(WorkersPerHost, LaunchedRunsCountTheLaunchersLocalWorldLessTheController) {
  // torchrun --standalone --nproc-per-node 3: the controller and two workers on one node.
  EXPECT_EQ(workers_per_host(pools({2}), 1, launched("torchrun", 3, 3)), 2);
  // Two nodes of 2: the busiest node runs 2 workers (node 1 has no controller).
  EXPECT_EQ(workers_per_host(pools({2, 1}), 1, launched("torchrun", 4, 2)), 2);
  EXPECT_EQ(workers_per_host(pools({7}), 1, launched("mpirun", 8, 4)), 4);
  EXPECT_EQ(workers_per_host(pools({3}), 1, launched("srun", 4, 0)), 0) << "unknown: no check";
}

}  // namespace
}  // namespace hybridflow
