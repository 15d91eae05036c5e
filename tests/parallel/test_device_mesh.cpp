#include "hybridflow/parallel/device_mesh.h"

#include <gtest/gtest.h>

#include <set>

#include "hybridflow/core/error.h"

namespace hybridflow {
namespace {

using Groups = std::vector<std::vector<int>>;

// Every rank in exactly one group, all groups of the expected size.
void expect_partition(const Groups& groups, int world, int group_size) {
  std::vector<int> seen(world, 0);
  for (const auto& g : groups) {
    EXPECT_EQ(static_cast<int>(g.size()), group_size);
    for (int r : g) {
      ASSERT_GE(r, 0);
      ASSERT_LT(r, world);
      ++seen[r];
    }
  }
  for (int r = 0; r < world; ++r) EXPECT_EQ(seen[r], 1) << "rank " << r;
}

TEST(DeviceMesh, RankOrderIsTpFastestThenDpThenPp) {
  DeviceMesh mesh(2, 3, 4);
  EXPECT_EQ(mesh.world_size(), 24);
  int rank = 0;
  for (int pp = 0; pp < 2; ++pp)
    for (int dp = 0; dp < 3; ++dp)
      for (int tp = 0; tp < 4; ++tp, ++rank) {
        MeshCoords c = mesh.coords(rank);
        EXPECT_EQ(c.pp, pp);
        EXPECT_EQ(c.dp, dp);
        EXPECT_EQ(c.tp, tp);
        EXPECT_EQ(mesh.rank_of(c), rank);
      }
  EXPECT_THROW(mesh.coords(24), Error);
  EXPECT_THROW(DeviceMesh(0, 1, 1), Error);
}

TEST(DeviceMesh, GroupsPartitionTheWorldAlongEachDimension) {
  for (auto [pp, dp, tp] : std::vector<std::tuple<int, int, int>>{{1, 1, 1}, {2, 2, 2}, {3, 2, 4}, {1, 4, 1}}) {
    DeviceMesh mesh(pp, dp, tp);
    int world = mesh.world_size();
    expect_partition(mesh.tp_groups(), world, tp);
    expect_partition(mesh.dp_groups(), world, dp);
    expect_partition(mesh.pp_groups(), world, pp);
    expect_partition(mesh.model_parallel_groups(), world, tp * pp);
    for (const auto& group : mesh.model_parallel_groups())  // member j * tp + i is stage j's tensor rank i
      for (size_t m = 0; m < group.size(); ++m) {
        EXPECT_EQ(mesh.coords(group[m]).pp, static_cast<int>(m) / tp);
        EXPECT_EQ(mesh.coords(group[m]).tp, static_cast<int>(m) % tp);
        EXPECT_EQ(mesh.coords(group[m]).dp, mesh.coords(group[0]).dp);
      }
    for (int r = 0; r < world; ++r) {
      MeshCoords c = mesh.coords(r);
      for (int m : mesh.tp_group_of(r)) {
        EXPECT_EQ(mesh.coords(m).pp, c.pp);
        EXPECT_EQ(mesh.coords(m).dp, c.dp);
      }
      for (int m : mesh.dp_group_of(r)) {
        EXPECT_EQ(mesh.coords(m).pp, c.pp);
        EXPECT_EQ(mesh.coords(m).tp, c.tp);
      }
      for (int m : mesh.pp_group_of(r)) {
        EXPECT_EQ(mesh.coords(m).dp, c.dp);
        EXPECT_EQ(mesh.coords(m).tp, c.tp);
      }
    }
  }
  DeviceMesh mesh(2, 2, 2);
  EXPECT_EQ(mesh.tp_groups(), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(mesh.dp_groups(), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(mesh.pp_groups(), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(mesh.model_parallel_groups(), (Groups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
}

// HybridFlow paper Figure 8(b): 8 GPUs, training tp=4 dp=2, generation tp=2 (micro_dp=2, dp_g=4).
TEST(GenerationLayout, PaperFigure8) {
  GenerationLayout layout(DeviceMesh(1, 2, 4), 2, 1);
  EXPECT_EQ(layout.micro_dp(), 2);
  EXPECT_EQ(layout.gen_dp(), 4);
  EXPECT_EQ(layout.micro_dp_groups(), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(layout.gen_tp_groups(), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(layout.gen_tp_group_of(1), (std::vector<int>{1, 3}));
  EXPECT_EQ(layout.micro_dp_group_of(5), (std::vector<int>{4, 5}));
}

TEST(GenerationLayout, RejectsNonDividingSizes) {
  EXPECT_THROW(GenerationLayout(DeviceMesh(1, 1, 4), 3, 1), Error);
  EXPECT_THROW(GenerationLayout(DeviceMesh(2, 1, 4), 2, 4), Error);
}

// The 3D-HybridEngine invariants, for many layouts: groups partition the world with the right sizes, each
// rank's generation shard contains its training shard, and a micro-DP group's training shards tile its
// generation shard exactly (so one all-gather inside the group suffices and nothing is held twice).
TEST(GenerationLayout, ShardsNestAndMicroDpGroupsTileGenerationShards) {
  for (int p : {1, 2, 4})
    for (int d : {1, 2, 3})
      for (int t : {1, 2, 4, 8})
        for (int tg = 1; tg <= t; ++tg) {
          if (t % tg) continue;
          for (int pg = 1; pg <= p; ++pg) {
            if (p % pg) continue;
            DeviceMesh mesh(p, d, t);
            GenerationLayout layout(mesh, tg, pg);
            int world = mesh.world_size();
            int micro = layout.micro_dp();
            ASSERT_EQ(micro, (t * p) / (tg * pg));
            ASSERT_EQ(layout.gen_dp() * tg * pg, world);
            expect_partition(layout.micro_dp_groups(), world, micro);
            expect_partition(layout.gen_tp_groups(), world, tg);
            expect_partition(layout.gen_pp_groups(), world, pg);
            expect_partition(layout.gen_dp_groups(), world, layout.gen_dp());
            std::set<std::tuple<int, int, int>> gen_coords;
            for (int r = 0; r < world; ++r) {
              MeshCoords tc = mesh.coords(r);
              GenCoords gc = layout.coords(r);
              EXPECT_EQ(layout.rank_of(gc), r);
              EXPECT_TRUE(gen_coords.insert({gc.pp, gc.dp, gc.tp}).second);
              // Training tp slice [tc.tp/t, (tc.tp+1)/t) lies in generation slice [gc.tp/tg, (gc.tp+1)/tg).
              EXPECT_LE(gc.tp * t, tc.tp * tg);
              EXPECT_GE((gc.tp + 1) * t, (tc.tp + 1) * tg);
              EXPECT_LE(gc.pp * p, tc.pp * pg);
              EXPECT_GE((gc.pp + 1) * p, (tc.pp + 1) * pg);
              // Micro-DP group members: same training dp replica and same generation shard, distinct
              // training shards, ordered by micro_dp_rank.
              std::vector<int> group = layout.micro_dp_group_of(r);
              std::set<std::pair<int, int>> shards;
              for (size_t i = 0; i < group.size(); ++i) {
                MeshCoords mc = mesh.coords(group[i]);
                GenCoords mg = layout.coords(group[i]);
                EXPECT_EQ(mc.dp, tc.dp);
                EXPECT_EQ(mg.tp, gc.tp);
                EXPECT_EQ(mg.pp, gc.pp);
                EXPECT_EQ(mg.micro_dp_rank, static_cast<int>(i));
                shards.insert({mc.pp, mc.tp});
              }
              EXPECT_EQ(static_cast<int>(shards.size()), micro);
              // Generation tp group members share generation dp and pp.
              for (int m : layout.gen_tp_group_of(r)) {
                EXPECT_EQ(layout.coords(m).dp, gc.dp);
                EXPECT_EQ(layout.coords(m).pp, gc.pp);
              }
            }
          }
        }
}

}  // namespace
}  // namespace hybridflow
