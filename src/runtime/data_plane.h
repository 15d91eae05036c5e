// The data plane, controller side: call outputs that stay on the workers that made them, and calls whose
// input rows come straight from those workers (docs/ARCHITECTURE.md, "The data plane").
//
// A call of a row-wise protocol (TransferProtocol::moves_rows) on a pool with ResourcePool::data_plane asks
// its ranks to keep their outputs' bulk tensors (more than inline_row_bytes per row) in their object
// tables (object_table.h). The answers carry the rest (fields, meta, small tensors) and a description of
// what was kept; the controller runs the protocol's collect() over these skeletons, with zero-width
// markers standing for the kept tensors (so collect checks keys, dtypes and shapes as it would the real
// outputs) and a row-source column (kSourceKey: producer rank << 32 | row) that says where each merged
// row lives. That is a RemoteResult, held by the call's Future.
//
// A call given such a Future dispatches the skeleton with its own protocol: each consumer rank's share of
// the source column becomes a plan (data_fetch.h) of row runs to fetch from the producer ranks, and the
// controller sends only the plan and the skeleton's rows. A DataProto input can do the same: tensors the
// controller fetched from a RemoteResult remember where their rows live (as long as nobody wrote into
// them), so an input built from them (select, chunk, set_tensor of the same tensor) is fetched by the
// consumer from the producers too. The controller fetches tensors itself only when it reads them
// (Future::get), and a worker's object is released when the last handle to it goes (the Future, fetched
// tensors, calls still fetching from it).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hybridflow/runtime/future.h"
#include "hybridflow/runtime/mesh_coord.h"
#include "hybridflow/transport/process_pool.h"

namespace hybridflow::runtime_detail {

// Per merged row of a RemoteResult's skeleton: producer rank << 32 | row in that rank's output.
inline constexpr const char* kSourceKey = "__hf_rows";
// Zero-width stand-in of a kept tensor in a skeleton: "__hf_kept:" + key, shape [rows, 0, dims...].
inline constexpr const char* kKeptPrefix = "__hf_kept:";

// The workers' copies of one call's outputs: object `id` on every rank of the pool. Released on the
// workers when the last handle goes.
struct HeldObject {
  std::weak_ptr<ProcessPool> pool;
  int64_t id = -1;
  std::string pool_name, role, method;
  std::vector<ProcessPool::RankInfo> ranks;
  HeldObject() = default;
  HeldObject(const HeldObject&) = delete;
  HeldObject& operator=(const HeldObject&) = delete;
  ~HeldObject();
  std::string what() const;  // "the output of actor.generate_sequences on pool 'actor'"
};

struct TensorSpec {
  c10::ScalarType dtype;
  std::vector<int64_t> tail;  // the dims after the rows
};

// The result of a call (the call's answers, with their outputs' data) as the controller builds it:
// held by the controller when nothing was kept, else a RemoteResult.
std::shared_ptr<const CallResult> call_result(const std::shared_ptr<ProcessPool>& pool, const std::string& role,
                                              const std::string& method, const std::string& protocol,
                                              const std::vector<MeshCoord>& coords,
                                              std::vector<ProcessPool::RankOutput>&& outputs);

// The inputs of a call for each rank of `consumer`: from `value`, or from the result `from` (one of them),
// dispatched by `protocol`; rows held by workers stay there when the consumer can fetch them.
struct RoutedInputs {
  std::vector<ProcessPool::RankInput> inputs;
  std::vector<std::shared_ptr<const HeldObject>> holds;  // kept alive until the call ends
};
RoutedInputs route_inputs(const DataProto* value, const std::shared_ptr<const CallResult>& from,
                          const std::string& protocol, const std::vector<MeshCoord>& coords,
                          const ProcessPool& consumer);

// Used by CallResult (future.cpp).
DataProto visible_skeleton(const RemoteResult& result);  // fields, meta, small tensors; no markers
std::map<std::string, torch::Tensor> materialize(const RemoteResult& result, const std::vector<std::string>& keys);
std::vector<DataProto> materialize_per_rank(const RemoteResult& result);
std::string tensor_names(const RemoteResult& result);  // "a, b, kept_c" for errors

}  // namespace hybridflow::runtime_detail

namespace hybridflow {

struct RemoteResult {
  std::shared_ptr<const runtime_detail::HeldObject> object;
  std::map<std::string, runtime_detail::TensorSpec> kept;  // tensors left on the workers, by key
  std::vector<bool> kept_by;                // per rank: it kept its bulk tensors
  std::vector<int64_t> rows;                // per rank: rows of its output
  std::vector<DataProto> answers;           // per rank: what it sent (a rank that kept nothing: its whole output)
  DataProto skeleton;                       // collect() of the skeletons: markers, kSourceKey, the rest
  bool through_controller = false;          // some kept key's rows are in an answer: consumers get them from here
};

}  // namespace hybridflow
