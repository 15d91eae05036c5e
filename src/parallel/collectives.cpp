#include "hybridflow/parallel/collectives.h"

#include <ATen/ATen.h>

#include <chrono>

#include "hybridflow/core/error.h"

namespace hybridflow {
namespace {

int64_t nbytes(const at::Tensor& t) { return static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size()); }

// Times fn and records it under op, also when fn throws (a failed op still took the time).
template <typename Fn>
void timed(CommStats& stats, const char* op, int64_t bytes, Fn&& fn) {
  auto start = std::chrono::steady_clock::now();
  try {
    fn();
  } catch (...) {
    stats.add(op, bytes, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    throw;
  }
  stats.add(op, bytes, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

}  // namespace

void CommStats::add(const std::string& op, int64_t bytes, double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  OpStats& s = ops_[op];
  s.calls += 1;
  s.bytes += bytes;
  s.seconds += seconds;
}

std::map<std::string, OpStats> CommStats::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return ops_;
}

OpStats CommStats::of(const std::string& op) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = ops_.find(op);
  return it == ops_.end() ? OpStats{} : it->second;
}

int64_t CommStats::total_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t total = 0;
  for (const auto& [op, s] : ops_) total += s.bytes;
  return total;
}

void CommStats::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  ops_.clear();
}

Communicator::Communicator(ProcessGroup group) : group_(std::move(group)) {
  HF_CHECK(group_.valid(), "Communicator: needs a valid ProcessGroup");
}

void Communicator::all_reduce(at::Tensor& tensor, ReduceOp op) {
  timed(stats_, "all_reduce", nbytes(tensor), [&] { group_.allreduce(tensor, op); });
}

std::vector<at::Tensor> Communicator::all_gather(const at::Tensor& tensor) {
  std::vector<at::Tensor> out;
  timed(stats_, "all_gather", nbytes(tensor), [&] { group_.allgather(out, tensor); });
  return out;
}

at::Tensor Communicator::all_gather_cat(const at::Tensor& tensor, int64_t dim) {
  HF_CHECK(tensor.dim() > 0, "all_gather_cat: needs a tensor with at least one dimension");
  dim = dim < 0 ? dim + tensor.dim() : dim;
  HF_CHECK(dim >= 0 && dim < tensor.dim(), "all_gather_cat: dim out of range for a ", tensor.dim(), "-d tensor");
  // c10d gathers along dim 0 (rank r's input is rows [r * d0, (r + 1) * d0)); other dims are laid out after.
  auto sizes = tensor.sizes().vec();
  sizes[0] *= size();
  at::Tensor out = at::empty(sizes, tensor.options());
  timed(stats_, "all_gather", nbytes(tensor), [&] { group_.allgather_into(out, tensor); });
  if (dim == 0) return out;
  auto ranks_first = tensor.sizes().vec();
  ranks_first.insert(ranks_first.begin(), size());
  return out.view(ranks_first).movedim(0, dim).flatten(dim, dim + 1).contiguous();
}

at::Tensor Communicator::reduce_scatter(const at::Tensor& tensor, ReduceOp op) {
  HF_CHECK(tensor.dim() > 0 && tensor.size(0) % size() == 0, "reduce_scatter: dim 0 of size ",
           tensor.dim() > 0 ? tensor.size(0) : 0, " does not divide into ", size(), " ranks");
  auto sizes = tensor.sizes().vec();
  sizes[0] /= size();
  at::Tensor out = at::empty(sizes, tensor.options());
  timed(stats_, "reduce_scatter", nbytes(tensor), [&] { group_.reduce_scatter_into(out, tensor, op); });
  return out;
}

at::Tensor Communicator::all_to_all(const at::Tensor& tensor) {
  at::Tensor out = at::empty(tensor.sizes(), tensor.options().memory_format(at::MemoryFormat::Contiguous));
  timed(stats_, "all_to_all", nbytes(tensor), [&] { group_.alltoall_into(out, tensor); });
  return out;
}

at::Tensor Communicator::all_to_all(const at::Tensor& tensor, const std::vector<int64_t>& send_rows,
                                    const std::vector<int64_t>& recv_rows) {
  HF_CHECK(tensor.dim() > 0, "all_to_all: needs a tensor with at least one dimension");
  int64_t rows = 0;
  for (int64_t r : recv_rows) rows += r;
  auto sizes = tensor.sizes().vec();
  sizes[0] = rows;
  at::Tensor out = at::empty(sizes, tensor.options().memory_format(at::MemoryFormat::Contiguous));
  timed(stats_, "all_to_all", nbytes(tensor), [&] { group_.alltoallv_into(out, tensor, recv_rows, send_rows); });
  return out;
}

void Communicator::broadcast(at::Tensor& tensor, int root) {
  timed(stats_, "broadcast", nbytes(tensor), [&] { group_.broadcast(tensor, root); });
}

void Communicator::barrier() {
  timed(stats_, "barrier", 0, [&] { group_.barrier(); });
}

void Communicator::send(const at::Tensor& tensor, int dst, int tag) {
  timed(stats_, "send", nbytes(tensor), [&] { group_.send(tensor, dst, tag); });
}

ProcessGroup::PendingSend Communicator::isend(const at::Tensor& tensor, int dst, int tag) {
  ProcessGroup::PendingSend pending;
  timed(stats_, "send", nbytes(tensor), [&] { pending = group_.isend(tensor, dst, tag); });
  return pending;
}

void Communicator::recv(at::Tensor& tensor, int src, int tag) {
  timed(stats_, "recv", nbytes(tensor), [&] { group_.recv(tensor, src, tag); });
}

}  // namespace hybridflow
