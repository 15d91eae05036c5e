#include "hybridflow/placement/hardware.h"

#include <algorithm>

#include "hybridflow/core/error.h"

namespace hybridflow::placement {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Data-sheet figures: dense bf16 tensor-core peak, HBM bandwidth, NVLink per direction (half the quoted
// bidirectional figure), one InfiniBand NIC per GPU (A100: HDR 200 Gb/s, H100/H200: NDR 400 Gb/s).
// Fixed overheads are assumptions for a Megatron + vLLM-style stack (docs/placement.md).
ClusterSpec preset(const std::string& name) {
  ClusterSpec c;
  c.name = name;
  c.overheads.call_s = 0.02;
  c.overheads.micro_batch_s = 1e-3;
  c.overheads.layer_pass_s = 20e-6;
  c.overheads.decode_step_s = 1e-3;
  c.overheads.iteration_s = 0.2;
  if (name == "a100-80g") {
    c.memory_bytes = 80 * kGiB;
    c.peak_flops = 312e12;
    c.memory_bandwidth = 2.039e12;
    c.intra_node_bandwidth = 300e9;
    c.inter_node_bandwidth = 25e9;
  } else if (name == "h100") {
    c.memory_bytes = 80 * kGiB;
    c.peak_flops = 989e12;
    c.memory_bandwidth = 3.35e12;
    c.intra_node_bandwidth = 450e9;
    c.inter_node_bandwidth = 50e9;
  } else if (name == "h200") {
    c.memory_bytes = 140 * kGiB;  // 143,771 MiB as nvidia-smi and cudaMemGetInfo report it
    c.peak_flops = 989e12;
    c.memory_bandwidth = 4.8e12;
    c.intra_node_bandwidth = 450e9;
    c.inter_node_bandwidth = 50e9;
  } else {
    HF_FAIL("unknown --gpu '", name, "'; expected a100-80g, h100, h200 or this-machine");
  }
  return c;
}

}  // namespace

std::vector<std::string> gpu_preset_names() { return {"a100-80g", "h100", "h200"}; }

ClusterSpec cluster_of(const ClusterSpec& device, int gpus, int gpus_per_node) {
  HF_CHECK(gpus >= 1, "--gpus must be at least 1, got ", gpus);
  HF_CHECK(gpus_per_node >= 1, "--gpus-per-node must be at least 1, got ", gpus_per_node);
  HF_CHECK(gpus <= gpus_per_node || gpus % gpus_per_node == 0, "--gpus ", gpus, " is not a whole number of nodes of ",
           "--gpus-per-node ", gpus_per_node);
  ClusterSpec c = device;
  c.gpus_per_node = std::min(gpus, gpus_per_node);
  c.nodes = gpus <= gpus_per_node ? 1 : gpus / gpus_per_node;
  return c;
}

ClusterSpec gpu_cluster(const std::string& gpu, int gpus, int gpus_per_node) {
  return cluster_of(preset(gpu), gpus, gpus_per_node);
}

}  // namespace hybridflow::placement
