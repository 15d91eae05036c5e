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


TEST(WorkerGroup, ExternallyLaunchedWorkersJoinByEndpointAndToken) {
  auto spec = pool_spec("external", 2);
  spec.spawn_workers = false;
  spec.token = "job-token-for-test";
  std::vector<pid_t> launched;
  // Workers started elsewhere need the endpoint up front: take a free port from the OS.
  zmq::context_t probe_context(1);
  zmq::socket_t probe(probe_context, zmq::socket_type::router);
  probe.bind("tcp://127.0.0.1:*");
  std::string probe_endpoint = probe.get(zmq::sockopt::last_endpoint);
  probe.unbind(probe_endpoint);
  spec.bind_port = std::stoi(probe_endpoint.substr(probe_endpoint.rfind(':') + 1));
  // What srun/mpirun would do on each host: start the binary with the worker environment. ZeroMQ
  // retries the connection until the controller binds.
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) env.push_back(*e);
    env.push_back("HF_WORKER_ENDPOINT=tcp://127.0.0.1:" + std::to_string(spec.bind_port));
    env.push_back("HF_WORKER_TOKEN=" + spec.token);
    env.push_back("HF_WORKER_RANK=" + std::to_string(rank));
    std::vector<char*> envp;
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string exe = "/proc/self/exe";
    char* argv[] = {exe.data(), nullptr};
    pid_t pid = 0;
    ASSERT_EQ(::posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv, envp.data()), 0);
    launched.push_back(pid);
  }
  auto pool = ProcessPool::start(spec);
  EXPECT_EQ(pool->pids(), (std::vector<int>{launched[0], launched[1]}));
  WorkerGroup group(pool, "actor", "echo");
  EXPECT_TRUE(torch::equal(group.call("double", batch(4)).get().tensor("y"), torch::arange(4, torch::kFloat) * 2));
  pool->shutdown();  // asks them to exit; they are not ours to kill
  for (pid_t pid : launched) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  }
}
