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

std::shared_ptr<Branch> attach_branch(torch::nn::Linear& base, int64_t rank, double alpha, at::Generator& generator) {
  const auto& w = base->weight;
  HF_CHECK(w.dim() == 2, "LoRA: a projection weight of shape ", w.sizes(), " (expected [out, in])");
  const int64_t out = w.size(0), in = w.size(1);
  auto branch = std::make_shared<Branch>();
  branch->scaling = alpha / static_cast<double>(rank);
  branch->A = base->register_module("lora_A", torch::nn::Linear(torch::nn::LinearOptions(in, rank).bias(false)));
  branch->B = base->register_module("lora_B", torch::nn::Linear(torch::nn::LinearOptions(rank, out).bias(false)));
  torch::NoGradGuard no_grad;
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  auto a = torch::empty({rank, in}, torch::kFloat32).uniform_(-bound, bound, generator);
  branch->A->weight.set_data(a.to(w.options()));
  branch->B->weight.set_data(torch::zeros({out, rank}, w.options()));
  return branch;
}

torch::Tensor add_branch(const torch::Tensor& y, const std::shared_ptr<Branch>& branch, const torch::Tensor& x) {
  // PEFT's order: the base layer's output (bias included), then the scaled low-rank term added to it.
  if (!branch || !branch->active()) return y;
  return y + branch->B(branch->A(x)) * branch->scaling;
}

torch::Tensor project(torch::nn::Linear& base, const std::shared_ptr<Branch>& branch, const torch::Tensor& x) {
  return add_branch(base(x), branch, x);
}

}  // namespace hybridflow::lora
