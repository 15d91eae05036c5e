// Ulysses sequence parallelism in a role's processes (verl's ulysses_sequence_parallel_size, and Megatron's
// context_parallel_size read as it): n consecutive data-parallel ranks form a sequence-parallel group (data-
// parallel ranks [g n, (g + 1) n) of one pipeline stage and one tensor-parallel rank; without tensor and
// pipeline parallelism, ranks [g n, (g + 1) n), as verl carves them), so the data-parallel size is dp / n. The
// controller still hands every data-parallel rank its own share of a batch (DP_PROTO, 3D_PROTO); a group
// first gathers its members' shares, so that every member holds the same rows, runs the
// model with its sequence split over the members (model/transformer.h: set_sequence_parallel), and each
// member returns its own share of the results.
//
// Gradients need nothing more: the engine's data-parallel reducer sums over every rank of the role, and the
// members of a group weigh the same rows with the same token counts, so the sum of their gradients over the
// doubled count is one process's (parallel/sequence_parallel.h explains the scaling).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hybridflow/core/data_proto.h"
#include "hybridflow/model/transformer.h"
#include "hybridflow/parallel/collectives.h"
#include "hybridflow/parallel/sequence_parallel.h"
#include "hybridflow/runtime/mesh_coord.h"

namespace hybridflow {

class SequenceParallelRows {
 public:
  // Collective over the role's world (every rank calls it with the same size); `coord` is this rank's place in
  // the role's mesh. Null for size 1. Throws naming `key` when the size does not divide the data-parallel size.
  static std::unique_ptr<SequenceParallelRows> join(const ProcessGroup& world, const MeshCoord& coord, int size,
                                                    const std::string& key);

  SequenceParallelGroup group() const { return SequenceParallelGroup(comm_.get()); }
  int size() const { return comm_->size(); }

  // The group's rows: its members' tensors concatenated in rank order (each member must hold as many rows of
  // the same widths); meta as given; per-sample non-tensor fields are not carried.
  DataProto gather(const DataProto& mine) const;
  // This rank's rows of a result over the group's rows: tensors whose first dimension is the group's row count
  // are cut to this rank's share; other tensors and the meta pass as they are.
  DataProto own_share(const DataProto& group_result, int64_t group_rows) const;
  // Bytes this rank has sent through all-to-alls so far (the model's sequence/head trades).
  int64_t all_to_all_bytes() const { return comm_->stats().of("all_to_all").bytes; }

 private:
  std::unique_ptr<Communicator> comm_;
};

// With `rows` (null: call(in) as it is): gathers the group's rows, runs call on them with sequence parallelism
// on in `models` (off again after, so that generation never splits its sequences) and returns this rank's
// share of the result.
DataProto on_sequence_parallel_rows(const SequenceParallelRows* rows, const std::vector<CausalLM*>& models,
                                    const DataProto& in, const std::function<DataProto(const DataProto&)>& call);
// on_sequence_parallel_rows for an update whose result carries meta "metrics": adds <prefix>
// sequence_parallel_all_to_all_mb, the megabytes this rank's all-to-alls sent during the call.
DataProto update_on_sequence_parallel_rows(const SequenceParallelRows* rows, const std::vector<CausalLM*>& models,
                                           const DataProto& in, const std::string& prefix,
                                           const std::function<DataProto(const DataProto&)>& call);

}  // namespace hybridflow
