// One LoRA-adapted projection of the decoder (internal to the model layer): y = W x + b + scaling * B(A x),
// with A [r, in] and B [out, r] registered on the base torch::nn::Linear as its children "lora_A" and
// "lora_B", so that the model's parameter names are the base names plus ".lora_A.weight" / ".lora_B.weight"
// (PEFT's names without its "base_model.model." prefix and adapter name).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>

namespace hybridflow::lora {

struct Branch {
  torch::nn::Linear A{nullptr}, B{nullptr};
  double scaling = 1.0;
  bool enabled = true;
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
// and device.
std::shared_ptr<Branch> attach_branch(torch::nn::Linear& base, int64_t rank, double alpha, at::Generator& generator);

// y + scaling * B(A x) when there is a branch and it is active, else y (the same tensor).
torch::Tensor add_branch(const torch::Tensor& y, const std::shared_ptr<Branch>& branch, const torch::Tensor& x);
// base(x), plus the branch when there is one and it is active.
torch::Tensor project(torch::nn::Linear& base, const std::shared_ptr<Branch>& branch, const torch::Tensor& x);

}  // namespace hybridflow::lora
