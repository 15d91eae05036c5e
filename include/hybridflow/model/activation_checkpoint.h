// Activation checkpointing: a function of one tensor run without keeping its intermediate activations for
// the backward pass, which runs it again instead (PyTorch's reentrant torch.utils.checkpoint).
#pragma once

#include <torch/torch.h>

#include <functional>

namespace hybridflow {

using TensorFn = std::function<torch::Tensor(const torch::Tensor&)>;

// fn(x), keeping only x. The backward re-runs fn on x with gradients on and backpropagates the incoming
// gradient through it: the parameters fn uses get their gradients as usual, x gets its own. fn must give
// the same values when run again (no random draws, no state it changes) and must stay callable until the
// backward pass. With gradients off, or an x that needs none (nothing to recompute for), fn simply runs.
torch::Tensor checkpointed(const TensorFn& fn, const torch::Tensor& x);

}  // namespace hybridflow
