// Megatron-style tensor parallelism: the autograd-aware collectives that mark where a tensor-parallel region
// begins and ends, and vocabulary-parallel log-probabilities and entropy that never gather the vocabulary.
//
// Convention (as in Megatron-LM): activations outside a region are replicated on every rank of the group,
// and so is the loss computed from them. A column-parallel linear takes its input through
// copy_to_tensor_parallel (identity forward; its backward sums the partial input gradients of the ranks),
// a row-parallel linear returns through reduce_from_tensor_parallel (sums the partial outputs; the
// gradient of a replicated output is already whole, so its backward is the identity).
//
// Every function here is the identity (or plain local math) for a group of size 1, so model code calls them
// unconditionally. The model layer talks to other ranks only through this header.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "hybridflow/parallel/collectives.h"

namespace hybridflow {

// A tensor-parallel group (collectives.h).
using TensorParallelGroup = ParallelGroup;

// This rank's part of `total` items split evenly over `parts`: [start, start + length). Throws naming
// `what` (e.g. "num_attention_heads") when total does not divide by parts.
struct Partition {
  int64_t start = 0;
  int64_t length = 0;
};
Partition even_partition(int64_t total, int parts, int index, const std::string& what);

// Forward: x. Backward: the gradient summed over the group.
at::Tensor copy_to_tensor_parallel(const at::Tensor& x, const TensorParallelGroup& tp);
// Forward: x summed over the group. Backward: the gradient unchanged.
at::Tensor reduce_from_tensor_parallel(const at::Tensor& x, const TensorParallelGroup& tp);
// Forward: the ranks' x concatenated along the last dim (rank order). Backward: this rank's slice.
at::Tensor gather_from_tensor_parallel(const at::Tensor& x, const TensorParallelGroup& tp);
// Rows (dim 0) of a replicated x split over the group, for work the ranks share out (experts folded over the
// tensor-parallel ranks): forward, this rank's chunk of the rows (rank r: rows [r R / n, (r + 1) R / n); R must
// divide by n); backward, the ranks' chunks of the gradient concatenated (whole on every rank, as a replicated
// tensor's gradient is).
at::Tensor scatter_rows_to_tensor_parallel(const at::Tensor& x, const TensorParallelGroup& tp);
// Its inverse: forward, the ranks' chunks concatenated along the rows; backward, this rank's chunk.
at::Tensor gather_rows_from_tensor_parallel(const at::Tensor& x, const TensorParallelGroup& tp);

// local_logits [..., V/t]: this rank's vocabulary slice [rank*V/t, (rank+1)*V/t) of the logits; targets
// [...] int64 in [0, V). Returns log softmax(logits)[target] over the whole vocabulary, computed in float32
// with three all-reduces of [...]-sized tensors (max, sum of exp, target logit); differentiable.
at::Tensor vocab_parallel_log_probs(const at::Tensor& local_logits, const at::Tensor& targets,
                                    const TensorParallelGroup& tp);
// Entropy of softmax(logits) over the whole vocabulary from the same slices; differentiable.
at::Tensor vocab_parallel_entropy(const at::Tensor& local_logits, const TensorParallelGroup& tp);

}  // namespace hybridflow
