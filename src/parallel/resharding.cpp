#include "hybridflow/parallel/resharding.h"

#include "hybridflow/core/error.h"

namespace hybridflow {

ReshardMode parse_reshard_mode(const std::string& name) {
  if (name == "hybridflow") return ReshardMode::kHybridFlow;
  if (name == "hybridflow-v") return ReshardMode::kHybridFlowV;
  if (name == "allgather") return ReshardMode::kAllGather;
  HF_FAIL("unknown resharding mode '", name, "'; expected hybridflow, hybridflow-v or allgather");
}

std::string reshard_mode_name(ReshardMode mode) {
  switch (mode) {
    case ReshardMode::kHybridFlow: return "hybridflow";
    case ReshardMode::kHybridFlowV: return "hybridflow-v";
    case ReshardMode::kAllGather: return "allgather";
  }
  return "?";
}

ReshardCost paper_reshard_cost(ReshardMode mode, const GenerationLayout& layout, int64_t model_bytes) {
  const int64_t tp = static_cast<int64_t>(layout.train().tp()) * layout.train().pp();
  const int64_t gen = static_cast<int64_t>(layout.gen_tp()) * layout.gen_pp();
  const int64_t world = tp * layout.train().dp();
  ReshardCost cost;
  switch (mode) {
    case ReshardMode::kAllGather:
      cost.bytes_received = (world - 1) * model_bytes / world;
      cost.generation_weight_bytes = model_bytes;
      break;
    case ReshardMode::kHybridFlowV:
      cost.bytes_received = (tp - 1) * model_bytes / tp;
      cost.generation_weight_bytes = model_bytes;
      break;
    case ReshardMode::kHybridFlow:
      cost.bytes_received = (tp - gen) * model_bytes / (gen * tp);
      cost.generation_weight_bytes = model_bytes / gen;
      break;
  }
  return cost;
}

std::vector<std::vector<int>> vanilla_generation_tp_groups(const GenerationLayout& layout) {
  HF_CHECK(layout.gen_pp() == layout.train().pp() || layout.gen_pp() == 1, "hybridflow-v resharding keeps the ",
           "pipeline stages or generates unstaged: generation pp ", layout.gen_pp(), " must equal training pp ",
           layout.train().pp(), " or be 1");
  std::vector<std::vector<int>> groups;
  for (const auto& tp_group : layout.train().tp_groups())
    for (size_t begin = 0; begin < tp_group.size(); begin += layout.gen_tp())
      groups.emplace_back(tp_group.begin() + begin, tp_group.begin() + begin + layout.gen_tp());
  return groups;
}

}  // namespace hybridflow
