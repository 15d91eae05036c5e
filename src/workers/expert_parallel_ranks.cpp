#include "hybridflow/workers/expert_parallel_ranks.h"

#include "hybridflow/core/error.h"
#include "hybridflow/parallel/device_mesh.h"

namespace hybridflow {

ExpertParallelShape expert_parallel_shape(int size, int tp, int dp, const std::string& key) {
  HF_CHECK(size >= 1, key, " must be >= 1, got ", size);
  if (tp > 1 && size % tp == 0 && dp % (size / tp) == 0) return {tp, size / tp};
  HF_CHECK(dp % size == 0, key, " = ", size, " does not divide the role's ", dp, " data-parallel processes",
           tp > 1 ? " and is not a multiple of tensor_model_parallel_size " + std::to_string(tp) +
                        " dividing them (experts folded over the tensor-parallel ranks: " + std::to_string(tp) +
                        " x a divisor of " + std::to_string(dp) + ")"
                  : std::string());
  return {1, size};
}

std::unique_ptr<ExpertParallelRanks> ExpertParallelRanks::join(const ProcessGroup& world, const MeshCoord& coord,
                                                               int size, const std::string& key) {
  const ExpertParallelShape shape = expert_parallel_shape(size, coord.tp_size, coord.dp_size, key);
  if (size == 1) return nullptr;
  // Within each stage: a group per block of data_ranks replicas (and per tensor rank unless they fold in), its
  // members in rank order; the owners of the same experts share the tensor rank and the place in their block.
  const DeviceMesh mesh(coord.pp_size, coord.dp_size, coord.tp_size);
  std::unique_ptr<ExpertParallelRanks> out(new ExpertParallelRanks());
  out->shape_ = shape;
  out->experts_ = std::make_unique<Communicator>(world.split(mesh.dp_blocks(shape.data_ranks, shape.tensor_ranks > 1)));
  if (coord.dp_size > shape.data_ranks)
    out->owners_ = std::make_unique<Communicator>(world.split(mesh.dp_block_peers(shape.data_ranks)));
  return out;
}

int64_t ExpertParallelRanks::largest(int64_t count) const {
  at::Tensor t = torch::tensor({count}, torch::kLong);
  experts_->all_reduce(t, ReduceOp::kMax);
  return t.item<int64_t>();
}

void ExpertParallelRanks::split(CausalLM& model) const { model->set_expert_parallel(group(), over_tensor_parallel()); }

void ExpertParallelRanks::use_in(TrainEngine& engine) const {
  // Folded over one replica's tensor-parallel ranks, an expert sees only that replica's tokens: the engine
  // treats the experts as the tensor-parallel split (use_model_split), with no global weighting of the losses.
  if (shape_.follows_tensor_parallel()) return;
  engine.set_expert_parallel(group(), owners_.get(), is_expert_parameter_name);
}

ExpertsGathered::ExpertsGathered(const std::vector<CausalLM*>& models, bool even_when_folded) : models_(models) {
  for (CausalLM* model : models_) (*model)->gather_experts(even_when_folded);
}

ExpertsGathered::~ExpertsGathered() {
  for (CausalLM* model : models_) (*model)->release_gathered_experts();
}

}  // namespace hybridflow
