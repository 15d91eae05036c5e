// AdamW in one pass over each parameter. libtorch's torch::optim::AdamW::step composes the update from about
// ten tensor operations (two of them allocate a temporary the size of the parameter), so a step over a
// 0.5 B-parameter model streams ~45 GB through memory; this streams the parameter, its gradient and the two
// moments once (~14 GB there). The state stays in the optimizer's AdamWParamState, so saving, loading and
// inspecting it are unchanged.
//
// The arithmetic is AdamW's (decoupled decay, bias-corrected moments, eps added after the square root), in
// float32 with the constants rounded as libtorch rounds them; it is the same for every element wherever it
// sits in a tensor, so a flat ZeRO partition and the whole parameter give identical results. It is not
// bitwise libtorch's step (those kernels may fuse multiply-adds): runs compare with runs of this step.
#pragma once

#include <torch/torch.h>

namespace hybridflow {

// One AdamW step over every parameter of `optimizer` that has a gradient, as optimizer.step() would take it
// (same state layout, step counts and options, amsgrad excluded). CPU float32 contiguous tensors take the
// fused loop; any other tensor (a GPU's) the tensor operations with the same arithmetic.
void fused_adamw_step(torch::optim::AdamW& optimizer);

}  // namespace hybridflow
