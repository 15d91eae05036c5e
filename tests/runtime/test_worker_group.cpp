// Worker groups over real worker processes: data-parallel calls, colocated roles, futures chained
// across pools and pools running concurrently.
#include <torch/cuda.h>

#include "hybridflow/core/fs.h"
#include "runtime/runtime_test_workers.h"

// One job for the tests that leave it healthy: pool "a" (2 processes, actor + critic colocated),
// pools "b" and "c" (1 process each). Starting pools costs seconds, so they are shared.
class SharedJob : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ctl_ = new Controller();
    ctl_->add_pools({pool_spec("a", 2), pool_spec("b", 1), pool_spec("c", 1)});
    actor_ = new WorkerGroup(ctl_->create_group("a", "actor", "echo"));
    colocated_ = new WorkerGroup(ctl_->create_group("a", "critic", "plus_one"));
    critic_b_ = new WorkerGroup(ctl_->create_group("b", "critic", "plus_one"));
    echo_b_ = new WorkerGroup(ctl_->create_group("b", "echo", "echo"));
    echo_c_ = new WorkerGroup(ctl_->create_group("c", "echo", "echo"));
  }
  static void TearDownTestSuite() {
    for (auto* g : {actor_, colocated_, critic_b_, echo_b_, echo_c_}) delete g;
    delete ctl_;
  }
  static Controller* ctl_;
  static WorkerGroup *actor_, *colocated_, *critic_b_, *echo_b_, *echo_c_;
};
Controller* SharedJob::ctl_ = nullptr;
WorkerGroup *SharedJob::actor_, *SharedJob::colocated_, *SharedJob::critic_b_, *SharedJob::echo_b_,
    *SharedJob::echo_c_;

TEST_F(SharedJob, DataParallelCallSplitsAcrossTwoWorkers) {
  EXPECT_EQ(actor_->methods().at("double"), protocols::kDataParallel);
  Future f = actor_->call("double", batch(6));
  const DataProto& out = f.get();
  EXPECT_TRUE(torch::equal(out.tensor("y"), torch::arange(6, torch::kFloat) * 2));
  EXPECT_EQ(longs(out.tensor("rank")), (std::vector<int64_t>{0, 0, 0, 1, 1, 1}));
  ASSERT_EQ(f.per_rank().size(), 2u);
  EXPECT_EQ(f.per_rank()[1].batch_size(), 3);
  auto pids = actor_->pool().pids();
  EXPECT_NE(pids[0], pids[1]);
  EXPECT_NE(pids[0], ::getpid());
}

TEST_F(SharedJob, ColocatedRolesShareProcessesAndRunOneAfterAnother) {
  auto a = actor_->call("pid").get();
  auto c = colocated_->call("pid").get();
  auto pids = actor_->pool().pids();
  EXPECT_EQ(longs(a.tensor("pid")), (std::vector<int64_t>{pids[0], pids[1]}));
  EXPECT_EQ(longs(c.tensor("pid")), longs(a.tensor("pid")));

  DataProto sleep;
  sleep.meta()["sleep_ms"] = 200;
  auto t0 = std::chrono::steady_clock::now();
  auto f1 = actor_->call("sleep", sleep);
  auto f2 = actor_->call("sleep", sleep);
  wait_all({f1, f2});
  EXPECT_GE(seconds_since(t0), 0.4) << "calls on one process must not overlap";
}

TEST_F(SharedJob, FutureChainsIntoAnotherGroupWithoutWaiting) {
  Future doubled = actor_->call("double", batch(4));
  Future chained = critic_b_->call("add_one", doubled);
  EXPECT_TRUE(torch::equal(chained.get().tensor("z"), torch::arange(4, torch::kFloat) * 2 + 1));

  Future failed = actor_->call("fail");
  Future after_failure = critic_b_->call("add_one", failed);
  EXPECT_NE(message_of(after_failure).find("bad input on purpose"), std::string::npos) << message_of(after_failure);
}

TEST_F(SharedJob, TwoPoolsRunConcurrently) {
  DataProto sleep;
  sleep.meta()["sleep_ms"] = 300;
  auto t0 = std::chrono::steady_clock::now();
  auto fb = echo_b_->call("sleep", sleep);
  auto fc = echo_c_->call("sleep", sleep);
  wait_all({fb, fc});
  double elapsed = seconds_since(t0);
  EXPECT_GE(elapsed, 0.3);
  EXPECT_LT(elapsed, 0.5);
}

TEST_F(SharedJob, WorkerErrorFailsTheCallButNotThePool) {
  std::string msg = message_of(actor_->call("fail"));
  EXPECT_NE(msg.find("'actor'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'fail'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bad input on purpose"), std::string::npos) << msg;
  EXPECT_FALSE(actor_->pool().failed());
  EXPECT_EQ(actor_->call("double", batch(2)).get().batch_size(), 2);
  std::string unknown = message_of(actor_->call("no_such_method"));
  EXPECT_NE(unknown.find("registered: crash, double"), std::string::npos) << unknown;
}

// global_profiler's worker side: an armed role profiles the named methods on the named ranks, one trace and
// one summary line per call, until it is disarmed.
TEST_F(SharedJob, ArmedRoleProfilesTheNamedMethodsOnTheNamedRanksUntilDisarmed) {
  hybridflow::testing::TempDir dir;
  EXPECT_EQ(actor_->methods().at(kProfileMethod), protocols::kOneToAll);
  CallProfileRequest request;
  request.step = 3;
  request.dir = dir.path();
  request.targets.push_back({.methods = {"double"}, .all_ranks = false, .ranks = {1}, .contents = {}});
  request.targets.push_back({.methods = {"sleep"}, .all_ranks = false, .ranks = {0}, .contents = {}});
  DataProto arm;
  arm.meta()["profile"] = request.to_json();
  actor_->call(kProfileMethod, arm).get();
  EXPECT_TRUE(torch::equal(actor_->call("double", batch(4)).get().tensor("y"), torch::arange(4, torch::kFloat) * 2));
  actor_->call("pid").get();  // not a named method
  actor_->call("sleep").get();  // named for rank 0 only
  actor_->call("double", batch(4)).get();
  DataProto disarm;
  disarm.meta()["profile"] = nullptr;
  actor_->call(kProfileMethod, disarm).get();
  actor_->call("double", batch(4)).get();  // disarmed: not profiled

  const std::string step_dir = dir.path() + "/step_3";
  EXPECT_TRUE(file_exists(step_dir + "/actor_rank1_double_1.trace.json"));
  EXPECT_TRUE(file_exists(step_dir + "/actor_rank1_double_2.trace.json"));
  EXPECT_FALSE(file_exists(step_dir + "/actor_rank1_double_3.trace.json"));
  EXPECT_FALSE(file_exists(step_dir + "/actor_rank0_double_1.trace.json"));
  EXPECT_FALSE(file_exists(step_dir + "/actor_rank1_sleep_1.trace.json"));
  EXPECT_FALSE(file_exists(step_dir + "/actor_rank1_pid_1.trace.json"));
  EXPECT_TRUE(file_exists(step_dir + "/actor_rank0_sleep_1.trace.json"));
  std::vector<nlohmann::json> lines;
  std::istringstream summary(read_file(step_dir + "/actor_rank1.summary.jsonl"));
  for (std::string line; std::getline(summary, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 2u);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(lines[k]["method"], "double");
    EXPECT_EQ(lines[k]["rank"], 1);
    EXPECT_EQ(lines[k]["step"], 3);
    EXPECT_EQ(lines[k]["call"], k + 1);
    EXPECT_GT(lines[k]["wall_s"].get<double>(), 0.0);
    // The method's own multiplication, by name, among the operators it ran.
    bool mul = false;
    for (const auto& op : lines[k]["top_operators"]) mul = mul || op["name"] == "aten::mul";
    EXPECT_TRUE(mul) << lines[k].dump();
  }
  // Without traces: the summary line alone.
  request.step = 4;
  request.trace = false;
  arm.meta()["profile"] = request.to_json();
  actor_->call(kProfileMethod, arm).get();
  actor_->call("double", batch(2)).get();
  actor_->call(kProfileMethod, disarm).get();
  EXPECT_FALSE(file_exists(dir.path() + "/step_4/actor_rank1_double_1.trace.json"));
  const nlohmann::json untraced = nlohmann::json::parse(read_file(dir.path() + "/step_4/actor_rank1.summary.jsonl"));
  EXPECT_TRUE(untraced["trace"].is_null());
  EXPECT_GT(untraced["operator_calls"].get<int64_t>(), 0);
  // A directory that cannot be made costs the profile, not the call.
  request.dir = "/proc/hybridflow-no-such-dir";
  arm.meta()["profile"] = request.to_json();
  actor_->call(kProfileMethod, arm).get();
  EXPECT_TRUE(torch::equal(actor_->call("double", batch(4)).get().tensor("y"), torch::arange(4, torch::kFloat) * 2));
  actor_->call(kProfileMethod, disarm).get();
  // A request the worker cannot honour fails the call, naming what is wrong.
  request.targets[0].contents = {"gpu"};
  arm.meta()["profile"] = request.to_json();
  const std::string msg = message_of(actor_->call(kProfileMethod, arm));
  EXPECT_NE(msg.find("content 'gpu' is not one of cpu, cuda, memory, shapes, stack"), std::string::npos) << msg;
}

// Tool torch_memory on CPU ranks: the calls run unprofiled, and disarming writes no snapshot (there is no CUDA
// allocator to record); its options are checked on arrival, naming the bad one.
TEST_F(SharedJob, TorchMemoryOnTheCpuRunsTheCallsAndWritesNoSnapshot) {
  hybridflow::testing::TempDir dir;
  CallProfileRequest request;
  request.tool = "torch_memory";
  request.step = 2;
  request.dir = dir.path();
  request.targets.push_back({.methods = {"double"}, .all_ranks = true, .ranks = {}, .contents = {}});
  DataProto arm;
  arm.meta()["profile"] = request.to_json();
  actor_->call(kProfileMethod, arm).get();
  EXPECT_TRUE(torch::equal(actor_->call("double", batch(4)).get().tensor("y"), torch::arange(4, torch::kFloat) * 2));
  DataProto disarm;
  disarm.meta()["profile"] = nullptr;
  actor_->call(kProfileMethod, disarm).get();
  EXPECT_FALSE(file_exists(dir.path() + "/step_2/actor_rank0_double_1.trace.json"));
  EXPECT_FALSE(file_exists(dir.path() + "/step_2/actor_rank0.memory.pickle"));
  EXPECT_FALSE(file_exists(dir.path() + "/step_2/actor_rank0.summary.jsonl"));
  request.memory.context = "everything";
  arm.meta()["profile"] = request.to_json();
  const std::string msg = message_of(actor_->call(kProfileMethod, arm));
  EXPECT_NE(msg.find("memory.context: expected alloc, state or all, got 'everything'"), std::string::npos) << msg;
}

namespace {

// Kills the launched workers a failed assertion left behind (they are not the pool's to kill).
struct KillLaunchedOnFailure {
  std::vector<pid_t>& pids;
  ~KillLaunchedOnFailure() {
    for (pid_t pid : pids)
      if (::waitpid(pid, nullptr, WNOHANG) == 0) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
      }
  }
};

// What srun/mpirun would do on each host: start this binary with the worker environment, each process
// serving ranks_per_process ranks (more than one: simulated workers, worker_main.h). ZeroMQ retries the
// connection until the controller binds. Sets the spec's port (workers need the endpoint up front).
std::vector<pid_t> launch_external_workers(ResourcePool& spec, int ranks_per_process) {
  zmq::context_t probe_context(1);
  zmq::socket_t probe(probe_context, zmq::socket_type::router);
  probe.bind("tcp://127.0.0.1:*");
  std::string probe_endpoint = probe.get(zmq::sockopt::last_endpoint);
  probe.close();  // closing the context waits until the port is really released
  probe_context.close();
  spec.bind_port = std::stoi(probe_endpoint.substr(probe_endpoint.rfind(':') + 1));
  std::vector<pid_t> launched;
  for (int first = 0; first < spec.num_processes; first += ranks_per_process) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) env.push_back(*e);
    env.push_back("HF_WORKER_ENDPOINT=tcp://127.0.0.1:" + std::to_string(spec.bind_port));
    env.push_back("HF_WORKER_TOKEN=" + spec.token);
    env.push_back("HF_WORKER_RANK=" + std::to_string(first));
    env.push_back("HF_WORKER_POOL=" + spec.name);
    env.push_back("HF_WORKER_CONNECT_TIMEOUT_S=30");
    if (ranks_per_process > 1) env.push_back(std::string(kWorkerRankCountEnv) + "=" + std::to_string(ranks_per_process));
    std::vector<char*> envp;
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string exe = "/proc/self/exe";
    char* argv[] = {exe.data(), nullptr};
    pid_t pid = 0;
    EXPECT_EQ(::posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv, envp.data()), 0);
    if (pid > 0) launched.push_back(pid);
  }
  return launched;
}

void expect_clean_exits(std::vector<pid_t>& launched) {
  for (pid_t pid : launched) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  }
  launched.clear();
}

}  // namespace

TEST(WorkerGroup, ExternallyLaunchedWorkersJoinByEndpointAndToken) {
  auto spec = pool_spec("external", 2);
  spec.spawn_workers = false;
  spec.token = "job-secret-for-test-3a9f6c1e8b2d4075";
  std::vector<pid_t> launched;
  KillLaunchedOnFailure guard{launched};
  launched = launch_external_workers(spec, 1);
  ASSERT_EQ(launched.size(), 2u);
  auto pool = ProcessPool::start(spec);
  EXPECT_EQ(pool->pids(), (std::vector<int>{launched[0], launched[1]}));
  WorkerGroup group(pool, "actor", "echo");
  EXPECT_TRUE(torch::equal(group.call("double", batch(4)).get().tensor("y"), torch::arange(4, torch::kFloat) * 2));
  pool->shutdown();  // asks them to exit; they are not ours to kill
  expect_clean_exits(launched);
}

// Simulated workers: 96 ranks served by 3 processes, each rank with its own connection and key state.
// A one-to-all call reaches every rank and returns every rank's answer, in rank order.
TEST(WorkerGroup, OneToAllCallReachesEverySimulatedWorker) {
  constexpr int kRanks = 96, kPerProcess = 32;
  auto spec = pool_spec("simulated", kRanks);
  spec.spawn_workers = false;
  spec.token = "job-secret-for-test-5c0e7a9d1f3b8264";
  std::vector<pid_t> launched;
  KillLaunchedOnFailure guard{launched};
  launched = launch_external_workers(spec, kPerProcess);
  ASSERT_EQ(launched.size(), 3u);
  auto pool = ProcessPool::start(spec);
  WorkerGroup group(pool, "actor", "echo");
  for (int round = 0; round < 3; ++round) {
    const DataProto out = group.call("pid").get();
    std::vector<int64_t> ranks(kRanks), pids(kRanks);
    for (int r = 0; r < kRanks; ++r) {
      ranks[r] = r;
      pids[r] = launched[r / kPerProcess];
    }
    EXPECT_EQ(longs(out.tensor("rank")), ranks);
    EXPECT_EQ(longs(out.tensor("pid")), pids);
  }
  // A data-parallel call splits its rows over all of them.
  const DataProto doubled = group.call("double", batch(2 * kRanks)).get();
  EXPECT_TRUE(torch::equal(doubled.tensor("y"), torch::arange(2 * kRanks, torch::kFloat) * 2));
  EXPECT_EQ(pool->rejected_messages(), 0u);
  pool->shutdown();
  expect_clean_exits(launched);
}

namespace {

// A pool of `ranks` simulated workers, `per_process` to a process, started and with a "rank_probe" group.
struct SimulatedPool {
  SimulatedPool(const std::string& name, int ranks, int per_process, bool batch_calls, double heartbeat_timeout_s = 30) {
    auto spec = pool_spec(name, ranks);
    spec.spawn_workers = false;
    spec.token = "job-secret-for-test-" + name + "-7d2c9e4a1b3f5608";
    spec.batch_calls = batch_calls;
    spec.heartbeat_timeout_s = heartbeat_timeout_s;
    launched = launch_external_workers(spec, per_process);
    pool = ProcessPool::start(spec);
    group = std::make_unique<WorkerGroup>(pool, "probe", "rank_probe");
  }
  std::vector<pid_t> launched;
  KillLaunchedOnFailure guard{launched};
  std::shared_ptr<ProcessPool> pool;
  std::unique_ptr<WorkerGroup> group;
};

void expect_same_per_rank(const Future& batched, const Future& alone) {
  const auto& a = batched.per_rank();
  const auto& b = alone.per_rank();
  ASSERT_EQ(a.size(), b.size());
  for (size_t r = 0; r < a.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(a[r].meta(), b[r].meta());
    EXPECT_EQ(a[r].fields(), b[r].fields());
    ASSERT_EQ(a[r].tensors().size(), b[r].tensors().size());
    for (const auto& [key, t] : a[r].tensors()) {
      ASSERT_TRUE(b[r].has_tensor(key)) << key;
      EXPECT_EQ(t.scalar_type(), b[r].tensor(key).scalar_type()) << key;
      EXPECT_TRUE(torch::equal(t, b[r].tensor(key))) << key;
    }
  }
}

}  // namespace

// Ranks sharing a process get a one-to-all call as one message per process and answer with one merged
// reply; every rank's answer is the one it gives when called alone: tensors, fields, meta, a result too big
// to merge, and an input the method writes to (each rank has its own).
TEST(WorkerGroup, BatchedCallsGiveEachRankTheAnswerItGivesAlone) {
  constexpr int kRanks = 8, kPerProcess = 4;
  SimulatedPool batched("batched", kRanks, kPerProcess, true);
  SimulatedPool alone("alone", kRanks, kPerProcess, false);
  DataProto ask = batch(3);
  ask.meta()["big_on_even"] = true;
  Future a = batched.group->call("describe", ask), b = alone.group->call("describe", ask);
  expect_same_per_rank(a, b);
  ASSERT_EQ(a.per_rank().size(), size_t(kRanks));
  for (int r = 0; r < kRanks; ++r) {
    const DataProto& out = a.per_rank()[r];
    EXPECT_EQ(out.meta().at("rank"), r);
    EXPECT_EQ(out.meta().at("world"), kRanks);
    const int64_t rows = r % 2 == 0 ? 4096 : 1;
    ASSERT_EQ(out.batch_size(), rows);
    EXPECT_EQ(out.field("name"), std::vector<nlohmann::json>(rows, "rank " + std::to_string(r)));
    EXPECT_TRUE(torch::equal(out.tensor("x_plus_rank")[rows - 1], torch::arange(3, torch::kFloat) + r));
    EXPECT_TRUE(torch::equal(out.tensor("wide"), torch::full({rows, 8}, static_cast<float>(r))));
  }
  Future sa = batched.group->call("scribble", batch(3)), sb = alone.group->call("scribble", batch(3));
  expect_same_per_rank(sa, sb);
  for (const auto& out : sa.per_rank())
    EXPECT_TRUE(torch::equal(out.tensor("x"), (torch::arange(3, torch::kFloat) + 1).reshape({1, 3})));

  // One message each way per process instead of one per rank.
  const Traffic before_a = batched.pool->traffic(), before_b = alone.pool->traffic();
  batched.group->call("empty").get();
  alone.group->call("empty").get();
  EXPECT_EQ((batched.pool->traffic() - before_a).controller_messages, uint64_t(2 * kRanks / kPerProcess));
  EXPECT_EQ((alone.pool->traffic() - before_b).controller_messages, uint64_t(2 * kRanks));
  EXPECT_EQ(batched.pool->rejected_messages(), 0u);
  for (SimulatedPool* p : {&batched, &alone}) {
    p->pool->shutdown();
    expect_clean_exits(p->launched);
  }
}

// A rank's error in a batch fails the call naming that rank, as when it answers alone; the pool goes on.
TEST(WorkerGroup, BatchedCallReportsTheFailingRank) {
  SimulatedPool sim("batch_errors", 6, 3, true);
  for (int failing : {1, 4}) {
    DataProto ask;
    ask.meta()["rank"] = failing;
    const std::string msg = message_of(sim.group->call("fail_on", ask));
    EXPECT_NE(msg.find("rank " + std::to_string(failing) + " ("), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank " + std::to_string(failing) + " fails on purpose"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'fail_on'"), std::string::npos) << msg;
  }
  EXPECT_FALSE(sim.pool->failed());
  EXPECT_EQ(sim.group->call("describe").get().tensor("rank").numel(), 6);
  sim.pool->shutdown();
  expect_clean_exits(sim.launched);
}

// Calls issued without waiting run on every rank in the order issued, whether they reach it in a batch (one-to-all)
// or alone (data-parallel shards), though the two travel on different connections.
TEST(WorkerGroup, BatchedAndSingleCallsRunInTheOrderIssued) {
  constexpr int kRanks = 4;
  SimulatedPool sim("batch_order", kRanks, 2, true);
  std::vector<Future> calls;
  for (int i = 0; i < 12; ++i)
    calls.push_back(i % 3 == 1 ? sim.group->call("ordinal_rows", batch(kRanks)) : sim.group->call("ordinal"));
  for (int i = 0; i < 12; ++i)
    EXPECT_EQ(longs(calls[i].get().tensor("ordinal")), std::vector<int64_t>(kRanks, i + 1)) << "call " << i;
  sim.pool->shutdown();
  expect_clean_exits(sim.launched);
}

// A worker process that dies in a batched call fails the call (it does not hang), naming one of its ranks.
TEST(WorkerGroup, KilledProcessFailsItsRanksBatchedCall) {
  SimulatedPool sim("batch_killed", 4, 2, true, /*heartbeat_timeout_s=*/2);
  DataProto ask;
  ask.meta()["sleep_ms"] = 20000;
  Future sleeping = sim.group->call("sleep", ask);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_EQ(::kill(sim.launched[1], SIGKILL), 0);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = message_of(sleeping);
  EXPECT_LT(seconds_since(t0), 15.0);
  EXPECT_TRUE(msg.find("worker rank 2 ") != std::string::npos || msg.find("worker rank 3 ") != std::string::npos) << msg;
  EXPECT_NE(msg.find("probe.sleep"), std::string::npos) << msg;
  EXPECT_TRUE(sim.pool->failed());
  ::waitpid(sim.launched[1], nullptr, 0);
  sim.launched.erase(sim.launched.begin() + 1);
  sim.pool->shutdown();  // the surviving process is asked to leave
}

// Ranks sharing a process beat once per process (one rank names the others alive) and hear the controller's
// heartbeats through one of them: past several heartbeat timeouts, no rank is taken for silent, none leaves.
TEST(WorkerGroup, RanksSharingAProcessStayAliveOnOneHeartbeatPerProcess) {
  SimulatedPool sim("batch_beats", 6, 3, true, /*heartbeat_timeout_s=*/1.0);
  sim.group->call("empty").get();
  std::this_thread::sleep_for(std::chrono::milliseconds(3500));
  EXPECT_FALSE(sim.pool->failed()) << sim.pool->failure();
  EXPECT_EQ(sim.group->call("describe").get().tensor("rank").numel(), 6);
  EXPECT_EQ(sim.pool->rejected_messages(), 0u);
  sim.pool->shutdown();
  expect_clean_exits(sim.launched);
}

TEST(WorkerGroup, SpawnedWorkersGetTheConfiguredEnvironment) {
  auto spec = pool_spec("env", 2);
  spec.env["HF_TEST_MARK"] = "forty-two";
  Controller ctl;
  ctl.add_pool(spec);
  auto group = ctl.create_group("env", "actor", "echo");
  DataProto ask;
  ask.meta()["name"] = "HF_TEST_MARK";
  auto values = group.call("getenv", ask).get().field("value");
  EXPECT_EQ(values, (std::vector<nlohmann::json>{"forty-two", "forty-two"}));
  ask.meta()["name"] = "HF_WORKER_RANK";
  EXPECT_EQ(group.call("getenv", ask).get().field("value"), (std::vector<nlohmann::json>{"0", "1"}));
}

// `ps` tells worker processes apart: their command line names program, pool and rank.
TEST(WorkerGroup, SpawnedWorkersAreNamedByPoolAndRank) {
  Controller ctl;
  auto pool = ctl.add_pool(pool_spec("named", 2));
  const auto pids = pool->pids();
  ASSERT_EQ(pids.size(), 2u);
  for (int rank = 0; rank < 2; ++rank) {
    std::string cmdline = read_file("/proc/" + std::to_string(pids[rank]) + "/cmdline");
    cmdline = cmdline.substr(0, cmdline.find('\0'));
    EXPECT_NE(cmdline.find(" worker named rank " + std::to_string(rank)), std::string::npos) << cmdline;
    std::string comm = read_file("/proc/" + std::to_string(pids[rank]) + "/comm");
    EXPECT_EQ(comm.rfind("hf named " + std::to_string(rank), 0), 0u) << comm;
  }
}

// Two pools on one node pick CUDA devices by LOCAL_RANK: the second pool's ranks start after the first's.
TEST(WorkerGroup, SpawnedWorkersGetDisjointLocalRanksPerPool) {
  auto first = pool_spec("first", 2);
  auto second = pool_spec("second", 2);
  second.local_rank_offset = 2;
  Controller ctl;
  ctl.add_pools({first, second});
  DataProto ask;
  ask.meta()["name"] = "LOCAL_RANK";
  auto a = ctl.create_group("first", "actor", "echo");
  auto b = ctl.create_group("second", "critic", "echo");
  EXPECT_EQ(a.call("getenv", ask).get().field("value"), (std::vector<nlohmann::json>{"0", "1"}));
  EXPECT_EQ(b.call("getenv", ask).get().field("value"), (std::vector<nlohmann::json>{"2", "3"}));
}

TEST(WorkerDevice, CpuOrCudaWithAClearErrorWithoutAGpu) {
  EXPECT_TRUE(worker_device("cpu").is_cpu());
  EXPECT_THROW(worker_device("gpu"), Error);
  if (torch::cuda::device_count() == 0) {
    try {
      worker_device("cuda");
      ADD_FAILURE() << "cuda without a visible device must be an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no CUDA device is visible"), std::string::npos) << e.what();
    }
  } else {
    EXPECT_TRUE(worker_device("cuda").is_cuda());
  }
}
