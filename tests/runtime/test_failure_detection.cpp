// Failure handling over real worker processes: crashes, hangs, silent workers, forged messages,
// and that no worker process outlives its job (shutdown, Ctrl-C, uncaught error).
#include <algorithm>

#include "runtime/runtime_test_workers.h"

TEST(FailureDetection, CrashIsReportedWithRoleRankHostAndMethodAndKillsTheRest) {
  Controller ctl;
  auto pool = ctl.add_pool(pool_spec("crashy", 2));
  auto group = ctl.create_group("crashy", "actor", "echo");
  auto pids = pool->pids();
  std::string msg = message_of(group.call("crash"));
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("exited with code 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("actor.crash"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::string("host ") + host), std::string::npos) << msg;
  EXPECT_TRUE(pool->failed());
  for (int pid : pids) EXPECT_TRUE(process_gone(pid)) << "worker " << pid << " still exists";
  EXPECT_NE(message_of(group.call("pid")).find("failed earlier"), std::string::npos);
}

TEST(FailureDetection, HangPastCallTimeoutIsDetected) {
  Controller ctl;
  auto spec = pool_spec("hangs", 2);
  spec.call_timeout_s = 0.5;
  auto pool = ctl.add_pool(spec);
  auto group = ctl.create_group("hangs", "critic", "echo");
  auto pids = pool->pids();
  auto t0 = std::chrono::steady_clock::now();
  std::string msg = message_of(group.call("hang"));
  EXPECT_LT(seconds_since(t0), 3.0);
  EXPECT_NE(msg.find("critic.hang"), std::string::npos) << msg;
  EXPECT_NE(msg.find("timed out"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("rank 0"), std::string::npos) << "rank 0 finished: " << msg;
  for (int pid : pids) EXPECT_TRUE(process_gone(pid)) << "worker " << pid << " still exists";
}

TEST(FailureDetection, AFailedPoolIsRestartedWithNewWorkersThatServeAgain) {
  Controller ctl;
  auto pool = ctl.add_pool(pool_spec("phoenix", 2));
  auto group = ctl.create_group("phoenix", "actor", "echo");
  EXPECT_FALSE(pool->wait_failed());
  const std::vector<int> old_pids = pool->pids();
  ::kill(old_pids[0], SIGKILL);
  const std::string msg = message_of(group.call("hang"));  // failed by the death, not by a timeout
  EXPECT_NE(msg.find("killed by signal 9"), std::string::npos) << msg;
  EXPECT_TRUE(pool->wait_failed());
  for (int pid : old_pids) EXPECT_TRUE(process_gone(pid)) << "worker " << pid << " still exists";
  auto fresh = ctl.restart_pool("phoenix");
  EXPECT_EQ(ctl.pool("phoenix"), fresh);
  EXPECT_TRUE(pool->failed());  // the old handle stays failed; the new pool is another
  EXPECT_FALSE(fresh->wait_failed());
  const std::vector<int> new_pids = fresh->pids();
  for (int pid : new_pids) EXPECT_EQ(std::count(old_pids.begin(), old_pids.end(), pid), 0) << pid;
  auto again = ctl.create_group("phoenix", "actor", "echo");
  EXPECT_EQ(longs(again.call("pid").get().tensor("pid")), (std::vector<int64_t>{new_pids[0], new_pids[1]}));
  EXPECT_NE(message_of(group.call("pid")).find("failed earlier"), std::string::npos);  // the old group's pool
}

TEST(FailureDetection, MessageWithWrongTokenIsRejected) {
  Controller ctl;
  auto pool = ctl.add_pool(pool_spec("guarded", 1));
  auto group = ctl.create_group("guarded", "actor", "echo");
  DataProto sleep;
  sleep.meta()["sleep_ms"] = 300;
  Future genuine = group.call("sleep", sleep);

  // An intruder that knows the endpoint but not the job token forges replies for every plausible
  // call id while the genuine call is running. (ZeroMQ itself refuses a second peer reusing a
  // worker's identity, so the token is what stands between a stranger and the results.)
  zmq::context_t context(1);
  zmq::socket_t intruder(context, zmq::socket_type::dealer);
  intruder.set(zmq::sockopt::linger, 0);
  intruder.set(zmq::sockopt::routing_id, "intruder");
  intruder.connect(pool->endpoint());
  for (int id = 0; id < 5; ++id) {
    std::string meta = "{\"call_id\":" + std::to_string(id) + "}";
    intruder.send(zmq::buffer(std::string("not-the-token")), zmq::send_flags::sndmore);
    intruder.send(zmq::buffer(std::string("result")), zmq::send_flags::sndmore);
    intruder.send(zmq::buffer(meta), zmq::send_flags::none);
  }
  auto t0 = std::chrono::steady_clock::now();
  while (pool->rejected_messages() < 5 && seconds_since(t0) < 5)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(pool->rejected_messages(), 5u);
  EXPECT_EQ(longs(genuine.get().tensor("pid")), (std::vector<int64_t>{pool->pids()[0]}));
  EXPECT_FALSE(pool->failed());
}

TEST(FailureDetection, ShutdownLeavesNoProcesses) {
  std::vector<int> pids;
  {
    Controller ctl;
    auto pool = ctl.add_pool(pool_spec("brief", 2));
    pids = pool->pids();
    for (int pid : pids) EXPECT_FALSE(process_gone(pid));
  }
  for (int pid : pids) EXPECT_TRUE(process_gone(pid)) << "worker " << pid << " still exists";
}

TEST(FailureDetection, SilentWorkerIsDetectedByMissingHeartbeats) {
  Controller ctl;
  auto spec = pool_spec("quiet", 2);
  spec.heartbeat_timeout_s = 0.8;
  auto pool = ctl.add_pool(spec);
  auto pids = pool->pids();
  ::kill(pids[1], SIGSTOP);  // alive for waitpid, but silent
  auto t0 = std::chrono::steady_clock::now();
  while (!pool->failed() && seconds_since(t0) < 5) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_NE(pool->failure().find("no heartbeat from worker rank 1"), std::string::npos) << pool->failure();
  for (int pid : pids) EXPECT_TRUE(process_gone(pid)) << "worker " << pid << " still exists";
}

TEST(FailureDetection, InterruptedJobTakesItsWorkersWithIt) {
  hybridflow::testing::TempDir dir;
  auto [job, workers] = start_job("sigint", dir.file("pids"));
  ASSERT_EQ(workers.size(), 2u);
  for (int pid : workers) EXPECT_FALSE(process_gone(pid));
  ::kill(job, SIGINT);
  int status = 0;
  ASSERT_EQ(::waitpid(job, &status, 0), job);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT) << "status " << status;
  EXPECT_TRUE(all_gone_within(workers, 3.0));
}

TEST(FailureDetection, JobWithUncaughtWorkerCrashExitsNonZeroAndLeavesNoWorkers) {
  hybridflow::testing::TempDir dir;
  auto [job, workers] = start_job("crash", dir.file("pids"));
  ASSERT_EQ(workers.size(), 2u);
  int status = 0;
  ASSERT_EQ(::waitpid(job, &status, 0), job);
  EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  EXPECT_TRUE(all_gone_within(workers, 3.0));
}
