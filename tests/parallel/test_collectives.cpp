#include "hybridflow/parallel/collectives.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "parallel/rank_processes.h"
#include "hybridflow/core/error.h"
#include "hybridflow/parallel/device_mesh.h"
#include "support/temp_dir.h"

namespace hybridflow {
namespace {

using testing::run_ranks;

ProcessGroup world(int rank, int size, int port, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  return testing::gloo_world(rank, size, port, timeout);
}

at::Tensor rank_tensor(int rank) { return at::arange(4, at::kFloat) + 10.0 * rank; }

TEST(Collectives, WorldOpsValuesAndByteAccounting) {
  run_ranks(3, [](int rank, int port) {
    Communicator comm(world(rank, 3, port));
    ASSERT_EQ(comm.rank(), rank);
    ASSERT_EQ(comm.size(), 3);
    const int64_t bytes = 4 * sizeof(float);
    at::Tensor base = at::arange(4, at::kFloat);

    at::Tensor sum = rank_tensor(rank);
    comm.all_reduce(sum);
    EXPECT_TRUE(at::equal(sum, base * 3 + 30)) << sum;
    at::Tensor max = rank_tensor(rank);
    comm.all_reduce(max, ReduceOp::kMax);
    EXPECT_TRUE(at::equal(max, base + 20));
    at::Tensor avg = rank_tensor(rank);
    comm.all_reduce(avg, ReduceOp::kAvg);
    EXPECT_TRUE(at::allclose(avg, base + 10));

    std::vector<at::Tensor> parts = comm.all_gather(rank_tensor(rank));
    ASSERT_EQ(parts.size(), 3u);
    for (int r = 0; r < 3; ++r) EXPECT_TRUE(at::equal(parts[r], rank_tensor(r)));
    at::Tensor cat = comm.all_gather_cat(rank_tensor(rank).view({2, 2}), 1);
    EXPECT_EQ(cat.sizes(), (at::IntArrayRef{2, 6}));
    EXPECT_TRUE(at::equal(cat.narrow(1, 2 * 2, 2), rank_tensor(2).view({2, 2})));

    at::Tensor b = rank == 1 ? at::full({4}, 7.0f) : at::zeros({4});
    comm.broadcast(b, 1);
    EXPECT_TRUE(at::equal(b, at::full({4}, 7.0f)));

    // reduce_scatter of [6] rows: each rank keeps its 2 rows of the sum.
    at::Tensor rs = comm.reduce_scatter(at::arange(6, at::kFloat) * (rank + 1));
    EXPECT_TRUE(at::equal(rs, at::arange(2 * rank, 2 * rank + 2, at::kFloat) * 6));

    // A ring of send/recv: rank r sends to r+1.
    int next = (rank + 1) % 3, prev = (rank + 2) % 3;
    at::Tensor got = at::zeros({4});
    if (rank % 2 == 0) {
      comm.send(rank_tensor(rank), next, 3);
      comm.recv(got, prev, 3);
    } else {
      comm.recv(got, prev, 3);
      comm.send(rank_tensor(rank), next, 3);
    }
    EXPECT_TRUE(at::equal(got, rank_tensor(prev)));
    comm.barrier();

    auto stats = comm.stats().snapshot();
    EXPECT_EQ(stats["all_reduce"].calls, 3);
    EXPECT_EQ(stats["all_reduce"].bytes, 3 * bytes);
    EXPECT_EQ(stats["all_gather"].calls, 2);
    EXPECT_EQ(stats["all_gather"].bytes, 2 * bytes);
    EXPECT_EQ(stats["broadcast"].bytes, bytes);
    EXPECT_EQ(stats["reduce_scatter"].bytes, static_cast<int64_t>(6 * sizeof(float)));
    EXPECT_EQ(stats["send"].bytes, bytes);
    EXPECT_EQ(stats["recv"].bytes, bytes);
    EXPECT_EQ(stats["barrier"].calls, 1);
    EXPECT_EQ(stats["barrier"].bytes, 0);
    EXPECT_GT(stats["all_reduce"].seconds, 0.0);
    EXPECT_EQ(comm.stats().total_bytes(), 3 * bytes + 2 * bytes + bytes + 6 * 4 + 2 * bytes);
    comm.reset_stats();
    EXPECT_EQ(comm.stats().of("all_reduce").calls, 0);
    EXPECT_EQ(comm.stats().total_bytes(), 0);
  });
}

// 2x2 mesh (dp=2, tp=2): tp groups {0,1},{2,3}, dp groups {0,2},{1,3}, each reducing only its members.
TEST(Collectives, SubGroupsOnTwoByTwoMesh) {
  run_ranks(4, [](int rank, int port) {
    ProcessGroup w = world(rank, 4, port);
    DeviceMesh mesh(1, 2, 2);
    Communicator tp(w.split(mesh.tp_groups()));
    Communicator dp(w.split(mesh.dp_groups()));
    EXPECT_EQ(tp.group().world_ranks(), mesh.tp_group_of(rank));
    EXPECT_EQ(dp.group().world_ranks(), mesh.dp_group_of(rank));
    EXPECT_EQ(tp.rank(), mesh.coords(rank).tp);
    EXPECT_EQ(dp.rank(), mesh.coords(rank).dp);

    auto member_sum = [](const std::vector<int>& members) {
      double s = 0;
      for (int m : members) s += m + 1;
      return s;
    };
    at::Tensor t = at::full({3}, rank + 1.0f);
    tp.all_reduce(t);
    EXPECT_EQ(t[0].item<float>(), member_sum(mesh.tp_group_of(rank)));
    at::Tensor d = at::full({3}, rank + 1.0f);
    dp.all_reduce(d);
    EXPECT_EQ(d[2].item<float>(), member_sum(mesh.dp_group_of(rank)));
    // A second group of the same ranks gets its own store prefix and works independently.
    Communicator tp2(w.new_group(mesh.tp_group_of(rank)));
    std::vector<at::Tensor> parts = tp2.all_gather(at::full({1}, static_cast<float>(rank)));
    for (size_t i = 0; i < parts.size(); ++i) EXPECT_EQ(parts[i].item<float>(), mesh.tp_group_of(rank)[i]);
    EXPECT_EQ(tp.stats().of("all_reduce").bytes, static_cast<int64_t>(3 * sizeof(float)));
    EXPECT_EQ(dp.stats().of("all_gather").calls, 0);
  });
}

TEST(Collectives, MissingPeerTimesOutWithAnError) {
  run_ranks(1, [](int rank, int port) {
    try {
      world(0, 2, port, std::chrono::milliseconds(1500));
      ADD_FAILURE() << "rendezvous without rank 1 should fail";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("rendezvous of rank 0/2"));
    }
  });
}

// The test harness's own rule: a rank whose rendezvous fails (its port taken by another test's processes) makes
// run_ranks start every rank again on another port, rather than fail the test.
TEST(Collectives, RunRanksTriesAFailedRendezvousAgainOnAnotherPort) {
  testing::TempDir dir;
  const std::string log = dir.path() + "/ports", failed_once = dir.path() + "/failed";
  testing::run_ranks(2, [&](int rank, int port) {
    std::ofstream(log, std::ios::app) << rank << " " << port << "\n";
    if (rank == 0 && !std::filesystem::exists(failed_once)) {
      std::ofstream(failed_once) << "x";
      throw Error("process group: rendezvous of rank 0/2 at 127.0.0.1:" + std::to_string(port) + " failed: test");
    }
  });
  EXPECT_FALSE(::testing::Test::HasFailure());
  std::ifstream in(log);
  int rank = 0, port = 0, rank0_runs = 0;
  while (in >> rank >> port) rank0_runs += rank == 0 ? 1 : 0;
  EXPECT_EQ(rank0_runs, 2) << "rank 0 ran once per attempt";
}

TEST(Collectives, ProcessGroupRejectsBadArguments) {
  LaunchEnv env;
  env.rank = 2;
  env.world_size = 2;
  EXPECT_THROW(ProcessGroup::create_world(env), Error);
  ProcessGroupOptions options;
  options.backend = "mpi";
  env.rank = 0;
  EXPECT_THROW(ProcessGroup::create_world(env, options), Error);
  EXPECT_THROW(Communicator{ProcessGroup{}}, Error);
}

// Backend and device are checked before any rendezvous: a mismatch is a configuration error at start,
// not a crash at the first collective.
TEST(Collectives, BackendMustFitTheDevice) {
  LaunchEnv env;
  env.rank = 0;
  env.world_size = 1;
  env.master_port = 1;  // never reached: the options are rejected first
  auto expect_error = [&](const std::string& backend, const std::string& device, const std::string& message) {
    ProcessGroupOptions options;
    options.backend = backend;
    options.device = device;
    try {
      ProcessGroup::create_world(env, options);
      ADD_FAILURE() << backend << " on " << device << " should be rejected";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr(message)) << backend << " on " << device;
    }
  };
  expect_error("nccl", "cpu", "needs CUDA tensors");
  expect_error("gloo", "cuda", "is for CPU tensors");
  expect_error("auto", "tpu", "not one of cpu, cuda");
#ifndef USE_C10D_NCCL
  expect_error("auto", "cuda", "HF_CUDA=1");
#endif
}

}  // namespace
}  // namespace hybridflow
