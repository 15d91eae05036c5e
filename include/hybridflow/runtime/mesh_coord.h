// Where a rank sits in its worker group's parallel layout. The transfer protocols need only these
// coordinates, so runtime keeps its own small struct instead of depending on dist's process groups
// (dist's DeviceMesh had not landed when runtime was written; a converter can be added there).
#pragma once

#include <string>
#include <vector>

namespace hybridflow {

// Training layout tp x dp x pp plus the generation layout (gen_tp ranks per rollout replica).
// gen_tp = 0 means "same as tp".
struct ParallelLayout {
  int tp = 1;
  int pp = 1;
  int gen_tp = 0;
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
// Generation replicas are consecutive blocks of gen_tp ranks. Error when world_size does not divide.
MeshCoord mesh_coord_of(int rank, int world_size, const ParallelLayout& layout);
std::vector<MeshCoord> mesh_coords(int world_size, const ParallelLayout& layout);

}  // namespace hybridflow
