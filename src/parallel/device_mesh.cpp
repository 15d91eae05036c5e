#include "hybridflow/parallel/device_mesh.h"

#include <functional>
#include <map>
#include <sstream>

#include "hybridflow/core/error.h"

namespace hybridflow {
namespace {

// Partitions 0..world-1 by a key; groups are listed by their smallest rank, members ascending.
std::vector<std::vector<int>> group_by(int world, const std::function<long(int)>& key) {
  std::map<long, size_t> index;
  std::vector<std::vector<int>> groups;
  for (int rank = 0; rank < world; ++rank) {
    auto [it, inserted] = index.emplace(key(rank), groups.size());
    if (inserted) groups.emplace_back();
    groups[it->second].push_back(rank);
  }
  return groups;
}

std::vector<int> group_containing(const std::vector<std::vector<int>>& groups, int rank) {
  for (const auto& group : groups) {
    for (int member : group) {
      if (member == rank) return group;
    }
  }
  HF_FAIL("rank ", rank, " is in no group");
}

}  // namespace

DeviceMesh::DeviceMesh(int pp, int dp, int tp) : pp_(pp), dp_(dp), tp_(tp) {
  HF_CHECK(pp >= 1 && dp >= 1 && tp >= 1, "device mesh: sizes must be >= 1, got pp=", pp, " dp=", dp,
           " tp=", tp);
}

void DeviceMesh::check_rank(int rank) const {
  HF_CHECK(rank >= 0 && rank < world_size(), "device mesh (", to_string(), "): rank ", rank,
           " is outside [0, ", world_size(), ")");
}

MeshCoords DeviceMesh::coords(int rank) const {
  check_rank(rank);
  return MeshCoords{rank / (tp_ * dp_), (rank / tp_) % dp_, rank % tp_};
}

int DeviceMesh::rank_of(const MeshCoords& c) const {
  HF_CHECK(c.pp >= 0 && c.pp < pp_ && c.dp >= 0 && c.dp < dp_ && c.tp >= 0 && c.tp < tp_, "device mesh (",
           to_string(), "): coordinates pp=", c.pp, " dp=", c.dp, " tp=", c.tp, " out of range");
  return (c.pp * dp_ + c.dp) * tp_ + c.tp;
}

std::vector<std::vector<int>> DeviceMesh::tp_groups() const {
  return group_by(world_size(), [this](int r) { return static_cast<long>(r / tp_); });
}
std::vector<std::vector<int>> DeviceMesh::dp_groups() const {
  return group_by(world_size(), [this](int r) {
    MeshCoords c = coords(r);
    return static_cast<long>(c.pp) * tp_ + c.tp;
  });
}
std::vector<std::vector<int>> DeviceMesh::model_parallel_groups() const {
  return group_by(world_size(), [this](int r) { return static_cast<long>(coords(r).dp); });
}
std::vector<std::vector<int>> DeviceMesh::pp_groups() const {
  return group_by(world_size(), [this](int r) { return static_cast<long>(r % (dp_ * tp_)); });
}

std::vector<std::vector<int>> DeviceMesh::dp_blocks(int size, bool with_tensor_ranks) const {
  HF_CHECK(size >= 1 && dp_ % size == 0, "device mesh: blocks of ", size, " do not divide dp=", dp_);
  return group_by(world_size(), [this, size, with_tensor_ranks](int r) {
    const MeshCoords c = coords(r);
    return (static_cast<long>(c.pp) * (dp_ / size) + c.dp / size) * tp_ + (with_tensor_ranks ? 0 : c.tp);
  });
}

std::vector<std::vector<int>> DeviceMesh::dp_block_peers(int size) const {
  HF_CHECK(size >= 1 && dp_ % size == 0, "device mesh: blocks of ", size, " do not divide dp=", dp_);
  return group_by(world_size(), [this, size](int r) {
    const MeshCoords c = coords(r);
    return (static_cast<long>(c.pp) * size + c.dp % size) * tp_ + c.tp;
  });
}

std::vector<int> DeviceMesh::tp_group_of(int rank) const { check_rank(rank); return group_containing(tp_groups(), rank); }
std::vector<int> DeviceMesh::dp_group_of(int rank) const { check_rank(rank); return group_containing(dp_groups(), rank); }
std::vector<int> DeviceMesh::pp_group_of(int rank) const { check_rank(rank); return group_containing(pp_groups(), rank); }

std::string DeviceMesh::to_string() const {
  std::ostringstream out;
  out << "pp=" << pp_ << " dp=" << dp_ << " tp=" << tp_;
  return out.str();
}

GenerationLayout::GenerationLayout(const DeviceMesh& train, int gen_tp, int gen_pp)
    : train_(train), gen_tp_(gen_tp), gen_pp_(gen_pp) {
  HF_CHECK(gen_tp >= 1 && train.tp() % gen_tp == 0, "generation layout: gen tp=", gen_tp,
           " must divide the training tp=", train.tp());
  HF_CHECK(gen_pp >= 1 && train.pp() % gen_pp == 0, "generation layout: gen pp=", gen_pp,
           " must divide the training pp=", train.pp());
}

GenCoords GenerationLayout::coords(int rank) const {
  MeshCoords t = train_.coords(rank);
  int k = train_.tp() / gen_tp_;
  int l = train_.pp() / gen_pp_;
  GenCoords g;
  g.tp = t.tp / k;
  g.pp = t.pp / l;
  g.micro_dp_rank = (t.pp % l) * k + (t.tp % k);
  g.dp = t.dp * micro_dp() + g.micro_dp_rank;
  return g;
}

int GenerationLayout::rank_of(const GenCoords& g) const {
  HF_CHECK(g.tp >= 0 && g.tp < gen_tp_ && g.pp >= 0 && g.pp < gen_pp_ && g.dp >= 0 && g.dp < gen_dp(),
           "generation layout: coordinates pp=", g.pp, " dp=", g.dp, " tp=", g.tp, " out of range");
  int k = train_.tp() / gen_tp_;
  int l = train_.pp() / gen_pp_;
  int micro = g.dp % micro_dp();
  MeshCoords t;
  t.dp = g.dp / micro_dp();
  t.tp = g.tp * k + micro % k;
  t.pp = g.pp * l + micro / k;
  return train_.rank_of(t);
}

std::vector<std::vector<int>> GenerationLayout::micro_dp_groups() const {
  // Members share the training dp replica and the generation shard (gen tp, gen pp).
  return group_by(train_.world_size(), [this](int r) {
    GenCoords g = coords(r);
    return (static_cast<long>(train_.coords(r).dp) * gen_pp_ + g.pp) * gen_tp_ + g.tp;
  });
}
std::vector<std::vector<int>> GenerationLayout::gen_tp_groups() const {
  return group_by(train_.world_size(), [this](int r) {
    GenCoords g = coords(r);
    return static_cast<long>(g.pp) * gen_dp() + g.dp;
  });
}
std::vector<std::vector<int>> GenerationLayout::gen_pp_groups() const {
  return group_by(train_.world_size(), [this](int r) {
    GenCoords g = coords(r);
    return static_cast<long>(g.dp) * gen_tp_ + g.tp;
  });
}
std::vector<std::vector<int>> GenerationLayout::gen_dp_groups() const {
  return group_by(train_.world_size(), [this](int r) {
    GenCoords g = coords(r);
    return static_cast<long>(g.pp) * gen_tp_ + g.tp;
  });
}
std::vector<int> GenerationLayout::micro_dp_group_of(int rank) const {
  return group_containing(micro_dp_groups(), rank);
}
std::vector<int> GenerationLayout::gen_tp_group_of(int rank) const {
  return group_containing(gen_tp_groups(), rank);
}

}  // namespace hybridflow
