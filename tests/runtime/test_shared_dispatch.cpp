// A call's big tensors reach workers on the controller's machine through sealed memory files (the
// transport's shared frames): the results are bit for bit those of the tensors themselves, a method may
// write its input without touching the controller's, and no file outlives its call, not even one whose
// worker was killed. /dev/shm is left as it was.
#include "runtime/runtime_test_workers.h"
#include "transport/shared_memory_test_support.h"

using namespace hybridflow::transport_testing;

namespace {

// Waits (the pool's I/O thread closes the files) until this process holds `n` shared-memory files.
bool memfds_become(int n, double seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  while (open_shared_memory_files() != n && seconds_since(t0) < seconds)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return open_shared_memory_files() == n;
}

// The same, with the count held at `n` for `stable_ms` in a row: a count passing through `n` on its way elsewhere
// (the ranks' files are made one after another, and one may close before the next is made) is not it.
bool memfds_settle_at(int n, double seconds, int stable_ms) {
  const auto t0 = std::chrono::steady_clock::now();
  auto since = t0;
  bool at_n = false;
  while (seconds_since(t0) < seconds) {
    if (open_shared_memory_files() != n) {
      at_n = false;
    } else if (!at_n) {
      at_n = true;
      since = std::chrono::steady_clock::now();
    } else if (seconds_since(since) * 1000.0 >= stable_ms) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

}  // namespace

TEST(SharedDispatch, ShardsAreDecodedBitForBitAndEachFileClosesWithItsReply) {
  const auto shm_before = dev_shm_names();
  const int before = open_shared_memory_files();
  Controller ctl;
  auto pool = ctl.add_pool(pool_spec("shm", 2));
  auto group = ctl.create_group("shm", "actor", "echo");
  torch::manual_seed(3);
  DataProto input;
  input.set_tensor("x", torch::randn({1 << 20}));  // 4 MiB: 2 MiB a rank
  const DataProto out = group.call("double", input).get();
  EXPECT_TRUE(same_bytes(out.tensor("y"), input.tensor("x") * 2));
  EXPECT_TRUE(memfds_become(before, 5.0));

  // While a call runs, each rank's file is open; it closes with the reply.
  DataProto sleepy = input;
  sleepy.meta()["sleep_ms"] = 500;
  Future running = group.call("sleep", sleepy);
  EXPECT_TRUE(memfds_become(before + 2, 0.4)) << open_shared_memory_files() - before << " files while the call runs";
  running.get();
  EXPECT_TRUE(memfds_become(before, 5.0));

  // A method writing into its input changes its own copy, never the controller's tensor.
  auto probe_pool = ctl.add_pool(pool_spec("shm_probe", 2));
  auto probes = ctl.create_group("shm_probe", "actor", "rank_probe");
  const torch::Tensor original = input.tensor("x").clone();
  Future scribbled = probes.call("scribble", input);
  scribbled.wait();
  EXPECT_TRUE(same_bytes(input.tensor("x"), original));
  for (const auto& out : scribbled.per_rank())
    EXPECT_TRUE(same_bytes(out.tensor("x"), (original + 1).reshape({1, -1})));
  EXPECT_TRUE(memfds_become(before, 5.0));
  EXPECT_EQ(dev_shm_names(), shm_before);
}

TEST(SharedDispatch, AKilledWorkersFileCloses) {
  const int before = open_shared_memory_files();
  Controller ctl;
  auto pool = ctl.add_pool(pool_spec("shm_killed", 2));
  auto group = ctl.create_group("shm_killed", "actor", "echo");
  DataProto input;
  input.set_tensor("x", torch::randn({1 << 19}));  // 2 MiB, to both ranks
  Future hanging = group.call("hang", input);  // rank 0 answers, rank 1 does not
  // Rank 0's file closes with its reply and rank 1's stays open. Counted as it passes, before + 1 may be the
  // moment rank 0's file was made and rank 1's not yet (CI saw that once): the count must hold there.
  ASSERT_TRUE(memfds_settle_at(before + 1, 10.0, 200)) << open_shared_memory_files() - before << " files";
  ::kill(pool->pids().at(1), SIGKILL);
  EXPECT_NE(message_of(hanging).find("rank 1"), std::string::npos);
  EXPECT_TRUE(memfds_become(before, 5.0)) << open_shared_memory_files() - before << " files left";
}
