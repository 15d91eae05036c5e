// The machines a plan is made for: how many devices, how they are grouped in nodes, and what one device
// can do. The cost simulator (placement/simulator.h) turns work into seconds with these numbers only.
//
// Named presets are data-sheet figures (peak dense bf16 matmul FLOP/s, HBM bandwidth, NVLink and one
// InfiniBand NIC per GPU) times efficiency factors that say how much of the peak real kernels reach
// (docs/placement.md lists every number and where it comes from). `this-machine` comes from
// `hybridflow plan --calibrate` instead (placement/calibration.h).
#pragma once

#include <string>
#include <vector>

namespace hybridflow::placement {

// Fixed costs that do not scale with FLOPs or bytes: what dominates small models and CPUs. On GPUs they
// are small assumptions; on this machine `hybridflow plan --calibrate` fits them to a measured run.
struct Overheads {
  double call_s = 0;            // one worker-group call: the controller's dispatch, messaging and collection
  double micro_batch_s = 0;     // one micro-batch through the model beyond its layers (loss, log-probs, bookkeeping)
  double layer_pass_s = 0;      // one decoder layer run once over one micro-batch (kernel launches, per-op cost)
  double decode_step_s = 0;     // one generation step beyond its layers (sampling, masks, stop checks)
  double iteration_s = 0;       // the controller's own work per RL step (scores, advantages, metrics)
};

struct ClusterSpec {
  std::string name;             // "a100-80g", "h100", "h200", "this-machine"
  int nodes = 1;
  int gpus_per_node = 8;
  double memory_bytes = 0;      // per device
  double memory_reserve = 0.1;  // fraction of memory_bytes never planned for (runtime context, fragmentation)
  double peak_flops = 0;        // per device, dense matmul in the model's dtype
  double memory_bandwidth = 0;  // per device, bytes/s
  double intra_node_bandwidth = 0;  // per device and direction, bytes/s (NVLink)
  double inter_node_bandwidth = 0;  // per device and direction, bytes/s (its share of the node's NICs)
  double intra_node_latency_s = 10e-6;  // per collective step
  double inter_node_latency_s = 20e-6;
  // Fractions of the peaks that kernels reach (model FLOPs utilisation, bandwidth utilisation).
  double train_efficiency = 0.45;     // forward + backward passes
  double forward_efficiency = 0.55;   // inference passes and prefill
  double decode_efficiency = 0.7;     // memory bandwidth while decoding
  double comm_efficiency = 0.8;       // collectives against link bandwidth
  // Devices that share compute (this machine: processes beyond its cores share them); 0 = none.
  int compute_units = 0;
  Overheads overheads;

  int devices() const { return nodes * gpus_per_node; }
  double usable_memory() const { return memory_bytes * (1.0 - memory_reserve); }
};

// Device names `hybridflow plan --gpu` knows besides this-machine: "a100-80g", "h100", "h200".
std::vector<std::string> gpu_preset_names();
// A cluster of `gpus` devices of a named preset, `gpus_per_node` to a node. Error naming the known presets
// for an unknown name, and for a device count that is not whole nodes (or one partial node).
ClusterSpec gpu_cluster(const std::string& gpu, int gpus, int gpus_per_node);
// The same shape from a calibrated device (peaks and overheads of `device`, e.g. this machine's).
ClusterSpec cluster_of(const ClusterSpec& device, int gpus, int gpus_per_node);

}  // namespace hybridflow::placement
