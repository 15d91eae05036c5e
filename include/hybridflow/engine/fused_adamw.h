// AdamW in one pass over each parameter. libtorch's torch::optim::AdamW::step composes the update from about
// ten tensor operations (two of them allocate a temporary the size of the parameter), so a step over a
// 0.5 B-parameter model streams ~45 GB through memory; this streams the parameter, its gradient and the two
// moments once (~14 GB there), in cache-sized blocks. The state stays in the optimizer's AdamWParamState, so
// saving, loading and inspecting it are unchanged.
//
// The result is libtorch's step to the bit on the CPU: every element is rounded as libtorch's kernels round
// it (fused multiply-adds where its AVX2 / AVX-512 kernels fuse them, separate roundings under its portable
// kernels, and its own square root, which in the x86 wheels is MKL's and not always correctly rounded).
// Runs with it are the runs optimizer.step() gave; tests/engine/test_fused_adamw.cpp compares step by step.
// Each element's result does not depend on where it sits, so a flat ZeRO partition and the whole parameter
// step identically.
#pragma once

#include <torch/torch.h>

namespace hybridflow {

// How fused_adamw_step takes a parameter.
enum class AdamWPath {
  // CPU float32 contiguous tensors: the one-pass loop, libtorch's step to the bit. Contiguous tensors of one
  // floating dtype on a GPU: libtorch's multi-tensor kernel (at::_fused_adamw_, what PyTorch's
  // AdamW(fused=True) runs), one launch per parameter group, device and dtype instead of about ten tensor
  // operations per parameter; it rounds otherwise than those operations. Anything else (a strided tensor,
  // mixed dtypes): libtorch's own tensor operations.
  kAuto,
  // The multi-tensor kernel for every contiguous parameter, on the CPU too (where libtorch has it as well):
  // for tests of the GPU path's arguments on a machine without one.
  kMultiTensor,
};

// One AdamW step over every parameter of `optimizer` that has a gradient, as optimizer.step() would take it
// (same state layout, step counts and options, amsgrad excluded).
// grad_scale folds the gradient-norm clip into the same pass: each gradient is first multiplied by it in
// place (to the bit what grad.mul_(coefficient) does with clip_grad_norm_'s clamped float coefficient),
// which spares the clip its own pass over every gradient. 1 leaves the gradients untouched.
void fused_adamw_step(torch::optim::AdamW& optimizer, float grad_scale = 1, AdamWPath path = AdamWPath::kAuto);

}  // namespace hybridflow
