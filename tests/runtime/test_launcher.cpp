// One binary as the ranks of a launch: the launch settings, then whole jobs started on loopback with
// torchrun's and srun's environment contracts (the processes are started here, as the launcher would),
// including a wrong token, too few ranks, a worker that dies and a controller that dies.
#include "runtime/launch_test_job.h"

#include "hybridflow/transport/launcher.h"
#include "support/error_of.h"

using hybridflow::testing::error_of;

namespace {

const std::string kSecret = "7d3f9a61c2e84b05a9d6e1f37c28b4a0";

std::map<std::string, std::string> torchrun_env(int rank, int world, int port) {
  return {{"RANK", std::to_string(rank)},   {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_RANK", std::to_string(rank)}, {"LOCAL_WORLD_SIZE", std::to_string(world)},
          {"MASTER_ADDR", "127.0.0.1"},     {"MASTER_PORT", std::to_string(port)},
          {"HF_JOB_TOKEN", kSecret}, {"OMP_NUM_THREADS", "1"}};
}

// Starts world_size ranks of this binary; rank 0 runs the job `mode` and writes `result`.
Job start_torchrun_job(int world, const std::string& mode, const std::string& sizes, const std::string& result,
                       const std::map<std::string, std::string>& extra = {},
                       const std::map<int, std::map<std::string, std::string>>& per_rank = {}) {
  const int port = free_tcp_port();
  Job job;
  for (int rank = 0; rank < world; ++rank) {
    auto env = torchrun_env(rank, world, port);
    env["HF_TEST_LAUNCH_JOB"] = mode;
    env["HF_TEST_POOL_SIZES"] = sizes;
    env["HF_TEST_RESULT"] = result;
    for (const auto& kv : extra) env[kv.first] = kv.second;
    if (per_rank.count(rank))
      for (const auto& kv : per_rank.at(rank)) env[kv.first] = kv.second;
    job.pids.push_back(spawn_with({self_exe()}, env));
  }
  return job;
}

std::vector<int64_t> expected_z() {
  std::vector<int64_t> z;
  for (int i = 0; i < 6; ++i) z.push_back(2 * i + 1);
  return z;
}

}  // namespace

TEST(LaunchSettings, TokenPortsAndControllerComeFromTheLauncherEnvironment) {
  auto base = torchrun_env(1, 4, 29400);
  auto s = launch_settings_from(base);
  EXPECT_TRUE(s.multi_rank());
  EXPECT_FALSE(s.is_controller());
  EXPECT_EQ(s.token, kSecret);
  EXPECT_EQ(s.token_source, "HF_JOB_TOKEN");
  EXPECT_EQ(s.rendezvous_port, 29400);
  EXPECT_EQ(s.endpoint(5), "tcp://127.0.0.1:5");

  // torchrun's agent serves its own store on MASTER_PORT when it shares it with the workers.
  base["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  base["RANK"] = "0";
  s = launch_settings_from(base);
  EXPECT_EQ(s.rendezvous_port, 29401);
  EXPECT_TRUE(s.is_controller());
  EXPECT_EQ(s.bind_addr, "127.0.0.1");

  base["MASTER_ADDR"] = "localhost";
  base["HF_CONTROLLER_RANK"] = "3";
  base["HF_RENDEZVOUS_PORT"] = "31000";
  s = launch_settings_from(base);
  EXPECT_FALSE(s.is_controller());
  base["RANK"] = "3";
  s = launch_settings_from(base);
  EXPECT_EQ(s.bind_addr, "127.0.0.1") << "MASTER_ADDR is resolved for binding";
  EXPECT_EQ(s.rendezvous_port, 31000);

  // Launcher job ids are guessable: they are never the secret.
  std::map<std::string, std::string> slurm = {{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "3"}, {"SLURM_JOB_ID", "812"},
                                              {"SLURM_STEP_ID", "0"}, {"SLURM_JOB_NODELIST", "node[01-02]"}};
  EXPECT_NE(error_of([&] { launch_settings_from(slurm); }).find("HF_JOB_TOKEN_FILE"), std::string::npos);
  std::map<std::string, std::string> mpi = {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                                            {"MASTER_ADDR", "10.1.2.3"}, {"OMPI_MCA_ess_base_jobid", "99"},
                                            {"OMPI_MCA_orte_precondition_transports", "ab-cd"}};
  EXPECT_NE(error_of([&] { launch_settings_from(mpi); }).find("no job secret"), std::string::npos);
  mpi["HF_JOB_TOKEN"] = kSecret;
  EXPECT_EQ(launch_settings_from(mpi).token, kSecret);
  EXPECT_EQ(launch_settings_from(mpi).rendezvous_port, 29500);
}

TEST(LaunchSettings, MissingTokenAndBadValuesAreErrorsNamingTheVariable) {
  auto env = torchrun_env(0, 2, 29400);
  env.erase("HF_JOB_TOKEN");
  EXPECT_NE(error_of([&] { launch_settings_from(env); }).find("HF_JOB_TOKEN"), std::string::npos);
  env["TORCHELASTIC_RUN_ID"] = "run-7";  // guessable: not a secret
  EXPECT_NE(error_of([&] { launch_settings_from(env); }).find("HF_JOB_TOKEN"), std::string::npos);
  env["HF_JOB_TOKEN"] = kSecret;
  env["HF_CONTROLLER_RANK"] = "2";
  std::string msg = error_of([&] { launch_settings_from(env); });
  EXPECT_NE(msg.find("HF_CONTROLLER_RANK=2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[0, 1]"), std::string::npos) << msg;
  env.erase("HF_CONTROLLER_RANK");
  env["MASTER_ADDR"] = "no-such-host.invalid";
  msg = error_of([&] { launch_settings_from(env); });
  EXPECT_NE(msg.find("MASTER_ADDR=no-such-host.invalid"), std::string::npos) << msg;
  EXPECT_NE(msg.find("HF_BIND_ADDR"), std::string::npos) << msg;
  env["HF_BIND_ADDR"] = "0.0.0.0";
  EXPECT_EQ(launch_settings_from(env).bind_addr, "0.0.0.0");
  // A single process needs no token.
  EXPECT_TRUE(launch_settings_from({}).token.empty());
}

TEST(Launch, TorchrunRanksServeTwoPoolsInRankOrder) {
  hybridflow::testing::TempDir dir;
  Job job = start_torchrun_job(4, "pools", "2,1", dir.file("result.json"));
  std::vector<pid_t> rank_pids = job.pids;
  job.wait_all(30);
  auto result = read_result(dir.file("result.json"));
  for (int r = 0; r < 4; ++r) EXPECT_EQ(job.code(r), 0) << "rank " << r << "; result " << result.dump();
  ASSERT_FALSE(result.contains("error")) << result.dump();
  EXPECT_EQ(result["z"].get<std::vector<int64_t>>(), expected_z());
  EXPECT_EQ(result["y_rank"].get<std::vector<int64_t>>(), (std::vector<int64_t>{0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(result["rejected"], 0);
  // Pool p0 is launcher ranks 1 and 2, p1 is rank 3: the very processes started here.
  const auto& p0 = result["where"]["p0"];
  const auto& p1 = result["where"]["p1"];
  ASSERT_EQ(p0.size(), 2u);
  ASSERT_EQ(p1.size(), 1u);
  EXPECT_EQ(p0[0]["launch_rank"], "1");
  EXPECT_EQ(p0[1]["launch_rank"], "2");
  EXPECT_EQ(p1[0]["launch_rank"], "3");
  EXPECT_EQ(p0[0]["pid"].get<int>(), rank_pids[1]);
  EXPECT_EQ(p0[1]["pid"].get<int>(), rank_pids[2]);
  EXPECT_EQ(p1[0]["pid"].get<int>(), rank_pids[3]);
  EXPECT_EQ(p0[0]["controller_addr"], "127.0.0.1");
  // Each pool's worker environment reached the ranks it claimed, allowed keys only.
  EXPECT_EQ(result["mark"]["p0"], (nlohmann::json{"11", "11"}));
  EXPECT_EQ(result["mark"]["p1"], (nlohmann::json{"12"}));
  EXPECT_EQ(result["not_allowed"]["p0"], (nlohmann::json{nullptr, nullptr}));
  EXPECT_EQ(result["not_allowed"]["p1"], (nlohmann::json{nullptr}));
}

TEST(Launch, SrunEnvironmentWithTheJobSecret) {
  hybridflow::testing::TempDir dir;
  const int port = free_tcp_port();
  Job job;
  for (int rank = 0; rank < 3; ++rank) {
    job.pids.push_back(spawn_with({self_exe()}, {{"SLURM_PROCID", std::to_string(rank)},
                                                 {"SLURM_NTASKS", "3"},
                                                 {"SLURM_LOCALID", std::to_string(rank)},
                                                 {"SLURM_JOB_ID", "4242"},
                                                 {"HF_JOB_TOKEN", kSecret},
                                                 {"SLURM_STEP_ID", "0"},
                                                 {"SLURM_LAUNCH_NODE_IPADDR", "127.0.0.1"},
                                                 {"HF_MASTER_PORT", std::to_string(port)},
                                                 {"HF_TEST_LAUNCH_JOB", "pools"},
                                                 {"HF_TEST_POOL_SIZES", "1,1"},
                                                 {"HF_TEST_RESULT", dir.file("result.json")},
                                                 {"OMP_NUM_THREADS", "1"}}));
  }
  job.wait_all(30);
  auto result = read_result(dir.file("result.json"));
  for (int r = 0; r < 3; ++r) EXPECT_EQ(job.code(r), 0) << "rank " << r << "; result " << result.dump();
  ASSERT_FALSE(result.contains("error")) << result.dump();
  EXPECT_EQ(result["z"].get<std::vector<int64_t>>(), expected_z());
  EXPECT_EQ(result["where"]["p0"][0]["launch_rank"], "1");
  EXPECT_EQ(result["where"]["p1"][0]["launch_rank"], "2");
}

TEST(Launch, RankWithAnotherTokenIsIgnoredAndTheJobFailsNamingIt) {
  hybridflow::testing::TempDir dir;
  Job job = start_torchrun_job(3, "pools", "1,1", dir.file("result.json"),
                               {{"HF_TEST_START_TIMEOUT_S", "3"}, {"HF_WORKER_CONNECT_TIMEOUT_S", "4"}},
                               {{2, {{"HF_JOB_TOKEN", "b81e4c07f2a95d36e0c4a7b19f5d2e83"}}}});
  job.wait_all(20);
  auto result = read_result(dir.file("result.json"));
  EXPECT_EQ(job.code(0), 1) << result.dump();
  EXPECT_EQ(job.code(2), 1) << "the stranger gives up after HF_WORKER_CONNECT_TIMEOUT_S";
  const std::string msg = result.value("error", "");
  EXPECT_NE(msg.find("resource pool 'p1'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("launcher rank 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("HF_JOB_TOKEN"), std::string::npos) << msg;
  EXPECT_GT(result.value("rejected", 0), 0) << "the stranger's join pings are counted as rejected";
}

TEST(Launch, PoolsNeedingMoreRanksThanLaunchedIsAnErrorNamingTheNumbers) {
  hybridflow::testing::TempDir dir;
  Job job = start_torchrun_job(3, "pools", "2,1", dir.file("result.json"));
  job.wait_all(20);
  auto result = read_result(dir.file("result.json"));
  const std::string msg = result.value("error", "");
  EXPECT_NE(msg.find("p0 (2) + p1 (1) need 3 worker processes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("2 worker ranks left"), std::string::npos) << msg;
  EXPECT_NE(msg.find("world_size 3"), std::string::npos) << msg;
  EXPECT_EQ(job.code(0), 1);
  // Nothing claimed them: released, not failed.
  EXPECT_EQ(job.code(1), 0);
  EXPECT_EQ(job.code(2), 0);
}

TEST(Launch, WorkerThatDiesFailsTheJobAndTheOtherWorkersExitNonZero) {
  hybridflow::testing::TempDir dir;
  auto t0 = std::chrono::steady_clock::now();
  Job job = start_torchrun_job(3, "crash", "2", dir.file("result.json"), {{"HF_HEARTBEAT_TIMEOUT_S", "1.5"}});
  job.wait_all(20);
  auto result = read_result(dir.file("result.json"));
  EXPECT_LT(seconds_since(t0), 15.0);
  const std::string msg = result.value("error", "");
  EXPECT_NE(msg.find("no heartbeat from worker rank 1 (launcher rank 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("actor.crash"), std::string::npos) << msg;
  EXPECT_EQ(job.code(0), 1);
  EXPECT_EQ(job.code(1), 1) << "the surviving worker is told the job failed";
  EXPECT_EQ(job.code(2), 3) << "the crashed worker's own exit code";
}

TEST(Launch, ControllerThatDiesTakesItsWorkersDownWithinTheHeartbeatTimeout) {
  for (std::string mode : {"die", "die_early"}) {
    SCOPED_TRACE(mode);
    hybridflow::testing::TempDir dir;
    Job job = start_torchrun_job(3, mode, "2", dir.file("result.json"), {{"HF_HEARTBEAT_TIMEOUT_S", "1.5"}});
    auto controller = wait_exit(job.pids[0], 20);
    auto t0 = std::chrono::steady_clock::now();
    job.pids.erase(job.pids.begin());
    job.wait_all(10);
    EXPECT_LT(seconds_since(t0), 1.5 + 2.0) << "workers must notice within the heartbeat timeout";
    EXPECT_EQ(exit_code(controller), mode == "die" ? -SIGKILL : 9);
    EXPECT_EQ(job.code(0), 1);
    EXPECT_EQ(job.code(1), 1);
    if (mode == "die") {
      auto result = read_result(dir.file("result.json"));
      EXPECT_EQ(result["pids"].size(), 2u) << result.dump();
    }
  }
}
