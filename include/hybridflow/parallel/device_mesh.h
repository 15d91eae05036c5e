// Pure description of a worker group's parallel layout; no processes, no tensors.
//
// Training layout: world = pp x dp x tp. Rank order is tp fastest, then dp, then pp (Megatron's order):
//   rank = (pp_rank * dp + dp_rank) * tp + tp_rank
// so a tensor-parallel group is a block of tp consecutive ranks (one host, fast links).
//
// Generation layout of the 3D-HybridEngine (HybridFlow paper, section 5): the actor trains with tp=t, pp=p,
// dp=d and generates with tp_g, pp_g (t % tp_g == 0, p % pp_g == 0), so every training model-parallel group
// of t*p ranks holds micro_dp = (t*p)/(tp_g*pp_g) generation replicas and there are dp_g = d*micro_dp replicas.
// With the paper's optimised grouping, a rank with training coordinates (pp j, dp e, tp i) and
// k = t/tp_g, l = p/pp_g gets
//   gen_tp = i / k, gen_pp = j / l, micro_dp_rank = (j % l) * k + (i % k), gen_dp = e * micro_dp + micro_dp_rank
// Its micro-DP group (same e, i/k, j/l) is micro_dp ranks whose training shards are exactly its generation
// shard, so switching to generation is one all-gather inside that group (ordered by micro_dp_rank, which is
// world-rank order) and each rank's generation weights contain its training weights (no redundant copy).
// Generation tp groups are then strided: e.g. t=4, tp_g=2 gives micro-DP groups {0,1},{2,3} and
// generation tp groups {0,2},{1,3}.
#pragma once

#include <string>
#include <vector>

namespace hybridflow {

struct MeshCoords {
  int pp = 0, dp = 0, tp = 0;
};

struct GenCoords {
  int pp = 0, dp = 0, tp = 0;
  int micro_dp_rank = 0;  // position inside the micro-DP group
};

class DeviceMesh {
 public:
  // Throws hybridflow::Error when a size is < 1.
  DeviceMesh(int pp, int dp, int tp);

  int pp() const { return pp_; }
  int dp() const { return dp_; }
  int tp() const { return tp_; }
  int world_size() const { return pp_ * dp_ * tp_; }

  MeshCoords coords(int rank) const;
  int rank_of(const MeshCoords& c) const;

  // Every group of the dimension, each in ascending rank order; the groups partition the world.
  std::vector<std::vector<int>> tp_groups() const;
  std::vector<std::vector<int>> dp_groups() const;
  std::vector<std::vector<int>> pp_groups() const;
  // The t*p ranks of each data-parallel replica (every stage, every tensor rank): member j*t + i is stage j's
  // tensor rank i. With p = 1 these are the tp groups.
  std::vector<std::vector<int>> model_parallel_groups() const;
  // Blocks of `size` consecutive data-parallel replicas in each stage (size must divide dp): one group per tensor
  // rank, or with `with_tensor_ranks` every tensor rank of the block together (sequence- and expert-parallel
  // groups). And the ranks at the same place of their block, per stage and tensor rank (the owners of the same
  // experts).
  std::vector<std::vector<int>> dp_blocks(int size, bool with_tensor_ranks) const;
  std::vector<std::vector<int>> dp_block_peers(int size) const;

  // The group of one dimension that contains rank.
  std::vector<int> tp_group_of(int rank) const;
  std::vector<int> dp_group_of(int rank) const;
  std::vector<int> pp_group_of(int rank) const;

  std::string to_string() const;  // "pp=2 dp=2 tp=2"

 private:
  void check_rank(int rank) const;
  int pp_, dp_, tp_;
};

// The generation layout for a training mesh, as described at the top of this file.
class GenerationLayout {
 public:
  // Throws hybridflow::Error unless gen_tp divides train.tp() and gen_pp divides train.pp().
  GenerationLayout(const DeviceMesh& train, int gen_tp, int gen_pp = 1);

  const DeviceMesh& train() const { return train_; }
  int gen_tp() const { return gen_tp_; }
  int gen_pp() const { return gen_pp_; }
  int micro_dp() const { return (train_.tp() / gen_tp_) * (train_.pp() / gen_pp_); }
  int gen_dp() const { return train_.dp() * micro_dp(); }

  GenCoords coords(int rank) const;
  int rank_of(const GenCoords& c) const;  // micro_dp_rank is derived from c.dp

  std::vector<std::vector<int>> micro_dp_groups() const;
  std::vector<std::vector<int>> gen_tp_groups() const;
  std::vector<std::vector<int>> gen_pp_groups() const;
  std::vector<std::vector<int>> gen_dp_groups() const;
  std::vector<int> micro_dp_group_of(int rank) const;
  std::vector<int> gen_tp_group_of(int rank) const;

 private:
  DeviceMesh train_;
  int gen_tp_, gen_pp_;
};

}  // namespace hybridflow
