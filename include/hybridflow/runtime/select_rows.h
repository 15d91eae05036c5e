// Picking rows of a batch on the controller without giving up the data plane (docs/ARCHITECTURE.md, "The
// data plane"): a tensor the controller fetched from a call's outputs remembers which workers hold its rows,
// so a later call given it (or a slice of it) has its ranks fetch those rows from them. DataProto's own
// index_select makes new tensors that remember nothing, and the controller would send every row itself.
#pragma once

#include <cstdint>
#include <vector>

#include "hybridflow/core/data_proto.h"

namespace hybridflow {

// batch.index_select(rows) (any order, repeats allowed), where each picked tensor that came whole from
// workers' outputs still says where its rows live.
DataProto select_rows(const DataProto& batch, const std::vector<int64_t>& rows);

}  // namespace hybridflow
