#include "hybridflow/parallel/sequence_parallel.h"

#include <ATen/ATen.h>

#include "hybridflow/core/error.h"
#include "parallel/collective_function.h"

namespace hybridflow {
namespace {

using collective_autograd::CollectiveFunction;

// [B, T / n, N, d] -> [B, T, N / n, d]: head chunk j is sent to rank j; chunk i received is sequence slice i.
at::Tensor scatter_heads(const at::Tensor& x, Communicator& comm) {
  const int64_t n = comm.size(), b = x.size(0), slice = x.size(1), heads = x.size(2), d = x.size(3);
  HF_CHECK(heads % n == 0, "sequence parallelism: ", heads, " heads do not split over ", n, " ranks");
  auto send = x.reshape({b, slice, n, heads / n, d}).permute({2, 0, 1, 3, 4}).contiguous();
  return comm.all_to_all(send).permute({1, 0, 2, 3, 4}).reshape({b, n * slice, heads / n, d});
}

// [B, T, N / n, d] -> [B, T / n, N, d]: sequence slice j is sent to rank j; chunk i received is head chunk i.
at::Tensor scatter_sequence(const at::Tensor& x, Communicator& comm) {
  const int64_t n = comm.size(), b = x.size(0), total = x.size(1), heads = x.size(2), d = x.size(3);
  HF_CHECK(total % n == 0, "sequence parallelism: a sequence of ", total, " positions does not split over ", n,
           " ranks");
  auto send = x.reshape({b, n, total / n, heads, d}).permute({1, 0, 2, 3, 4}).contiguous();
  return comm.all_to_all(send).permute({1, 2, 0, 3, 4}).reshape({b, total / n, n * heads, d});
}

// x [B, T / n, ...] -> [B, T, ...], and its backward: this rank's slice of the gradient times n (the gradient
// convention in the header).
at::Tensor gathered_sequence(const at::Tensor& x, Communicator& comm) { return comm.all_gather_cat(x.contiguous(), 1); }
at::Tensor own_sequence_slice_scaled(const at::Tensor& grad, Communicator& comm) {
  const int64_t slice = grad.size(1) / comm.size();
  return grad.narrow(1, comm.rank() * slice, slice) * static_cast<double>(comm.size());
}

using SequenceToHeads = CollectiveFunction<scatter_heads, scatter_sequence>;
using HeadsToSequence = CollectiveFunction<scatter_sequence, scatter_heads>;
using GatherSequence = CollectiveFunction<gathered_sequence, own_sequence_slice_scaled>;

void check_four_dims(const at::Tensor& x, const char* what) {
  HF_CHECK(x.dim() == 4, what, ": needs [batch, seq, heads, head_dim], got ", x.sizes());
}

}  // namespace

int64_t sequence_parallel_padded_length(int64_t length, int size) {
  HF_CHECK(size >= 1, "sequence-parallel size must be >= 1, got ", size);
  return (length + size - 1) / size * size;
}

at::Tensor sequence_to_head_split(const at::Tensor& x, const SequenceParallelGroup& sp) {
  if (!sp.enabled()) return x;
  check_four_dims(x, "sequence_to_head_split");
  return SequenceToHeads::apply(x, sp.comm());
}

at::Tensor head_to_sequence_split(const at::Tensor& x, const SequenceParallelGroup& sp) {
  if (!sp.enabled()) return x;
  check_four_dims(x, "head_to_sequence_split");
  return HeadsToSequence::apply(x, sp.comm());
}

at::Tensor gather_sequence(const at::Tensor& x, const SequenceParallelGroup& sp) {
  if (!sp.enabled()) return x;
  HF_CHECK(x.dim() >= 2, "gather_sequence: needs [batch, seq, ...], got ", x.sizes());
  return GatherSequence::apply(x, sp.comm());
}

}  // namespace hybridflow
