// Transfer protocols as pure functions: which rows each rank receives and which outputs are merged.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <set>
#include <tuple>

#include "hybridflow/core/error.h"
#include "hybridflow/parallel/device_mesh.h"
#include "hybridflow/runtime/protocol.h"

using namespace hybridflow;

namespace {

DataProto rows(int64_t n, int64_t start = 0) {
  DataProto d;
  d.set_tensor("x", torch::arange(start, start + n, torch::kLong));
  std::vector<nlohmann::json> tags;
  for (int64_t i = 0; i < n; ++i) tags.push_back("s" + std::to_string(start + i));
  d.set_field("tag", tags);
  return d;
}

std::vector<int64_t> values(const DataProto& d) {
  auto t = d.tensor("x").contiguous();
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

// Output of rank r: one row holding r, so a collect result names the ranks it came from.
std::vector<DataProto> rank_outputs(int world) {
  std::vector<DataProto> out;
  for (int r = 0; r < world; ++r) out.push_back(rows(1, r));
  return out;
}

}  // namespace

TEST(MeshCoord, CoversEveryCoordinateOnceAndMatchesRankOrder) {
  ParallelLayout layout{2, 2, 1};  // tp 2, pp 2, dp 2, generation tp 1
  auto coords = mesh_coords(8, layout);
  std::set<std::tuple<int, int, int>> seen;
  std::set<int> replicas;
  for (const auto& c : coords) {
    EXPECT_EQ(c.dp_size, 2);
    EXPECT_EQ((c.pp * c.dp_size + c.dp) * c.tp_size + c.tp, c.rank);
    EXPECT_EQ(c.micro_dp_local, 0);  // generation tp 1: every rank is a replica of its own
    EXPECT_EQ(c.micro_dp_size, 8);
    seen.insert({c.dp, c.tp, c.pp});
    replicas.insert(c.micro_dp);
  }
  EXPECT_EQ(seen.size(), 8u);
  EXPECT_EQ(replicas.size(), 8u);
  // tp 4, dp 2, generation tp 2 (the paper's Figure 8b): rank 5 = dp 1, tp 1 is in replica {5, 7}.
  auto gen = mesh_coord_of(5, 8, ParallelLayout{4, 1, 2});
  EXPECT_EQ(gen.micro_dp, 3);
  EXPECT_EQ(gen.micro_dp_local, 0);
  EXPECT_EQ(gen.micro_dp_size, 4);
}

// One rank ordering across layers: the coordinates the protocols use are dist's, and a rollout
// replica (same micro_dp) is exactly one of dist's generation tp groups, led by its gen-tp rank 0.
TEST(MeshCoord, AgreesWithDistMeshAndGenerationLayout) {
  for (int pp : {1, 2})
    for (int dp : {1, 2, 3})
      for (int tp : {1, 2, 4})
        for (int gen_tp : {1, 2, 4}) {
          if (tp % gen_tp) continue;
          SCOPED_TRACE(::testing::Message() << "pp " << pp << " dp " << dp << " tp " << tp << " gen_tp " << gen_tp);
          const DeviceMesh mesh(pp, dp, tp);
          const GenerationLayout generation(mesh, gen_tp, 1);
          const auto coords = mesh_coords(mesh.world_size(), ParallelLayout{tp, pp, gen_tp});
          std::vector<std::vector<int>> replicas(generation.gen_dp());
          for (const auto& c : coords) {
            const MeshCoords t = mesh.coords(c.rank);
            EXPECT_EQ(std::make_tuple(c.pp, c.dp, c.tp), std::make_tuple(t.pp, t.dp, t.tp));
            EXPECT_EQ(c.dp_size, dp);
            EXPECT_EQ(c.micro_dp_size, generation.gen_dp());
            EXPECT_EQ(c.micro_dp, generation.coords(c.rank).dp);
            EXPECT_EQ(c.micro_dp_local, generation.coords(c.rank).tp);
            replicas[c.micro_dp].push_back(c.rank);
          }
          // Replica i is generation dp rank i; dist lists its groups by lowest rank instead.
          auto groups = generation.gen_tp_groups();
          std::sort(groups.begin(), groups.end());
          auto by_replica = replicas;
          std::sort(by_replica.begin(), by_replica.end());
          EXPECT_EQ(by_replica, groups);
          for (const auto& replica : replicas) EXPECT_EQ(coords[replica[0]].micro_dp_local, 0);
        }
}

TEST(MeshCoord, RejectsLayoutThatDoesNotDivideWorld) {
  try {
    mesh_coord_of(0, 6, ParallelLayout{4, 1, 0});
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of tp (4)"), std::string::npos) << e.what();
  }
}

TEST(Protocol, DataParallelChunksByRankAndConcatsInOrder) {
  auto coords = mesh_coords(4, {});
  auto parts = dispatch_input(protocols::kDataParallel, rows(8), coords);
  ASSERT_EQ(parts.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(values(parts[r]), (std::vector<int64_t>{2 * r, 2 * r + 1}));
    EXPECT_EQ(parts[r].field("tag")[0], "s" + std::to_string(2 * r));
  }
  auto merged = collect_outputs(protocols::kDataParallel, parts, coords);
  EXPECT_EQ(values(merged), values(rows(8)));
}

TEST(Protocol, DataParallelUnevenBatchSaysHowToPad) {
  try {
    dispatch_input(protocols::kDataParallel, rows(7), mesh_coords(2, {}));
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("padded_to_multiple(2"), std::string::npos) << e.what();
  }
}

TEST(Protocol, OneToAllBroadcastsAndGathersEveryRank) {
  auto coords = mesh_coords(3, {});
  auto parts = dispatch_input(protocols::kOneToAll, rows(5), coords);
  for (const auto& p : parts) EXPECT_EQ(values(p), values(rows(5)));
  EXPECT_EQ(values(collect_outputs(protocols::kOneToAll, rank_outputs(3), coords)), (std::vector<int64_t>{0, 1, 2}));
}

TEST(Protocol, ThreeDSplitsByDpAndCollectsFromLastStageTpZero) {
  auto coords = mesh_coords(8, ParallelLayout{2, 2, 0});  // dp 2
  auto parts = dispatch_input(protocols::k3D, rows(4), coords);
  for (const auto& c : coords)
    EXPECT_EQ(values(parts[c.rank]), (std::vector<int64_t>{2 * c.dp, 2 * c.dp + 1})) << "rank " << c.rank;
  std::vector<int64_t> expected;  // the source rank of each dp group, in dp order
  for (int dp = 0; dp < 2; ++dp)
    for (const auto& c : coords)
      if (c.dp == dp && c.pp == 1 && c.tp == 0) expected.push_back(c.rank);
  ASSERT_EQ(expected.size(), 2u);
  EXPECT_EQ(values(collect_outputs(protocols::k3D, rank_outputs(8), coords)), expected);
}

TEST(Protocol, MicroDpSplitsByRolloutReplicaAndCollectsLocalRankZero) {
  auto coords = mesh_coords(4, ParallelLayout{4, 1, 2});  // two rollout replicas: ranks {0, 2} and {1, 3}
  auto parts = dispatch_input(protocols::k3DAllMicroDP, rows(6), coords);
  EXPECT_EQ(values(parts[0]), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(values(parts[2]), values(parts[0]));
  EXPECT_EQ(values(parts[1]), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(values(parts[3]), values(parts[1]));
  EXPECT_EQ(values(collect_outputs(protocols::k3DAllMicroDP, rank_outputs(4), coords)),
            (std::vector<int64_t>{0, 1}));
}

TEST(Protocol, AllToAllPassesThroughWithoutMerging) {
  auto coords = mesh_coords(2, {});
  auto parts = dispatch_input(protocols::kAllToAll, rows(3), coords);
  for (const auto& p : parts) EXPECT_EQ(values(p), values(rows(3)));
  EXPECT_TRUE(collect_outputs(protocols::kAllToAll, rank_outputs(2), coords).empty());
}

TEST(Protocol, NewProtocolIsOneRegistration) {
  // Every rank gets the input reversed; collect keeps only the last rank's output.
  ProtocolRegistry::instance().add(
      "TEST_REVERSED_LAST",
      {[](const DataProto& in, const std::vector<MeshCoord>& coords) {
         auto idx = torch::arange(in.batch_size() - 1, -1, -1, torch::kLong);
         return std::vector<DataProto>(coords.size(), in.index_select(idx));
       },
       [](const std::vector<DataProto>& outs, const std::vector<MeshCoord>&) { return outs.back(); }});
  auto coords = mesh_coords(2, {});
  auto parts = dispatch_input("TEST_REVERSED_LAST", rows(3), coords);
  EXPECT_EQ(values(parts[1]), (std::vector<int64_t>{2, 1, 0}));
  EXPECT_EQ(values(collect_outputs("TEST_REVERSED_LAST", rank_outputs(2), coords)), (std::vector<int64_t>{1}));
  EXPECT_THROW(ProtocolRegistry::instance().add("TEST_REVERSED_LAST", {}), Error);
}

// dispatch_row_chunks says how many consecutive equal chunks each splitting protocol's dispatch cuts (what
// trainer.balance_batch arranges rows for): chunk k holds rows [k x rows / chunks, (k + 1) x rows / chunks).
// Protocols that do not cut rows, a registered one included, count 1.
TEST(Protocol, RowChunksAreTheChunksDispatchCuts) {
  const struct {
    const char* protocol;
    int world;
    ParallelLayout layout;
    int chunks;
  } cases[] = {{protocols::kDataParallel, 4, {}, 4},
               {protocols::k3D, 8, ParallelLayout{2, 2, 0}, 2},
               {protocols::k3DAllMicroDP, 4, ParallelLayout{4, 1, 2}, 2}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.protocol);
    const auto coords = mesh_coords(c.world, c.layout);
    const int chunks = dispatch_row_chunks(c.protocol, coords);
    EXPECT_EQ(chunks, c.chunks);
    const int64_t n = 12, per = n / chunks;
    const auto parts = dispatch_input(c.protocol, rows(n), coords);
    std::set<std::vector<int64_t>> seen;
    for (const auto& part : parts) {
      const auto v = values(part);
      ASSERT_EQ(static_cast<int64_t>(v.size()), per);
      EXPECT_EQ(v.front() % per, 0);  // starts a chunk
      for (size_t i = 1; i < v.size(); ++i) EXPECT_EQ(v[i], v[i - 1] + 1);
      seen.insert(v);
    }
    EXPECT_EQ(static_cast<int>(seen.size()), chunks);
  }
  ProtocolRegistry::instance().add("TEST_WHOLE_ROWS",
                                   {[](const DataProto& in, const std::vector<MeshCoord>& coords) {
                                      return std::vector<DataProto>(coords.size(), in);
                                    },
                                    [](const std::vector<DataProto>& outs, const std::vector<MeshCoord>&) {
                                      return outs.front();
                                    }});
  for (const char* whole : {protocols::kOneToAll, protocols::kAllToAll, "TEST_WHOLE_ROWS"})
    EXPECT_EQ(dispatch_row_chunks(whole, mesh_coords(2, {})), 1) << whole;
}

TEST(Protocol, UnknownProtocolNamesTheRegisteredOnes) {
  try {
    dispatch_input("NOPE", rows(2), mesh_coords(1, {}));
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DP_PROTO"), std::string::npos) << e.what();
  }
}

TEST(Protocol, MetaOnlyInputReachesEveryRank) {
  DataProto settings;
  settings.meta()["temperature"] = 0.5;
  for (const char* protocol : {protocols::kDataParallel, protocols::k3D, protocols::k3DAllMicroDP}) {
    auto parts = dispatch_input(protocol, settings, mesh_coords(4, ParallelLayout{2, 1, 2}));
    ASSERT_EQ(parts.size(), 4u);
    for (const auto& p : parts) EXPECT_EQ(p.meta().value("temperature", 0.0), 0.5) << protocol;
  }
}
