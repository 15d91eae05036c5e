// Collecting named tensors that different ranks hold onto one rank: a pipeline-parallel model's stages
// each hold some layers, and a checkpoint writes them as one file. Names and shapes travel with the data,
// so the root needs to know nothing of the others' tensors in advance.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <map>
#include <string>

#include "hybridflow/parallel/collectives.h"

namespace hybridflow {

// Collective over `group`: every rank sends its float32 tensors to `root`, which returns the union of all
// ranks' (where two ranks hold a name, the lower rank's); the other ranks return an empty map. Tensors
// travel through `device` (the group's backend's: CPU for Gloo, the rank's GPU for NCCL) and come back on
// the CPU. Throws naming the tensor when one is not float32.
std::map<std::string, at::Tensor> gather_named_tensors(const std::map<std::string, at::Tensor>& mine,
                                                       Communicator& group, int root, c10::Device device);

}  // namespace hybridflow
