// The cost formulas against hand computation, and the directions they must move in: more replicas take
// less time, more epochs or tokens more, decoding is bound by memory at small batches, the KV cache bounds
// the batch, and the switch and sync volumes are the parallel layer's formulas.
#include <gtest/gtest.h>

#include "hybridflow/core/error.h"
#include "hybridflow/model/model_size.h"
#include "hybridflow/parallel/resharding.h"
#include "hybridflow/parallel/weight_sync_volume.h"
#include "hybridflow/placement/role_costs.h"

using namespace hybridflow;
using namespace hybridflow::placement;

namespace {

ClusterSpec simple_cluster() {
  ClusterSpec c;
  c.name = "test";
  c.nodes = 2;
  c.gpus_per_node = 8;
  c.memory_bytes = 80e9;
  c.peak_flops = 100e12;
  c.memory_bandwidth = 2e12;
  c.intra_node_bandwidth = 200e9;
  c.inter_node_bandwidth = 20e9;
  c.intra_node_latency_s = c.inter_node_latency_s = 0;
  c.train_efficiency = c.forward_efficiency = 0.5;
  c.decode_efficiency = 0.5;
  c.comm_efficiency = 1.0;
  return c;
}

Workload simple_workload() {
  Workload w;
  w.prompts = 64;
  w.prompt_length = 128;
  w.response_length = 128;
  w.infer_micro_rows = 64;
  w.train_micro_rows = 64;
  return w;
}

}  // namespace

TEST(RoleCosts, CollectivesByTheRingFormula) {
  ClusterSpec c = simple_cluster();
  EXPECT_EQ(allreduce_seconds(c, 1e9, 1, false), 0.0);
  EXPECT_DOUBLE_EQ(allreduce_seconds(c, 1e9, 4, false), 2.0 * 3 / 4 * 1e9 / 200e9);
  EXPECT_DOUBLE_EQ(allreduce_seconds(c, 1e9, 4, true), 2.0 * 3 / 4 * 1e9 / 20e9);
  c.intra_node_latency_s = 1e-5;
  EXPECT_DOUBLE_EQ(allreduce_seconds(c, 0, 4, false), 6 * 1e-5);
  EXPECT_DOUBLE_EQ(allgather_seconds(c, 1e9, 4, false), 3 * 1e-5 + 1e9 / 200e9);
}

TEST(RoleCosts, AForwardPassOnOneDeviceIsItsFlopsOverAchievedFlops) {
  const ClusterSpec c = simple_cluster();
  const ModelShape m = model_preset("llama-7b");
  const Workload w = simple_workload();
  const CostInputs in{c, m, w};
  const Breakdown b = forward_seconds(in, Role::kRef, {1, 1, 1}, 64);
  EXPECT_DOUBLE_EQ(b.compute_s, m.forward_flops(64.0 * 256, 256, false) / (100e12 * 0.5));
  EXPECT_EQ(b.comm_s, 0.0);
  EXPECT_EQ(b.overhead_s, 0.0);
  // Four replicas: a quarter of the work each.
  EXPECT_DOUBLE_EQ(forward_seconds(in, Role::kRef, {1, 1, 4}, 64).compute_s, b.compute_s / 4);
  // Two tensor-parallel ranks: half the FLOPs each, plus two all-reduces of the activations per layer.
  const Breakdown t2 = forward_seconds(in, Role::kRef, {1, 2, 1}, 64);
  EXPECT_DOUBLE_EQ(t2.compute_s, b.compute_s / 2);
  EXPECT_DOUBLE_EQ(t2.comm_s, 32 * 2 * allreduce_seconds(c, 64.0 * 256 * 4096 * 2, 2, false));
}

TEST(RoleCosts, PipelineBubbleAndOverheads) {
  ClusterSpec c = simple_cluster();
  c.overheads.call_s = 0.5;
  c.overheads.layer_pass_s = 1e-3;
  const ModelShape m = model_preset("llama-7b");
  Workload w = simple_workload();
  w.infer_micro_rows = 8;  // 64 rows: 8 micro-batches
  const CostInputs in{c, m, w};
  const Breakdown p1 = forward_seconds(in, Role::kRef, {1, 1, 1}, 64);
  const Breakdown p4 = forward_seconds(in, Role::kRef, {4, 1, 1}, 64);
  // 4 stages: a quarter of the work per device, stretched by (m + p - 1) / m = 11 / 8.
  EXPECT_DOUBLE_EQ(p4.compute_s, p1.compute_s / 4 * 11 / 8);
  EXPECT_DOUBLE_EQ(p1.overhead_s, 0.5 + 1e-3 * 32 * 8);
  EXPECT_DOUBLE_EQ(p4.overhead_s, 0.5 + 1e-3 * 8 * 11);
}

TEST(RoleCosts, TrainingIsThreeForwardsPerEpochPlusTheGradientReduction) {
  const ClusterSpec c = simple_cluster();
  const ModelShape m = model_preset("llama-7b");
  Workload w = simple_workload();
  const CostInputs in{c, m, w};
  const Breakdown one = training_seconds(in, Role::kActor, {1, 1, 1}, 64);
  EXPECT_DOUBLE_EQ(one.compute_s, 3 * m.forward_flops(64.0 * 256, 256, false) / (100e12 * 0.5));
  EXPECT_EQ(one.comm_s, 0.0);
  w.ppo_epochs = 2;
  const Breakdown two = training_seconds(CostInputs{c, m, w}, Role::kActor, {1, 1, 1}, 64);
  EXPECT_DOUBLE_EQ(two.compute_s, 2 * one.compute_s);
  // Eight replicas inside a node: fp32 gradients all-reduced once per optimizer step.
  w.ppo_epochs = 1;
  const Breakdown d8 = training_seconds(CostInputs{c, m, w}, Role::kActor, {1, 1, 8}, 64);
  EXPECT_DOUBLE_EQ(d8.comm_s, allreduce_seconds(c, m.parameters(false) * 4, 8, false));
  // Sixteen replicas span both nodes: the NIC, ten times slower here, carries the gradients.
  const Breakdown d16 = training_seconds(CostInputs{c, m, w}, Role::kActor, {1, 1, 16}, 64);
  EXPECT_GT(d16.comm_s, d8.comm_s * 5);
}

TEST(RoleCosts, DecodingIsMemoryBoundAndTheKvCacheBoundsTheBatch) {
  const ClusterSpec c = simple_cluster();
  const ModelShape m = model_preset("llama-7b");
  const Workload w = simple_workload();
  const CostInputs in{c, m, w};
  const double seq_kv = m.kv_bytes_per_token(2) * 256;  // one sequence, every layer, bf16
  // Room for exactly 3 sequences: 64 responses decode in 22 waves of 3.
  const GenerationCost g = generation_seconds(in, {1, 1, 1}, 64, 3.5 * seq_kv);
  ASSERT_TRUE(g.feasible);
  EXPECT_EQ(g.waves, 22);
  EXPECT_EQ(g.batch, 3);
  EXPECT_GT(g.time.memory_s, 0.0);
  EXPECT_EQ(generation_seconds(in, {1, 1, 1}, 64, 0.5 * seq_kv).feasible, false);
  // With room for everything: one wave, and far less time than 22.
  const GenerationCost all = generation_seconds(in, {1, 1, 1}, 64, 100 * seq_kv);
  EXPECT_EQ(all.waves, 1);
  EXPECT_EQ(all.batch, 64);
  EXPECT_LT(all.time.total(), g.time.total() / 5);
  // One sequence: each step reads every weight once (bf16) and its KV cache.
  const GenerationCost one = generation_seconds(in, {1, 1, 64}, 64, 100 * seq_kv);
  const double context = 128 + 129 / 2.0;
  const double step_bytes = m.matmul_parameters(false) * 2 + context * m.kv_bytes_per_token(2);
  EXPECT_NEAR(one.time.memory_s, 128 * step_bytes / (2e12 * 0.5), 1e-9);
  EXPECT_EQ(one.time.compute_s > 0, true);  // the prefill
  // Longer responses take longer.
  Workload longer = w;
  longer.response_length = 512;
  EXPECT_GT(generation_seconds(CostInputs{c, m, longer}, {1, 1, 1}, 64, 1e12).time.total(),
            generation_seconds(in, {1, 1, 1}, 64, 1e12).time.total());
}

// rollout.max_num_seqs caps the rows decoded at once below what the KV cache holds: 64 responses at 8 a time
// are 8 waves, each as long as the whole batch's single wave in steps, so the generation takes longer; a cap
// above what the cache holds changes nothing; and a cap below the samples of one prompt is refused.
TEST(RoleCosts, MaxNumSeqsCapsTheRowsDecodedAtOnce) {
  const ClusterSpec c = simple_cluster();
  const ModelShape m = model_preset("llama-7b");
  Workload w = simple_workload();
  const double room = 100 * m.kv_bytes_per_token(2) * 256;
  const GenerationCost all = generation_seconds(CostInputs{c, m, w}, {1, 1, 1}, 64, room);
  w.max_num_seqs = 8;
  const GenerationCost capped = generation_seconds(CostInputs{c, m, w}, {1, 1, 1}, 64, room);
  EXPECT_EQ(all.waves, 1);
  EXPECT_EQ(capped.waves, 8);
  EXPECT_EQ(capped.batch, 8);
  EXPECT_GT(capped.time.total(), 2 * all.time.total());
  w.max_num_seqs = 1000;
  EXPECT_EQ(generation_seconds(CostInputs{c, m, w}, {1, 1, 1}, 64, 3.5 * m.kv_bytes_per_token(2) * 256).waves, 22);
  w.samples_per_prompt = 4;
  w.max_num_seqs = 2;
  EXPECT_THROW(w.validate(), hybridflow::Error);
}

TEST(RoleCosts, ReshardAndSyncMoveTheParallelLayersVolumes) {
  const ClusterSpec c = simple_cluster();
  const ModelShape m = model_preset("llama-7b");
  const Workload w = simple_workload();
  const CostInputs in{c, m, w};
  const double weights = model_weight_bytes(in);
  EXPECT_DOUBLE_EQ(weights, m.parameters(false) * 2);
  // t = 4 -> t_g = 2: each rank gathers (4 - 2) / (2 x 4) = a quarter of M inside a micro-DP group of 2.
  const Breakdown r = reshard_seconds(in, {1, 4, 2}, {1, 2, 4});
  const ReshardCost paper = paper_reshard_cost(ReshardMode::kHybridFlow, GenerationLayout(DeviceMesh(1, 2, 4), 2, 1),
                                               static_cast<int64_t>(weights));
  EXPECT_EQ(paper.bytes_received, static_cast<int64_t>(weights) / 4);
  EXPECT_DOUBLE_EQ(r.comm_s, allgather_seconds(c, static_cast<double>(paper.bytes_received), 2, false));
  EXPECT_EQ(reshard_seconds(in, {1, 4, 2}, {1, 4, 2}).total(), 0.0);  // generates in the training layout
  // Standalone: every rollout rank receives its M / t_g shard; the actor's t ranks each send theirs to each of
  // the d_g replicas.
  const WeightSyncVolume v = standalone_weight_sync_volume(DeviceMesh(1, 2, 4), 2, 1, 4, 1000);
  EXPECT_EQ(v.bytes_received_per_rollout_rank, 500);
  EXPECT_EQ(v.bytes_sent_per_actor_rank, 4 * 250);
  EXPECT_EQ(v.total_bytes, 4000);
  const Breakdown s = weight_sync_seconds(in, {1, 4, 2}, {1, 2, 4}, false);
  EXPECT_NEAR(s.comm_s, 4 * (weights / 4) / 20e9, 1e-6);
}

TEST(RoleCosts, MemoryOfTrainedInferenceAndRolloutRoles) {
  const ClusterSpec c = simple_cluster();
  const ModelShape m = model_preset("llama-7b");
  Workload w = simple_workload();
  w.distributed_optimizer = false;
  const double p = m.parameters(false);
  // bf16 weights and gradients, fp32 master weights and Adam moments: 16 bytes a parameter.
  EXPECT_DOUBLE_EQ(role_memory(CostInputs{c, m, w}, Role::kActor, {1, 1, 1}).persistent, 16 * p);
  EXPECT_DOUBLE_EQ(role_memory(CostInputs{c, m, w}, Role::kActor, {1, 4, 1}).persistent, 16 * p / 4);
  w.distributed_optimizer = true;  // ZeRO-1 over 4 replicas: 2 + 2 + 12 / 4
  EXPECT_DOUBLE_EQ(role_memory(CostInputs{c, m, w}, Role::kActor, {1, 1, 4}).persistent, 7 * p);
  EXPECT_DOUBLE_EQ(role_memory(CostInputs{c, m, w}, Role::kRef, {1, 2, 1}).persistent, p);
  EXPECT_GT(role_memory(CostInputs{c, m, w}, Role::kActor, {1, 1, 1}).transient,
            role_memory(CostInputs{c, m, w}, Role::kActor, {1, 4, 1}).transient);
  // The rollout beside the actor holds only the generation shard beyond the training shard it reuses.
  const RoleMemory alone = role_memory(CostInputs{c, m, w}, Role::kRollout, {1, 2, 1});
  EXPECT_DOUBLE_EQ(alone.persistent, p * 2 / 2);
  const RoleMemory beside = role_memory(CostInputs{c, m, w}, Role::kRollout, {1, 2, 2}, true, {1, 4, 1});
  EXPECT_EQ(beside.persistent, 0.0);
  EXPECT_DOUBLE_EQ(beside.transient - beside.kv_minimum, p * 2 / 2 - p * 2 / 4);
  EXPECT_DOUBLE_EQ(beside.kv_minimum, m.kv_bytes_per_token(2) / 2 * 256);
  // A mixture of experts: a standalone pool holds every routed expert on each tensor rank; beside the actor the
  // engine folds them over the generation tensor ranks with the rest.
  const ModelShape moe = model_preset("qwen3-30b-a3b");
  const double experts = model_size(moe.model_config()).experts, all = moe.parameters(false);
  ASSERT_GT(experts, 0.5 * all);
  const CostInputs moe_in{c, moe, w};
  EXPECT_DOUBLE_EQ(role_memory(moe_in, Role::kRollout, {1, 4, 1}).persistent, ((all - experts) / 4 + experts) * 2);
  const RoleMemory moe_beside = role_memory(moe_in, Role::kRollout, {1, 4, 1}, true, {1, 4, 1});
  EXPECT_DOUBLE_EQ(moe_beside.transient - moe_beside.kv_minimum, 0.0);  // the generation shard is the training one
}
