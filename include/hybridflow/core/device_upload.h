// Host-built tensors (block tables, lengths, random draws) sent to the device a step runs on.
#pragma once

#include <torch/torch.h>

namespace hybridflow {

// `host` on `device` without waiting for the device's queued work: from pinned memory the copy is queued behind
// that work (a pageable copy synchronises the host). On the CPU the tensor itself.
inline torch::Tensor upload(const torch::Tensor& host, const torch::Device& device) {
  if (device.is_cpu()) return host;
  return host.pin_memory().to(device, /*non_blocking=*/true);
}

}  // namespace hybridflow
