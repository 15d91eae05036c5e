// A launch across "hosts": three network namespaces joined by veth pairs to a bridge (in a fourth,
// switch namespace, so nothing is added to the machine's own network), each with its own address on a
// random 10.x.y.0/24. The ranks start there with torchrun's environment (MASTER_ADDR = the controller
// host's address), and two pools each span two hosts. Needs root; skipped where `ip netns add` fails.
#include "runtime/launch_test_job.h"

#include "support/netns_hosts.h"

TEST(MultiHost, PoolsSpanNetworkNamespacesReachedThroughMasterAddr) {
  const std::string tag = "hf" + std::to_string(::getpid());
  const std::string sw = tag + "-switch";
  const std::vector<std::string> host = {tag + "-a", tag + "-b", tag + "-c"};
  hybridflow::testing::NetnsHosts hosts;
  if (!hosts.add(sw))
    GTEST_SKIP() << "`ip netns add` is not permitted here (needs root and iproute2); multi-host launch not tested";
  std::vector<std::string> addr;
  ASSERT_NO_FATAL_FAILURE(hosts.wire(sw, host, &addr));

  // torchrun places consecutive ranks on a node: host a runs the controller (0) and rank 1, host b
  // ranks 2 and 3, host c rank 4. Pool p0 = ranks 1, 2 (hosts a, b); p1 = ranks 3, 4 (hosts b, c).
  const std::vector<int> host_of_rank = {0, 0, 1, 1, 2};
  const std::vector<int> local_rank = {0, 1, 0, 1, 0};
  hybridflow::testing::TempDir dir;
  Job job;
  for (int rank = 0; rank < 5; ++rank) {
    const int h = host_of_rank[rank];
    job.pids.push_back(spawn_with({"ip", "netns", "exec", host[h], self_exe()},
                                  {{"RANK", std::to_string(rank)},
                                   {"WORLD_SIZE", "5"},
                                   {"LOCAL_RANK", std::to_string(local_rank[rank])},
                                   {"LOCAL_WORLD_SIZE", h == 2 ? "1" : "2"},
                                   {"MASTER_ADDR", addr[0]},
                                   {"MASTER_PORT", "29500"},  // a fresh namespace has every port free
                                   {"HF_JOB_TOKEN", tag + "-secret-4f1c9e27b6a0d385e71c"},
                                   {"HF_TEST_LAUNCH_JOB", "pools"},
                                   {"HF_TEST_POOL_SIZES", "2,2"},
                                   {"HF_TEST_RESULT", dir.file("result.json")},
                                   {"HF_WORKER_CONNECT_TIMEOUT_S", "20"},
                                   {"OMP_NUM_THREADS", "1"}}));
  }
  job.wait_all(30);
  auto result = read_result(dir.file("result.json"));
  for (int r = 0; r < 5; ++r) EXPECT_EQ(job.code(r), 0) << "rank " << r << "; result " << result.dump();
  ASSERT_FALSE(result.contains("error")) << result.dump();
  EXPECT_EQ(result["z"].get<std::vector<int64_t>>(), (std::vector<int64_t>{1, 3, 5, 7, 9, 11}));
  EXPECT_EQ(result["y_rank"].get<std::vector<int64_t>>(), (std::vector<int64_t>{0, 0, 0, 1, 1, 1}));

  char own_ns[128] = {0};
  ASSERT_GT(::readlink("/proc/self/ns/net", own_ns, sizeof(own_ns) - 1), 0);
  std::map<int, nlohmann::json> by_rank;
  for (const char* pool : {"p0", "p1"})
    for (const auto& w : result["where"][pool]) by_rank[std::stoi(w["launch_rank"].get<std::string>())] = w;
  ASSERT_EQ(by_rank.size(), 4u) << result.dump();
  EXPECT_EQ(result["where"]["p0"][0]["launch_rank"], "1");
  EXPECT_EQ(result["where"]["p0"][1]["launch_rank"], "2");
  EXPECT_EQ(result["where"]["p1"][0]["launch_rank"], "3");
  EXPECT_EQ(result["where"]["p1"][1]["launch_rank"], "4");
  for (int rank = 1; rank < 5; ++rank) {
    const auto& w = by_rank[rank];
    EXPECT_EQ(w["addrs"], (nlohmann::json{addr[host_of_rank[rank]]})) << "rank " << rank;
    EXPECT_EQ(w["controller_addr"], addr[0]);
    EXPECT_NE(w["netns"], std::string(own_ns)) << "rank " << rank << " ran outside the test's namespaces";
  }
  // Same host, same namespace; different hosts, different namespaces.
  EXPECT_EQ(by_rank[2]["netns"], by_rank[3]["netns"]);
  EXPECT_NE(by_rank[1]["netns"], by_rank[2]["netns"]);
  EXPECT_NE(by_rank[3]["netns"], by_rank[4]["netns"]);
  EXPECT_NE(by_rank[1]["netns"], by_rank[4]["netns"]);
}
