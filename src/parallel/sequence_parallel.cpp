#include "hybridflow/parallel/sequence_parallel.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "hybridflow/core/error.h"

namespace hybridflow {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The communicator travels through the autograd graph as an integer in the context's saved data.
void save_sequence_comm(AutogradContext* ctx, Communicator* comm) {
  ctx->saved_data["sp_comm"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(comm));
}
Communicator& saved_sequence_comm(AutogradContext* ctx) {
  return *reinterpret_cast<Communicator*>(static_cast<intptr_t>(ctx->saved_data["sp_comm"].toInt()));
}

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

struct SequenceToHeads : torch::autograd::Function<SequenceToHeads> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* comm) {
    save_sequence_comm(ctx, comm);
    return scatter_heads(x, *comm);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {scatter_sequence(grads[0], saved_sequence_comm(ctx)), at::Tensor()};
  }
};

struct HeadsToSequence : torch::autograd::Function<HeadsToSequence> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* comm) {
    save_sequence_comm(ctx, comm);
    return scatter_sequence(x, *comm);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {scatter_heads(grads[0], saved_sequence_comm(ctx)), at::Tensor()};
  }
};

struct GatherSequence : torch::autograd::Function<GatherSequence> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* comm) {
    save_sequence_comm(ctx, comm);
    ctx->saved_data["slice"] = x.size(1);
    return comm->all_gather_cat(x.contiguous(), 1);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Communicator& comm = saved_sequence_comm(ctx);
    const int64_t slice = ctx->saved_data["slice"].toInt();
    return {grads[0].narrow(1, comm.rank() * slice, slice) * static_cast<double>(comm.size()), at::Tensor()};
  }
};

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
