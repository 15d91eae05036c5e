// The one place every collective goes through: a Communicator wraps a ProcessGroup and accounts each
// operation's calls, bytes and wall time, so that benchmarks and the placement cost model can read real
// communication volumes.
//
// Bytes are what this rank puts on the wire for the op, counted from tensor sizes:
//   all_reduce, broadcast: nbytes of the tensor; all_gather(_cat): nbytes of the local input;
//   reduce_scatter, all_to_all: nbytes of the full input; send: nbytes sent; recv: nbytes received; barrier: 0.
// (For broadcast the non-root ranks count the bytes they receive.)
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "hybridflow/parallel/process_group.h"

namespace hybridflow {

struct OpStats {
  int64_t calls = 0;
  int64_t bytes = 0;
  double seconds = 0.0;
};

// Per-op statistics keyed by op name ("all_reduce", "all_gather", "broadcast", "barrier", "send", "recv",
// "reduce_scatter", "all_to_all"). Thread-safe.
class CommStats {
 public:
  void add(const std::string& op, int64_t bytes, double seconds);
  std::map<std::string, OpStats> snapshot() const;
  OpStats of(const std::string& op) const;  // zeros when the op never ran
  int64_t total_bytes() const;
  void reset();

 private:
  mutable std::mutex mutex_;
  std::map<std::string, OpStats> ops_;
};

class Communicator {
 public:
  explicit Communicator(ProcessGroup group);

  int rank() const { return group_.rank(); }
  int size() const { return group_.size(); }
  const ProcessGroup& group() const { return group_; }

  // In place on every rank.
  void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  // One tensor per rank, in group-rank order; the inputs must have the same shape on all ranks.
  std::vector<at::Tensor> all_gather(const at::Tensor& tensor);
  // The gathered tensors concatenated along dim, gathered in one all_gather_into_tensor.
  at::Tensor all_gather_cat(const at::Tensor& tensor, int64_t dim = 0);
  // Reduces tensor over ranks and returns this rank's chunk of dim 0 (size(dim 0) must divide by size()),
  // with one reduce_scatter_tensor: each rank receives only its chunk's worth of the reduction.
  at::Tensor reduce_scatter(const at::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  // Chunk j of dim 0 (size(dim 0) must divide by size()) goes to rank j; the result holds at chunk i what rank i
  // sent here, in one all_to_all_single.
  at::Tensor all_to_all(const at::Tensor& tensor);
  // Uneven all_to_all_single: send_rows[j] rows (in order) go to rank j; the result holds recv_rows[i] rows from
  // each rank i, in rank order. recv_rows must be what the ranks send here (exchange the counts first).
  at::Tensor all_to_all(const at::Tensor& tensor, const std::vector<int64_t>& send_rows,
                        const std::vector<int64_t>& recv_rows);
  // In place: root's values everywhere. tensor must be contiguous and of the same shape on every rank.
  void broadcast(at::Tensor& tensor, int root);
  void barrier();
  void send(const at::Tensor& tensor, int dst, int tag = 0);
  void recv(at::Tensor& tensor, int src, int tag = 0);  // tensor gives shape and dtype
  // Non-blocking send (process_group.h); counted under "send" when issued.
  ProcessGroup::PendingSend isend(const at::Tensor& tensor, int dst, int tag = 0);

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_.reset(); }

 private:
  ProcessGroup group_;
  CommStats stats_;
};

// A group of ranks as model code sees it: a tensor-, sequence- or expert-parallel group (named by the aliases in
// tensor_parallel.h, sequence_parallel.h and expert_parallel.h) is a communicator, or none for one process.
// Default-constructed: one process, no communication; every collective helper is then the identity.
class ParallelGroup {
 public:
  ParallelGroup() = default;
  // The communicator must outlive every model and tensor that uses this group.
  explicit ParallelGroup(Communicator* comm) : comm_(comm) {}

  int rank() const { return comm_ != nullptr ? comm_->rank() : 0; }
  int size() const { return comm_ != nullptr ? comm_->size() : 1; }
  bool enabled() const { return size() > 1; }
  Communicator* comm() const { return comm_; }

 private:
  Communicator* comm_ = nullptr;
};

}  // namespace hybridflow
