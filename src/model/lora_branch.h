// One LoRA-adapted projection of the decoder (internal to the model layer): y = W x + b + scaling * B(A x),
// with A [r, in] and B [out, r] registered on the base torch::nn::Linear as its children "lora_A" and
// "lora_B", so that the model's parameter names are the base names plus ".lora_A.weight" / ".lora_B.weight"
// (PEFT's names without its "base_model.model." prefix and adapter name).
//
// Under tensor parallelism the adapter splits with its base weight (model/tensor_parallel_layout.h):
//   column-parallel base W [out/t, in]: B [out/t, r] split by output rows, A [r, in] whole on every rank. A
//     sees the replicated input and its output enters the region through copy_to_tensor_parallel, whose
//     backward sums the ranks' partial gradients of A x: A's gradient is whole on every rank.
//   row-parallel base W [out, in/t]: A [r, in/t] split by input columns, B [out, r] whole. Each rank's
//     scaling * B (A_rank x_rank) joins W_rank x_rank before the base's all-reduce (no collective of its own);
//     B enters through copy_to_tensor_parallel, so its gradient, a sum over the ranks' partial products, is
//     summed in the backward pass.
//   replicated base (k/v_proj with fewer KV heads than ranks): A and B whole, computed as in one process.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>

#include "hybridflow/model/tensor_parallel_layout.h"
#include "hybridflow/parallel/tensor_parallel.h"

namespace hybridflow::lora {

struct Branch {
  torch::nn::Linear A{nullptr}, B{nullptr};
  double scaling = 1.0;
  bool enabled = true;
  // The base weight's split: kRows for a column-parallel base, kColumns for a row-parallel one.
  ShardDim base_split = ShardDim::kReplicated;
  TensorParallelGroup tp;  // default (one process) for a replicated base
  // The base weight as it was before merge(): restored as is by unmerge(), so a merge/unmerge cycle leaves
  // the weight bit for bit unchanged (W + dW - dW is not W in floating point). Defined while merged.
  torch::Tensor original_weight;

  bool merged() const { return original_weight.defined(); }
  // Whether forward() must add the branch: merged weights already hold it, a disabled branch is skipped.
  bool active() const { return enabled && !merged(); }
  // scaling * B A, in the order and dtype PEFT's get_delta_weight computes it.
  torch::Tensor delta_weight() const;
  void merge(torch::nn::Linear& base);
  void unmerge(torch::nn::Linear& base);
};

// Adds a rank-r branch to `base` (registered as its children), A drawn as PEFT does (kaiming-uniform with
// a = sqrt(5): uniform(-1/sqrt(in), 1/sqrt(in))) from `generator`, B zeros, both in the base weight's dtype
// and device. `base_split` is how tensor parallelism splits the base weight over `tp`: the whole model's A
// is drawn and this rank keeps its columns of it when the base is row-parallel, so every layout holds the
// adapters one process draws.
std::shared_ptr<Branch> attach_branch(torch::nn::Linear& base, int64_t rank, double alpha, at::Generator& generator,
                                      ShardDim base_split = ShardDim::kReplicated, const TensorParallelGroup& tp = {});

// y + scaling * B(A x) when there is a branch and it is active, else y (the same tensor). The one-process
// form (and the replicated base's): the branch sees the whole input and adds to the whole output.
torch::Tensor add_branch(const torch::Tensor& y, const std::shared_ptr<Branch>& branch, const torch::Tensor& x);
// A column-parallel (or replicated) projection: base(x_tp) plus, when there is an active branch, its term
// computed from the replicated input x (x_tp is x as it enters the tensor-parallel region).
torch::Tensor project(torch::nn::Linear& base, const std::shared_ptr<Branch>& branch, const torch::Tensor& x,
                      const torch::Tensor& x_tp);
// Whether a row-parallel projection adds the branch to its partial product before the all-reduce (a split
// adapter) rather than after it (one process: PEFT's order, the base output with its bias first).
bool joins_row_parallel_reduce(const std::shared_ptr<Branch>& branch);
// A row-parallel branch's partial product for this rank's input slice: scaling * B (A_rank x_rank).
torch::Tensor row_parallel_partial(const Branch& branch, const torch::Tensor& x_rank);

}  // namespace hybridflow::lora
