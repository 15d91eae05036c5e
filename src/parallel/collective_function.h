// The autograd plumbing shared by the parallel groups' differentiable collectives (tensor_parallel.cpp,
// sequence_parallel.cpp, expert_parallel.cpp): the group's communicator kept in an autograd context for the
// backward, and a function whose forward and backward are each one transform over that communicator.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/custom_function.h>

#include "hybridflow/parallel/collectives.h"

namespace hybridflow::collective_autograd {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The communicator travels through the autograd graph as an integer in the context's saved data.
void save_comm(AutogradContext* ctx, Communicator* comm);
Communicator& saved_comm(AutogradContext* ctx);

using Transform = at::Tensor (*)(const at::Tensor&, Communicator&);

// Forward: Forward(x, comm). Backward: Backward(gradient, comm). The communicator is not differentiable.
template <Transform Forward, Transform Backward>
struct CollectiveFunction : torch::autograd::Function<CollectiveFunction<Forward, Backward>> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* comm) {
    save_comm(ctx, comm);
    return Forward(x, *comm);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {Backward(grads[0], saved_comm(ctx)), at::Tensor()};
  }
};

}  // namespace hybridflow::collective_autograd
