// Worker groups over real worker processes: data-parallel calls, colocated roles, futures chained
// across pools and pools running concurrently.
#include "runtime/runtime_test_workers.h"

TEST(WorkerGroup, DataParallelCallSplitsAcrossTwoWorkers) {
  Controller ctl;
  auto pool = ctl.add_pool(pool_spec("dp", 2));
  auto group = ctl.create_group("dp", "actor", "echo");
  EXPECT_EQ(group.methods().at("double"), protocols::kDataParallel);
  Future f = group.call("double", batch(6));
  const DataProto& out = f.get();
  EXPECT_TRUE(torch::equal(out.tensor("y"), torch::arange(6, torch::kFloat) * 2));
  EXPECT_EQ(longs(out.tensor("rank")), (std::vector<int64_t>{0, 0, 0, 1, 1, 1}));
  ASSERT_EQ(f.per_rank().size(), 2u);
  EXPECT_EQ(f.per_rank()[1].batch_size(), 3);
  auto pids = pool->pids();
  EXPECT_NE(pids[0], pids[1]);
  EXPECT_NE(pids[0], ::getpid());
}

TEST(WorkerGroup, ColocatedRolesShareProcessesAndRunOneAfterAnother) {
  Controller ctl;
  auto pool = ctl.add_pool(pool_spec("shared", 2));
  auto actor = ctl.create_group("shared", "actor", "echo");
  auto critic = ctl.create_group("shared", "critic", "plus_one");
  auto a = actor.call("pid").get();
  auto c = critic.call("pid").get();
  auto pids = pool->pids();
  EXPECT_EQ(longs(a.tensor("pid")), (std::vector<int64_t>{pids[0], pids[1]}));
  EXPECT_EQ(longs(c.tensor("pid")), longs(a.tensor("pid")));

  DataProto sleep;
  sleep.meta()["sleep_ms"] = 200;
  auto t0 = std::chrono::steady_clock::now();
  auto f1 = actor.call("sleep", sleep);
  auto f2 = actor.call("sleep", sleep);
  wait_all({f1, f2});
  EXPECT_GE(seconds_since(t0), 0.4) << "calls on one process must not overlap";
}

TEST(WorkerGroup, FutureChainsIntoAnotherGroupWithoutWaiting) {
  Controller ctl;
  ctl.add_pool(pool_spec("a", 2));
  ctl.add_pool(pool_spec("b", 1));
  auto actor = ctl.create_group("a", "actor", "echo");
  auto critic = ctl.create_group("b", "critic", "plus_one");
  Future doubled = actor.call("double", batch(4));
  Future chained = critic.call("add_one", doubled);
  EXPECT_TRUE(torch::equal(chained.get().tensor("z"), torch::arange(4, torch::kFloat) * 2 + 1));

  Future failed = actor.call("fail");
  Future after_failure = critic.call("add_one", failed);
  EXPECT_NE(message_of(after_failure).find("bad input on purpose"), std::string::npos) << message_of(after_failure);
}

TEST(WorkerGroup, TwoPoolsRunConcurrently) {
  Controller ctl;
  ctl.add_pool(pool_spec("left", 1));
  ctl.add_pool(pool_spec("right", 1));
  auto left = ctl.create_group("left", "rollout", "echo");
  auto right = ctl.create_group("right", "critic", "echo");
  DataProto sleep;
  sleep.meta()["sleep_ms"] = 300;
  auto t0 = std::chrono::steady_clock::now();
  auto fl = left.call("sleep", sleep);
  auto fr = right.call("sleep", sleep);
  wait_all({fl, fr});
  double elapsed = seconds_since(t0);
  EXPECT_GE(elapsed, 0.3);
  EXPECT_LT(elapsed, 0.5);
}

TEST(WorkerGroup, WorkerErrorFailsTheCallButNotThePool) {
  Controller ctl;
  auto pool = ctl.add_pool(pool_spec("err", 2));
  auto group = ctl.create_group("err", "reward", "echo");
  std::string msg = message_of(group.call("fail"));
  EXPECT_NE(msg.find("'reward'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'fail'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bad input on purpose"), std::string::npos) << msg;
  EXPECT_FALSE(pool->failed());
  EXPECT_EQ(group.call("double", batch(2)).get().batch_size(), 2);
  std::string unknown = message_of(group.call("no_such_method"));
  EXPECT_NE(unknown.find("registered: crash, double"), std::string::npos) << unknown;
}

