// Where a rank sits in its worker group's parallel layout. The transfer protocols need only these
// coordinates, so runtime keeps its own small struct; the numbers come from dist's DeviceMesh and
// GenerationLayout (device_mesh.h), so runtime and dist agree on one rank ordering.
#pragma once

#include <string>
#include <vector>

namespace hybridflow {

// Training layout tp x dp x pp plus the generation layout (gen_pp stages of gen_tp ranks per rollout
// replica). gen_tp = 0 means "same as tp"; gen_pp = 1 generates unstaged.
struct ParallelLayout {
  int tp = 1;
  int pp = 1;
  int gen_tp = 0;
  int gen_pp = 1;
  // HybridFlow-V's generation replicas (consecutive gen_tp ranks of a training tp group, resharding.h)
  // instead of the 3D-HybridEngine's strided ones.
  bool consecutive_generation_groups = false;
};

struct MeshCoord {
  int rank = 0;
  int world_size = 1;
  int dp = 0, dp_size = 1;
  int tp = 0, tp_size = 1;
  int pp = 0, pp_size = 1;
  // Generation layout: micro_dp is the rollout replica (micro-DP group) this rank belongs to and
  // micro_dp_local its rank inside that replica.
  int micro_dp = 0, micro_dp_size = 1, micro_dp_local = 0;
};

// Rank order is tp fastest, then dp, then pp (Megatron's order): rank = (pp * dp_size + dp) * tp + tp_rank.
// Generation replicas are dist's generation tp groups (gen_tp must divide tp): with tp 4 and gen_tp 2
// the replicas are ranks {0, 2} and {1, 3}, so that each micro-DP group {0, 1}, {2, 3} all-gathers
// its training shards into the generation shards. Error when the sizes do not divide.
MeshCoord mesh_coord_of(int rank, int world_size, const ParallelLayout& layout);
std::vector<MeshCoord> mesh_coords(int world_size, const ParallelLayout& layout);

}  // namespace hybridflow
