#include "hybridflow/runtime/protocol.h"

#include <map>
#include <mutex>

#include "hybridflow/core/error.h"

namespace hybridflow {
namespace {

DataProto concat_non_empty(const std::vector<DataProto>& parts) {
  std::vector<DataProto> kept;
  for (const auto& p : parts)
    if (!p.empty()) kept.push_back(p);
  if (kept.empty()) return DataProto();
  return DataProto::concat(kept);
}

std::vector<DataProto> replicate(const DataProto& input, const std::vector<MeshCoord>& coords) {
  return std::vector<DataProto>(coords.size(), input);
}

// Chunk `input` into `groups` parts; rank r receives the part named by group_of(coord r).
template <typename GroupOf>
std::vector<DataProto> split_by(const DataProto& input, const std::vector<MeshCoord>& coords, int groups,
                                const char* what, GroupOf group_of) {
  std::vector<DataProto> parts;
  if (input.empty()) {
    parts.assign(groups, input);  // nothing to split, but meta still reaches every rank
  } else {
    HF_CHECK(input.batch_size() % groups == 0, what, ": batch of ", input.batch_size(),
             " rows does not split evenly into ", groups,
             " parts; pad it with DataProto::padded_to_multiple(", groups, ", &pad) and drop the pad rows after");
    parts = input.chunk(groups);
  }
  std::vector<DataProto> out;
  for (const auto& c : coords) out.push_back(parts.at(group_of(c)));
  return out;
}

// Concatenates, in group order, the output of the one rank per group that `is_source` picks.
template <typename GroupOf, typename IsSource>
DataProto collect_from(const std::vector<DataProto>& outputs, const std::vector<MeshCoord>& coords, int groups,
                       const char* what, GroupOf group_of, IsSource is_source) {
  HF_CHECK(outputs.size() == coords.size(), what, ": ", outputs.size(), " outputs for ", coords.size(), " ranks");
  std::vector<DataProto> picked(groups);
  std::vector<bool> seen(groups, false);
  for (size_t r = 0; r < coords.size(); ++r) {
    if (!is_source(coords[r])) continue;
    int g = group_of(coords[r]);
    HF_CHECK(!seen[g], what, ": two source ranks for group ", g);
    seen[g] = true;
    picked[g] = outputs[r];
  }
  for (int g = 0; g < groups; ++g) HF_CHECK(seen[g], what, ": no source rank for group ", g);
  return concat_non_empty(picked);
}

void check_coords(const std::vector<MeshCoord>& coords) {
  HF_CHECK(!coords.empty(), "transfer protocol: a worker group needs at least one rank");
}

TransferProtocol one_to_all() {
  return {replicate,
          [](const std::vector<DataProto>& outputs, const std::vector<MeshCoord>&) { return concat_non_empty(outputs); },
          /*moves_rows=*/true};
}

// The chunks each splitting protocol cuts an input into: its dispatch and its row_chunks read the same count.
int chunk_per_rank(const std::vector<MeshCoord>& coords) { return static_cast<int>(coords.size()); }
int chunk_per_dp(const std::vector<MeshCoord>& coords) { return coords.at(0).dp_size; }
int chunk_per_micro_dp(const std::vector<MeshCoord>& coords) { return coords.at(0).micro_dp_size; }

TransferProtocol data_parallel() {
  return {[](const DataProto& input, const std::vector<MeshCoord>& coords) {
            check_coords(coords);
            return split_by(input, coords, chunk_per_rank(coords), protocols::kDataParallel,
                            [](const MeshCoord& c) { return c.rank; });
          },
          [](const std::vector<DataProto>& outputs, const std::vector<MeshCoord>&) {
            return concat_non_empty(outputs);
          },
          /*moves_rows=*/true, chunk_per_rank};
}

TransferProtocol three_d() {
  return {[](const DataProto& input, const std::vector<MeshCoord>& coords) {
            check_coords(coords);
            return split_by(input, coords, chunk_per_dp(coords), protocols::k3D,
                            [](const MeshCoord& c) { return c.dp; });
          },
          [](const std::vector<DataProto>& outputs, const std::vector<MeshCoord>& coords) {
            check_coords(coords);
            return collect_from(
                outputs, coords, chunk_per_dp(coords), protocols::k3D, [](const MeshCoord& c) { return c.dp; },
                [](const MeshCoord& c) { return c.pp == c.pp_size - 1 && c.tp == 0; });
          },
          /*moves_rows=*/true, chunk_per_dp};
}

TransferProtocol three_d_all_micro_dp() {
  return {[](const DataProto& input, const std::vector<MeshCoord>& coords) {
            check_coords(coords);
            return split_by(input, coords, chunk_per_micro_dp(coords), protocols::k3DAllMicroDP,
                            [](const MeshCoord& c) { return c.micro_dp; });
          },
          [](const std::vector<DataProto>& outputs, const std::vector<MeshCoord>& coords) {
            check_coords(coords);
            return collect_from(
                outputs, coords, chunk_per_micro_dp(coords), protocols::k3DAllMicroDP,
                [](const MeshCoord& c) { return c.micro_dp; }, [](const MeshCoord& c) { return c.micro_dp_local == 0; });
          },
          /*moves_rows=*/true, chunk_per_micro_dp};
}

// The controller neither splits nor merges: every rank sees the whole input and the caller reads
// the per-rank outputs (Future::per_rank); the merged result is empty.
TransferProtocol all_to_all() {
  return {replicate, [](const std::vector<DataProto>&, const std::vector<MeshCoord>&) { return DataProto(); }};
}

}  // namespace

struct ProtocolRegistry::Impl {
  mutable std::mutex mutex;
  std::map<std::string, TransferProtocol> protocols;
};

ProtocolRegistry::ProtocolRegistry() : impl_(std::make_shared<Impl>()) {
  add(protocols::kOneToAll, one_to_all());
  add(protocols::kDataParallel, data_parallel());
  add(protocols::k3D, three_d());
  add(protocols::k3DAllMicroDP, three_d_all_micro_dp());
  add(protocols::kAllToAll, all_to_all());
}

ProtocolRegistry& ProtocolRegistry::instance() {
  static ProtocolRegistry registry;
  return registry;
}

void ProtocolRegistry::add(const std::string& name, TransferProtocol protocol) {
  HF_CHECK(protocol.dispatch && protocol.collect, "transfer protocol '", name, "' needs dispatch and collect");
  std::lock_guard<std::mutex> lock(impl_->mutex);
  HF_CHECK(impl_->protocols.emplace(name, std::move(protocol)).second, "transfer protocol '", name,
           "' is already registered");
}

bool ProtocolRegistry::has(const std::string& name) const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->protocols.count(name) > 0;
}

std::vector<std::string> ProtocolRegistry::names() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::vector<std::string> out;
  for (const auto& kv : impl_->protocols) out.push_back(kv.first);
  return out;
}

const TransferProtocol& ProtocolRegistry::get(const std::string& name) const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto it = impl_->protocols.find(name);
  if (it == impl_->protocols.end()) {
    std::string known;
    for (const auto& kv : impl_->protocols) known += (known.empty() ? "" : ", ") + kv.first;
    HF_FAIL("unknown transfer protocol '", name, "'; registered: ", known);
  }
  return it->second;  // entries are never removed, so the reference stays valid
}

std::vector<DataProto> dispatch_input(const std::string& protocol, const DataProto& input,
                                      const std::vector<MeshCoord>& coords) {
  auto parts = ProtocolRegistry::instance().get(protocol).dispatch(input, coords);
  HF_CHECK(parts.size() == coords.size(), "transfer protocol '", protocol, "' produced ", parts.size(),
           " inputs for ", coords.size(), " ranks");
  return parts;
}

DataProto collect_outputs(const std::string& protocol, const std::vector<DataProto>& outputs,
                          const std::vector<MeshCoord>& coords) {
  return ProtocolRegistry::instance().get(protocol).collect(outputs, coords);
}

int dispatch_row_chunks(const std::string& protocol, const std::vector<MeshCoord>& coords) {
  const TransferProtocol& p = ProtocolRegistry::instance().get(protocol);
  if (!p.row_chunks) return 1;
  check_coords(coords);
  return p.row_chunks(coords);
}

}  // namespace hybridflow
