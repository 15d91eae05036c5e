// Worker groups over real worker processes: this test binary re-executes itself as the workers
// (run_worker_if_requested below), so every check runs the real spawn / ZeroMQ / protocol path.
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <zmq.hpp>

#include "hybridflow/core/error.h"
#include "hybridflow/runtime/controller.h"
#include "hybridflow/runtime/protocol.h"
#include "hybridflow/runtime/worker.h"
#include "hybridflow/runtime/worker_main.h"

using namespace hybridflow;

namespace {

DataProto pid_row(const Worker& w) {
  DataProto d;
  d.set_tensor("pid", torch::full({1}, static_cast<int64_t>(::getpid()), torch::kLong));
  d.set_tensor("rank", torch::full({1}, static_cast<int64_t>(w.rank()), torch::kLong));
  return d;
}

class EchoWorker : public Worker {
 public:
  void register_methods(MethodTable& table) override {
    table.add("double", protocols::kDataParallel, this, &EchoWorker::twice);
    table.add("pid", protocols::kOneToAll, [this](const DataProto&) { return pid_row(*this); });
    table.add("sleep", protocols::kOneToAll, [this](const DataProto& in) {
      std::this_thread::sleep_for(std::chrono::milliseconds(in.meta().value("sleep_ms", 0)));
      return pid_row(*this);
    });
    table.add("crash", protocols::kOneToAll, [this](const DataProto&) {
      if (rank() == 1) ::_exit(3);
      return pid_row(*this);
    });
    table.add("hang", protocols::kOneToAll, [this](const DataProto&) {
      if (rank() == 1) std::this_thread::sleep_for(std::chrono::hours(1));
      return pid_row(*this);
    });
    table.add("fail", protocols::kOneToAll, [this](const DataProto&) -> DataProto {
      if (rank() == 1) HF_FAIL("bad input on purpose");
      return pid_row(*this);
    });
  }

  DataProto twice(const DataProto& in) {
    DataProto out;
    out.set_tensor("y", in.tensor("x") * 2);
    out.set_tensor("rank", torch::full({in.batch_size()}, static_cast<int64_t>(rank()), torch::kLong));
    return out;
  }
};

class PlusOneWorker : public Worker {
 public:
  void register_methods(MethodTable& table) override {
    table.add("add_one", protocols::kDataParallel, [](const DataProto& in) {
      DataProto out;
      out.set_tensor("z", in.tensor("y") + 1);
      return out;
    });
    table.add("pid", protocols::kOneToAll, [this](const DataProto&) { return pid_row(*this); });
  }
};

}  // namespace

HF_REGISTER_WORKER(EchoWorker, "echo");
HF_REGISTER_WORKER(PlusOneWorker, "plus_one");
// In a spawned worker process this serves the controller and exits; in the test process it is a no-op.
static const bool kRanAsWorker = run_worker_if_requested();

namespace {

ResourcePool pool_spec(const std::string& name, int n) {
  ResourcePool spec;
  spec.name = name;
  spec.num_processes = n;
  spec.start_timeout_s = 30;
  spec.call_timeout_s = 30;
  return spec;
}

DataProto batch(int64_t n) {
  DataProto d;
  d.set_tensor("x", torch::arange(n, torch::kFloat));
  return d;
}

std::vector<int64_t> longs(const torch::Tensor& t) {
  auto c = t.contiguous().to(torch::kLong);
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

bool process_gone(int pid) { return ::kill(pid, 0) == -1 && errno == ESRCH; }

std::string message_of(const Future& f) {
  try {
    f.get();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

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

TEST(WorkerGroup, CrashIsReportedWithRoleRankHostAndMethodAndKillsTheRest) {
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

TEST(WorkerGroup, HangPastCallTimeoutIsDetected) {
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

TEST(WorkerGroup, MessageWithWrongTokenIsRejected) {
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

TEST(WorkerGroup, ShutdownLeavesNoProcesses) {
  std::vector<int> pids;
  {
    Controller ctl;
    auto pool = ctl.add_pool(pool_spec("brief", 2));
    pids = pool->pids();
    for (int pid : pids) EXPECT_FALSE(process_gone(pid));
  }
  for (int pid : pids) EXPECT_TRUE(process_gone(pid)) << "worker " << pid << " still exists";
}
