#include "hybridflow/parallel/tensor_parallel.h"

#include <ATen/ATen.h>

#include <cstdint>

#include "hybridflow/core/error.h"
#include "parallel/collective_function.h"

namespace hybridflow {
namespace {

using collective_autograd::CollectiveFunction;

at::Tensor summed(const at::Tensor& x, Communicator& comm) {
  at::Tensor out = x.clone(at::MemoryFormat::Contiguous);
  comm.all_reduce(out, ReduceOp::kSum);
  return out;
}
at::Tensor unchanged(const at::Tensor& x, Communicator&) { return x; }
at::Tensor same_view(const at::Tensor& x, Communicator&) { return x.view_as(x); }
// The ranks' x concatenated along the last dim, and its backward: this rank's slice of that dim.
at::Tensor gathered_last_dim(const at::Tensor& x, Communicator& comm) {
  return comm.all_gather_cat(x.contiguous(), x.dim() - 1);
}
at::Tensor own_last_dim_slice(const at::Tensor& grad, Communicator& comm) {
  const int64_t width = grad.size(-1) / comm.size();
  return grad.narrow(-1, comm.rank() * width, width).contiguous();
}

// Rows (dim 0): this rank's chunk, and the ranks' chunks concatenated.
at::Tensor own_rows(const at::Tensor& x, Communicator& comm) {
  HF_CHECK(x.dim() >= 1 && x.size(0) % comm.size() == 0, "scatter_rows_to_tensor_parallel: ", x.size(0),
           " rows do not split over ", comm.size(), " tensor-parallel ranks");
  const int64_t rows = x.size(0) / comm.size();
  return x.narrow(0, comm.rank() * rows, rows).contiguous();
}
at::Tensor gathered_rows(const at::Tensor& x, Communicator& comm) { return comm.all_gather_cat(x.contiguous(), 0); }

using CopyToRegion = CollectiveFunction<same_view, summed>;
using ReduceFromRegion = CollectiveFunction<summed, unchanged>;
using GatherFromRegion = CollectiveFunction<gathered_last_dim, own_last_dim_slice>;
using ScatterRows = CollectiveFunction<own_rows, gathered_rows>;
using GatherRows = CollectiveFunction<gathered_rows, own_rows>;

// Logits shifted by the global maximum (a constant for autograd, as in any stable softmax).
at::Tensor shifted_by_global_max(const at::Tensor& local_logits, const TensorParallelGroup& tp) {
  at::Tensor z = local_logits.to(at::kFloat);
  at::Tensor max;
  {
    at::NoGradGuard no_grad;
    max = std::get<0>(z.detach().max(-1, /*keepdim=*/true)).contiguous();
    if (tp.enabled()) tp.comm()->all_reduce(max, ReduceOp::kMax);
  }
  return z - max;
}

}  // namespace

Partition even_partition(int64_t total, int parts, int index, const std::string& what) {
  HF_CHECK(parts >= 1 && index >= 0 && index < parts, "even_partition: index ", index, " of ", parts, " parts");
  HF_CHECK(total % parts == 0, what, " = ", total, " does not divide by the tensor-parallel size ", parts,
           "; choose a tensor_model_parallel_size that divides it");
  const int64_t length = total / parts;
  return {index * length, length};
}

at::Tensor copy_to_tensor_parallel(const at::Tensor& x, const TensorParallelGroup& tp) {
  return tp.enabled() ? CopyToRegion::apply(x, tp.comm()) : x;
}

at::Tensor reduce_from_tensor_parallel(const at::Tensor& x, const TensorParallelGroup& tp) {
  return tp.enabled() ? ReduceFromRegion::apply(x, tp.comm()) : x;
}

at::Tensor gather_from_tensor_parallel(const at::Tensor& x, const TensorParallelGroup& tp) {
  return tp.enabled() ? GatherFromRegion::apply(x, tp.comm()) : x;
}

at::Tensor scatter_rows_to_tensor_parallel(const at::Tensor& x, const TensorParallelGroup& tp) {
  return tp.enabled() ? ScatterRows::apply(x, tp.comm()) : x;
}

at::Tensor gather_rows_from_tensor_parallel(const at::Tensor& x, const TensorParallelGroup& tp) {
  return tp.enabled() ? GatherRows::apply(x, tp.comm()) : x;
}

at::Tensor vocab_parallel_log_probs(const at::Tensor& local_logits, const at::Tensor& targets,
                                    const TensorParallelGroup& tp) {
  HF_CHECK(local_logits.dim() == targets.dim() + 1 &&
               local_logits.sizes().slice(0, targets.dim()) == targets.sizes(),
           "vocab_parallel_log_probs: logits ", local_logits.sizes(), " do not match targets ", targets.sizes());
  at::Tensor shifted = shifted_by_global_max(local_logits, tp);
  const int64_t width = shifted.size(-1);
  at::Tensor sum_exp = reduce_from_tensor_parallel(shifted.exp().sum(-1), tp);
  at::Tensor local_target = targets.to(at::kLong) - static_cast<int64_t>(tp.rank()) * width;
  at::Tensor mine = local_target.ge(0).logical_and(local_target.lt(width));
  at::Tensor picked = shifted.gather(-1, local_target.clamp(0, width - 1).unsqueeze(-1)).squeeze(-1);
  picked = reduce_from_tensor_parallel(at::where(mine, picked, at::zeros_like(picked)), tp);
  return picked - sum_exp.log();
}

at::Tensor vocab_parallel_entropy(const at::Tensor& local_logits, const TensorParallelGroup& tp) {
  at::Tensor shifted = shifted_by_global_max(local_logits, tp);
  at::Tensor exp = shifted.exp();
  at::Tensor sum_exp = reduce_from_tensor_parallel(exp.sum(-1), tp);
  at::Tensor weighted = reduce_from_tensor_parallel((exp * shifted).sum(-1), tp);
  // H = log S - sum(p * z') with p = exp(z') / S and z' the shifted logits.
  return sum_exp.log() - weighted / sum_exp;
}

}  // namespace hybridflow
