#include "hybridflow/runtime/mesh_coord.h"

#include "coord_json.h"

#include "hybridflow/core/error.h"
#include "hybridflow/parallel/device_mesh.h"
#include "hybridflow/parallel/resharding.h"

namespace hybridflow {

MeshCoord mesh_coord_of(int rank, int world_size, const ParallelLayout& layout) {
  HF_CHECK(world_size > 0, "mesh_coord_of: world_size must be positive, got ", world_size);
  HF_CHECK(rank >= 0 && rank < world_size, "mesh_coord_of: rank ", rank, " outside [0, ", world_size, ")");
  const int tp = layout.tp, pp = layout.pp;
  const int gen_tp = layout.gen_tp > 0 ? layout.gen_tp : tp;
  HF_CHECK(tp > 0 && pp > 0 && world_size % (tp * pp) == 0, "parallel layout: world size ", world_size,
           " must be a multiple of tp (", tp, ") x pp (", pp, ")");
  HF_CHECK(tp % gen_tp == 0, "parallel layout: the generation tp size (", gen_tp, ") must divide tp (", tp, ")");
  HF_CHECK(layout.gen_pp >= 1 && pp % layout.gen_pp == 0, "parallel layout: the generation pp size (", layout.gen_pp,
           ") must divide pp (", pp, ")");
  // dist's meshes define the rank order, so a rollout replica here is exactly the generation tp group
  // that dist's collectives build (the 3D-HybridEngine grouping, device_mesh.h).
  const DeviceMesh mesh(pp, world_size / (tp * pp), tp);
  const GenerationLayout generation(mesh, gen_tp, layout.gen_pp);
  const MeshCoords t = mesh.coords(rank);
  const GenCoords g = generation.coords(rank);
  MeshCoord c;
  c.rank = rank;
  c.world_size = world_size;
  c.tp_size = tp;
  c.pp_size = pp;
  c.dp_size = mesh.dp();
  c.tp = t.tp;
  c.dp = t.dp;
  c.pp = t.pp;
  c.micro_dp_size = generation.gen_dp();
  c.micro_dp = g.dp;
  // A replica's ranks: every generation stage's tensor ranks; rank 0 (stage 0, tensor rank 0) answers for it.
  c.micro_dp_local = g.pp * gen_tp + g.tp;
  if (layout.consecutive_generation_groups) {
    const auto groups = vanilla_generation_tp_groups(generation);
    for (size_t r = 0; r < groups.size(); ++r)
      for (size_t i = 0; i < groups[r].size(); ++i)
        if (groups[r][i] == rank) {
          c.micro_dp = static_cast<int>(r);
          c.micro_dp_local = static_cast<int>(i);
        }
  }
  return c;
}

std::vector<MeshCoord> mesh_coords(int world_size, const ParallelLayout& layout) {
  std::vector<MeshCoord> out;
  for (int r = 0; r < world_size; ++r) out.push_back(mesh_coord_of(r, world_size, layout));
  return out;
}

}  // namespace hybridflow

namespace hybridflow::runtime_detail {

nlohmann::json coord_to_json(const MeshCoord& c) {
  return {{"rank", c.rank}, {"world_size", c.world_size}, {"dp", c.dp}, {"dp_size", c.dp_size},
          {"tp", c.tp}, {"tp_size", c.tp_size}, {"pp", c.pp}, {"pp_size", c.pp_size},
          {"micro_dp", c.micro_dp}, {"micro_dp_size", c.micro_dp_size}, {"micro_dp_local", c.micro_dp_local}};
}

MeshCoord coord_from_json(const nlohmann::json& j) {
  MeshCoord c;
  c.rank = j.at("rank");
  c.world_size = j.at("world_size");
  c.dp = j.at("dp");
  c.dp_size = j.at("dp_size");
  c.tp = j.at("tp");
  c.tp_size = j.at("tp_size");
  c.pp = j.at("pp");
  c.pp_size = j.at("pp_size");
  c.micro_dp = j.at("micro_dp");
  c.micro_dp_size = j.at("micro_dp_size");
  c.micro_dp_local = j.at("micro_dp_local");
  return c;
}

}  // namespace hybridflow::runtime_detail
