#include "model/lora_branch.h"

#include <cmath>

#include "hybridflow/core/error.h"

namespace hybridflow::lora {

torch::Tensor Branch::delta_weight() const { return B->weight.mm(A->weight) * scaling; }

void Branch::merge(torch::nn::Linear& base) {
  HF_CHECK(!merged(), "LoRA: merge of an adapter that is already merged");
  torch::NoGradGuard no_grad;
  original_weight = base->weight.detach().clone();
  base->weight.add_(delta_weight());
}

void Branch::unmerge(torch::nn::Linear& base) {
  HF_CHECK(merged(), "LoRA: unmerge of an adapter that is not merged");
  torch::NoGradGuard no_grad;
  base->weight.copy_(original_weight);
  original_weight = torch::Tensor();
}

std::shared_ptr<Branch> attach_branch(torch::nn::Linear& base, int64_t rank, double alpha, at::Generator& generator,
                                      ShardDim base_split, const TensorParallelGroup& tp) {
  const auto& w = base->weight;
  HF_CHECK(w.dim() == 2, "LoRA: a projection weight of shape ", w.sizes(), " (expected [out, in])");
  const int64_t out = w.size(0), in = w.size(1);
  auto branch = std::make_shared<Branch>();
  branch->scaling = alpha / static_cast<double>(rank);
  if (tp.enabled() && base_split != ShardDim::kReplicated) {
    branch->base_split = base_split;
    branch->tp = tp;
  }
  branch->A = base->register_module("lora_A", torch::nn::Linear(torch::nn::LinearOptions(in, rank).bias(false)));
  branch->B = base->register_module("lora_B", torch::nn::Linear(torch::nn::LinearOptions(rank, out).bias(false)));
  torch::NoGradGuard no_grad;
  // The whole model's A (its input width, its draw), then this rank's columns of it for a row-parallel base.
  const bool split_input = branch->base_split == ShardDim::kColumns;
  const int64_t full_in = split_input ? in * tp.size() : in;
  const double bound = 1.0 / std::sqrt(static_cast<double>(full_in));
  auto a = torch::empty({rank, full_in}, torch::kFloat32).uniform_(-bound, bound, generator);
  if (split_input) a = shard_of(a, ShardDim::kColumns, tp.rank(), tp.size());
  branch->A->weight.set_data(a.contiguous().to(w.options()));
  branch->B->weight.set_data(torch::zeros({out, rank}, w.options()));
  return branch;
}

torch::Tensor add_branch(const torch::Tensor& y, const std::shared_ptr<Branch>& branch, const torch::Tensor& x) {
  // PEFT's order: the base layer's output (bias included), then the scaled low-rank term added to it.
  if (!branch || !branch->active()) return y;
  return y + branch->B(branch->A(x)) * branch->scaling;
}

torch::Tensor project(torch::nn::Linear& base, const std::shared_ptr<Branch>& branch, const torch::Tensor& x,
                      const torch::Tensor& x_tp) {
  auto y = base(x_tp);
  if (!branch || !branch->active()) return y;
  // Identity in the forward pass; backward, the ranks' partial gradients of A x (each from its rows of B)
  // summed, so A's gradient and the input's are whole.
  return y + branch->B(copy_to_tensor_parallel(branch->A(x), branch->tp)) * branch->scaling;
}

bool joins_row_parallel_reduce(const std::shared_ptr<Branch>& branch) {
  return branch && branch->active() && branch->base_split == ShardDim::kColumns;
}

torch::Tensor row_parallel_partial(const Branch& branch, const torch::Tensor& x_rank) {
  // B whole on every rank, its gradient the sum of the ranks' partial products' gradients: copy_to.
  return torch::linear(torch::linear(x_rank, branch.A->weight), copy_to_tensor_parallel(branch.B->weight, branch.tp)) *
         branch.scaling;
}

}  // namespace hybridflow::lora
