// Transfer protocols (HybridFlow Table 3): how a call's input batch is split across a group's ranks
// (dispatch) and how the ranks' outputs are merged back (collect). Protocols are registered by name,
// so adding one is a single registration; workers name the protocol of each method.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "hybridflow/core/data_proto.h"
#include "hybridflow/runtime/mesh_coord.h"

namespace hybridflow {

namespace protocols {
inline constexpr const char* kOneToAll = "ONE_TO_ALL";         // same input to all, outputs in rank order
inline constexpr const char* kDataParallel = "DP_PROTO";       // chunk by rank, concat
inline constexpr const char* k3D = "3D_PROTO";                 // chunk by dp, collect pp-last & tp-0
inline constexpr const char* k3DAllMicroDP = "3D_ALL_MICRO_DP";  // chunk by rollout replica, collect local 0
inline constexpr const char* kAllToAll = "ALL_TO_ALL";         // pass-through both ways
}  // namespace protocols

struct TransferProtocol {
  // One input per rank, indexed by rank.
  std::function<std::vector<DataProto>(const DataProto& input, const std::vector<MeshCoord>& coords)> dispatch;
  // outputs indexed by rank.
  std::function<DataProto(const std::vector<DataProto>& outputs, const std::vector<MeshCoord>& coords)> collect;
  // dispatch and collect only pick, repeat and concatenate whole rows (DataProto::chunk, slice, concat; meta
  // copied): the data plane may then leave outputs on the workers and route rows between groups without
  // the controller holding them (runtime/data_plane.h). Otherwise every input and output goes through the
  // controller.
  bool moves_rows = false;
  // For a protocol whose dispatch cuts the input into equal, consecutive chunks of rows, in order, one per
  // group of ranks: how many chunks for these ranks (DP_PROTO: one per rank; 3D_PROTO: one per data-parallel
  // group). Lets a caller arrange rows per chunk before the call (trainer.balance_batch). Null otherwise.
  std::function<int(const std::vector<MeshCoord>& coords)> row_chunks{};
};

class ProtocolRegistry {
 public:
  static ProtocolRegistry& instance();  // holds the five built-in protocols
  void add(const std::string& name, TransferProtocol protocol);  // Error on a duplicate name
  const TransferProtocol& get(const std::string& name) const;   // Error naming the known ones
  bool has(const std::string& name) const;
  std::vector<std::string> names() const;

 private:
  ProtocolRegistry();
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

// Convenience: dispatch/collect through the registry.
std::vector<DataProto> dispatch_input(const std::string& protocol, const DataProto& input,
                                      const std::vector<MeshCoord>& coords);
DataProto collect_outputs(const std::string& protocol, const std::vector<DataProto>& outputs,
                          const std::vector<MeshCoord>& coords);
// The protocol's row_chunks for these ranks; 1 for a protocol that does not cut rows into ordered chunks.
int dispatch_row_chunks(const std::string& protocol, const std::vector<MeshCoord>& coords);

}  // namespace hybridflow
