// The job of launch_test_job.h under a real `mpirun -np 3`: rank 0 controls, ranks 1 and 2 serve one
// pool each; the job secret is forwarded with -x HF_JOB_TOKEN, as a user would.
#include "runtime/launch_test_job.h"

namespace {

std::string find_mpirun() {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');)
    if (!dir.empty() && ::access((dir + "/mpirun").c_str(), X_OK) == 0) return dir + "/mpirun";
  return "";
}

// mpirun forwards only the variables named with -x.
Job start_mpirun_job(const std::string& mpirun, const std::string& mode, const std::string& sizes,
                     const std::string& result) {
  std::vector<std::string> args = {mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "3"};
  for (std::string kv : {"HF_TEST_LAUNCH_JOB=" + mode, "HF_TEST_POOL_SIZES=" + sizes, "HF_TEST_RESULT=" + result,
                         std::string("MASTER_ADDR=127.0.0.1"), "MASTER_PORT=" + std::to_string(free_tcp_port()),
                         std::string("OMP_NUM_THREADS=1"), std::string("OMP_WAIT_POLICY=passive"),
                         std::string("HF_JOB_TOKEN=mpirun-test-9c4e1a7f3b20d6e58f1a")}) {
    args.push_back("-x");
    args.push_back(kv);
  }
  args.push_back(self_exe());
  Job job;
  job.pids.push_back(spawn_with(args, {}));
  return job;
}

}  // namespace

TEST(Mpirun, ThreeRanksRunAJobOnTwoPools) {
  const std::string mpirun = find_mpirun();
  if (mpirun.empty()) GTEST_SKIP() << "mpirun not found on PATH (OpenMPI is installed by scripts/setup.sh)";
  hybridflow::testing::TempDir dir;
  Job job = start_mpirun_job(mpirun, "pools", "1,1", dir.file("result.json"));
  job.wait_all(40);
  auto result = read_result(dir.file("result.json"));
  EXPECT_EQ(job.code(0), 0) << result.dump();
  ASSERT_FALSE(result.contains("error")) << result.dump();
  EXPECT_EQ(result["z"].get<std::vector<int64_t>>(), (std::vector<int64_t>{1, 3, 5, 7, 9, 11}));
  const auto& p0 = result["where"]["p0"];
  const auto& p1 = result["where"]["p1"];
  ASSERT_EQ(p0.size(), 1u);
  ASSERT_EQ(p1.size(), 1u);
  EXPECT_EQ(p0[0]["launch_rank"], "1");
  EXPECT_EQ(p1[0]["launch_rank"], "2");
  EXPECT_NE(p0[0]["pid"], p1[0]["pid"]);
  EXPECT_EQ(result["mark"]["p1"], (nlohmann::json{"12"}));
  EXPECT_EQ(result["not_allowed"]["p1"], (nlohmann::json{nullptr})) << "only allowed keys are applied";
}

TEST(Mpirun, ControllerErrorFailsTheWholeLaunch) {
  const std::string mpirun = find_mpirun();
  if (mpirun.empty()) GTEST_SKIP() << "mpirun not found on PATH (OpenMPI is installed by scripts/setup.sh)";
  hybridflow::testing::TempDir dir;
  Job job = start_mpirun_job(mpirun, "pools", "1,2", dir.file("result.json"));
  job.wait_all(40);
  auto result = read_result(dir.file("result.json"));
  EXPECT_NE(result.value("error", "").find("need 3 worker processes"), std::string::npos) << result.dump();
  EXPECT_NE(job.code(0), 0) << "mpirun must report the controller's failure";
  EXPECT_NE(job.code(0), -1000) << "mpirun hung";
}
