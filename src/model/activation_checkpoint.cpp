#include "hybridflow/model/activation_checkpoint.h"

#include <torch/csrc/autograd/custom_function.h>

#include "hybridflow/core/error.h"

namespace hybridflow {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The function travels with the autograd node (a capsule in its saved data) until the backward pass.
struct SavedFn : torch::CustomClassHolder {
  explicit SavedFn(TensorFn f) : fn(std::move(f)) {}
  TensorFn fn;
};

struct Checkpoint : torch::autograd::Function<Checkpoint> {
  // Runs with gradients off (as every custom function's forward does): no graph, no saved activations.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const TensorFn* fn) {
    ctx->saved_data["fn"] = c10::IValue::make_capsule(c10::make_intrusive<SavedFn>(*fn));
    ctx->save_for_backward({x});
    return (*fn)(x);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto capsule = ctx->saved_data["fn"].toCapsule();
    const TensorFn& fn = static_cast<const SavedFn*>(capsule.get())->fn;
    torch::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    torch::Tensor out;
    {
      // The backward pass runs with gradient mode off unless it builds a higher-order graph.
      at::AutoGradMode with_grad(true);
      out = fn(x);
    }
    HF_CHECK(out.sizes() == grads[0].sizes(), "activation checkpoint: the recomputed output has shape ", out.sizes(),
             ", the first pass's gradient ", grads[0].sizes());
    // A nested (reentrant) backward: parameters accumulate their gradients where they always do.
    torch::autograd::backward({out}, {grads[0]});
    return {x.grad(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor checkpointed(const TensorFn& fn, const torch::Tensor& x) {
  if (!torch::GradMode::is_enabled() || !x.requires_grad()) return fn(x);
  return Checkpoint::apply(x, &fn);
}

}  // namespace hybridflow
