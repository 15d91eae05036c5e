// The weight sync to a standalone rollout pool (engine/weight_sync.h). The plan: for actor and rollout
// layouts of every shape here, each rollout rank receives exactly its generation shard of every weight, no
// element twice, each piece from an actor rank of the data-parallel replica and pipeline stage that holds it;
// buckets keep to their size. Then real transfers over Gloo between three processes: a 2-way split actor to
// an unsplit rollout, and an unsplit actor to a 2-way split rollout in bf16, in buckets of a few kilobytes:
// the rollout ends with the actor's weights bit for bit (cast once for bf16).
#include "hybridflow/engine/weight_sync.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <set>

#include "engine/tensor_parallel_fixture.h"
#include "hybridflow/core/platform.h"
#include "hybridflow/model/pipeline_layout.h"
#include "hybridflow/model/tensor_parallel_layout.h"
#include "parallel/rank_processes.h"

namespace hybridflow {
namespace {

using namespace hybridflow::testing;

std::map<std::string, std::vector<int64_t>> full_shapes_of(const ModelConfig& config) {
  seed_cpu_generator(0);
  CausalLM model(config, HeadKind::kLanguageModel);
  return full_weight_shapes(model, 1);
}

void expect_plan_covers_every_shard(const ModelConfig& config, const WeightSyncLayout& l) {
  const std::string what = "actor tp" + std::to_string(l.actor_tp) + " dp" + std::to_string(l.actor_dp) + " pp" +
                           std::to_string(l.actor_pp) + " -> rollout tp" + std::to_string(l.rollout_tp) + " x" +
                           std::to_string(l.rollout_replicas);
  const auto shapes = full_shapes_of(config);
  const auto plan = weight_sync_plan(shapes, config, l);
  // (dst, name) -> covered interval lengths along the split axis (or whole-tensor copies).
  std::map<std::pair<int, std::string>, int64_t> numel;
  std::set<std::tuple<int, std::string, int64_t>> starts;
  for (const WeightPiece& p : plan) {
    SCOPED_TRACE(what + " " + p.name);
    ASSERT_GE(p.dst, l.actor_world());
    ASSERT_LT(p.src, l.actor_world());
    const int replica = (p.dst - l.actor_world()) / l.rollout_tp;
    const int src_tp = p.src % l.actor_tp, src_dp = (p.src / l.actor_tp) % l.actor_dp, src_pp = p.src / (l.actor_tp * l.actor_dp);
    EXPECT_EQ(src_dp, replica % l.actor_dp) << "rollout replica r reads actor replica r % d";
    EXPECT_EQ(src_pp, owning_stage(p.name, config, l.actor_pp)) << "from the stage that owns the weight";
    if (p.axis >= 0 && shard_dim(p.name, config, l.actor_tp) != ShardDim::kReplicated) {
      const int64_t per = shapes.at(p.name)[p.axis] / l.actor_tp;
      EXPECT_GE(p.begin, src_tp * per);
      EXPECT_LE(p.end, (src_tp + 1) * per) << "the sender holds the piece";
    }
    EXPECT_TRUE(starts.emplace(p.dst, p.name, p.begin).second) << "a piece received twice";
    numel[{p.dst, p.name}] += p.numel;
  }
  for (int dst = l.actor_world(); dst < l.world(); ++dst) {
    for (const auto& [name, shape] : shapes) {
      int64_t want = 1;
      for (int64_t d : shape) want *= d;
      if (shard_dim(name, config, l.rollout_tp) != ShardDim::kReplicated) want /= l.rollout_tp;
      EXPECT_EQ((numel[{dst, name}]), want) << what << ": rank " << dst << " " << name;
    }
  }
  const int64_t bucket_bytes = 4096;
  for (const WeightBucket& b : weight_sync_buckets(plan, bucket_bytes, 4)) {
    EXPECT_TRUE(b.pieces.size() == 1 || b.numel * 4 <= bucket_bytes) << what;
    for (size_t i : b.pieces) EXPECT_TRUE(plan[i].src == b.src && plan[i].dst == b.dst);
  }
}

TEST(WeightSync, PlanGivesEveryRolloutRankExactlyItsShard) {
  ModelConfig c = tensor_parallel_test_config();
  c.num_hidden_layers = 4;
  for (const auto& [atp, adp, app, rtp, reps] : std::vector<std::tuple<int, int, int, int, int>>{
           {1, 1, 1, 1, 1}, {2, 1, 1, 1, 2}, {1, 2, 1, 2, 3}, {4, 1, 1, 2, 1}, {2, 2, 2, 1, 3}, {1, 1, 2, 4, 1}}) {
    WeightSyncLayout l;
    l.actor_tp = atp;
    l.actor_dp = adp;
    l.actor_pp = app;
    l.rollout_tp = rtp;
    l.rollout_replicas = reps;
    expect_plan_covers_every_shard(c, l);
  }
}

// Ranks 0..A-1 build the actor from `full`, the rest a rollout of other weights; after the sync the rollout
// must hold `full` (in its dtype) in its layout.
void sync_and_check(int rank, ProcessGroup world, const WeightSyncLayout& l, at::ScalarType rollout_dtype,
                    const std::map<std::string, torch::Tensor>& full) {
  const ModelConfig config = tensor_parallel_test_config();
  const bool actor = rank < l.actor_world();
  // The actor's (or the rollout's) tensor-parallel groups inside the sync world.
  std::vector<std::vector<int>> tp_groups;
  for (int r = 0; r < l.actor_world(); r += l.actor_tp) {
    tp_groups.emplace_back();
    for (int i = 0; i < l.actor_tp; ++i) tp_groups.back().push_back(r + i);
  }
  for (int r = l.actor_world(); r < l.world(); r += l.rollout_tp) {
    tp_groups.emplace_back();
    for (int i = 0; i < l.rollout_tp; ++i) tp_groups.back().push_back(r + i);
  }
  Communicator tp(world.split(tp_groups));
  WeightSync sync(world, l, /*bucket_bytes=*/3000, rollout_dtype);
  if (actor) {
    CausalLM model(config, HeadKind::kLanguageModel, TensorParallelGroup(&tp));
    load_full_state(*model, full);
    const WeightSyncStats stats = sync.send(model);
    EXPECT_GT(stats.buckets, 1) << "3000-byte buckets split the model";
    return;
  }
  seed_cpu_generator(99);  // other weights than the actor's
  CausalLM model(config, HeadKind::kLanguageModel, TensorParallelGroup(&tp));
  model->to(rollout_dtype);
  const WeightSyncStats stats = sync.receive(model);
  int64_t bytes = 0;
  for (const auto& item : model->named_parameters()) {
    const torch::Tensor want =
        checkpoint_shard(item.key(), full.at(item.key()), config, model->tensor_parallel()).to(rollout_dtype);
    EXPECT_TRUE(torch::equal(item.value(), want)) << "rank " << rank << " " << item.key();
    bytes += item.value().nbytes();
  }
  EXPECT_EQ(stats.bytes_received, bytes) << "each element of the shard arrives once";
}

TEST(WeightSync, SplitActorToUnsplitRolloutAndBackToASplitBf16Rollout) {
  run_ranks(
      3,
      [](int rank, int port) {
        const auto full = parameters_of(*reference_model(HeadKind::kLanguageModel, 5));
        ProcessGroup world = gloo_world(rank, 3, port);
        WeightSyncLayout split_actor;  // ranks 0, 1: one actor split two ways; rank 2: the rollout
        split_actor.actor_tp = 2;
        sync_and_check(rank, world, split_actor, torch::kFloat, full);
        WeightSyncLayout split_rollout;  // rank 0: the actor; ranks 1, 2: one rollout replica split two ways
        split_rollout.rollout_tp = 2;
        sync_and_check(rank, world, split_rollout, torch::kBFloat16, full);
      },
      120);
}

}  // namespace
}  // namespace hybridflow
