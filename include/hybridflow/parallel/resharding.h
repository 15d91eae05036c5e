// The 3D-HybridEngine's ways of moving the actor's weights from its training layout (p, t, d) to its
// generation layout (p_g, t_g, d_g), and what each costs per rank according to the HybridFlow paper's
// Table 2, with M the bytes of the weights that model parallelism splits:
//
//   mode           all-gather group           bytes received per rank          generation weights  redundant
//   allgather      the whole world (t*p*d)    (t*p*d - 1) / (t*p*d) * M         M                   training shard
//   hybridflow-v   the training model-        (t*p - 1) / (t*p) * M             M                   training shard
//                  parallel group (t*p)
//   hybridflow     the micro-DP group         (t*p - t_g*p_g) / (t_g*p_g*t*p) * M   M / (t_g*p_g)   0
//                  (t*p / (t_g*p_g) ranks)
//
// allgather is DeepSpeed-Chat's hybrid engine: every rank contributes 1/(t*p*d) of the model and gathers all
// of it. hybridflow-v gathers the full model inside the training model-parallel group and generates with
// consecutive generation groups, whose shards need not contain the rank's training shard. hybridflow groups
// ranks so that each rank's training shard is part of its generation shard (device_mesh.h), so it gathers
// only the rest, reusing the training shard's memory in place.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hybridflow/parallel/device_mesh.h"

namespace hybridflow {

enum class ReshardMode { kHybridFlow, kHybridFlowV, kAllGather };

// "hybridflow" | "hybridflow-v" | "allgather"; anything else is an error naming the three.
ReshardMode parse_reshard_mode(const std::string& name);
std::string reshard_mode_name(ReshardMode mode);

// Table 2's figures for one rank, in bytes, for a model whose split weights take model_bytes.
struct ReshardCost {
  int64_t bytes_received = 0;      // = bytes sent: every rank passes on what it contributes, once per peer
  int64_t generation_weight_bytes = 0;  // weights the generation layout holds at the switch's peak
};
ReshardCost paper_reshard_cost(ReshardMode mode, const GenerationLayout& layout, int64_t model_bytes);

// What one switch did on one rank, measured.
struct ReshardStats {
  std::string mode;
  int64_t model_bytes = 0;       // M: the split weights of the whole model
  int64_t replicated_bytes = 0;  // weights every rank holds in both layouts (norms, ...): never moved
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  // Weight memory the switch allocated and held at its peak (training shards reused in place count in it,
  // as the generation weights they become part of).
  int64_t peak_extra_weight_bytes = 0;
  // Training weights held apart from the generation weights while generating.
  int64_t redundant_bytes = 0;
  double seconds = 0;
  // Mixture-of-experts layers' experts under expert parallelism (engine/expert_reshard.h): the part of the
  // figures above that is experts (bytes_sent, bytes_received, peak_extra_weight_bytes and redundant_bytes
  // include it), and the bytes of every expert of the model (not in model_bytes, which tensor parallelism splits).
  int64_t expert_model_bytes = 0;
  int64_t expert_bytes_sent = 0;
  int64_t expert_bytes_received = 0;
  int64_t expert_peak_extra_weight_bytes = 0;
  int64_t expert_redundant_bytes = 0;
};

// hybridflow-v's generation tensor-parallel groups: consecutive blocks of t_g ranks inside each training
// tensor-parallel group (pipeline stages are kept, p_g == p, or generation is unstaged, p_g == 1).
std::vector<std::vector<int>> vanilla_generation_tp_groups(const GenerationLayout& layout);

}  // namespace hybridflow
