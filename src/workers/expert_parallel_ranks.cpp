#include "hybridflow/workers/expert_parallel_ranks.h"

#include "hybridflow/core/error.h"

namespace hybridflow {

bool is_expert_parameter_name(const std::string& name) { return name.find(".experts.") != std::string::npos; }

std::unique_ptr<ExpertParallelRanks> ExpertParallelRanks::join(const ProcessGroup& data_parallel, int size,
                                                               const std::string& key) {
  HF_CHECK(size >= 1, key, " must be >= 1, got ", size);
  if (size == 1) return nullptr;
  const int ranks = data_parallel.size();
  HF_CHECK(ranks % size == 0, key, " = ", size, " does not divide the role's ", ranks, " data-parallel processes");
  // Groups of consecutive data-parallel ranks, by their world ranks (the tensor-parallel ranks of a replica sit in
  // as many data-parallel groups, each split alike).
  const std::vector<int>& members = data_parallel.world_ranks();
  std::vector<std::vector<int>> groups(static_cast<size_t>(ranks / size)), owners(static_cast<size_t>(size));
  for (int rank = 0; rank < ranks; ++rank) {
    groups[static_cast<size_t>(rank / size)].push_back(members[static_cast<size_t>(rank)]);
    owners[static_cast<size_t>(rank % size)].push_back(members[static_cast<size_t>(rank)]);
  }
  std::unique_ptr<ExpertParallelRanks> out(new ExpertParallelRanks());
  out->experts_ = std::make_unique<Communicator>(groups.size() == 1 ? data_parallel : data_parallel.split(groups));
  if (groups.size() > 1) out->owners_ = std::make_unique<Communicator>(data_parallel.split(owners));
  return out;
}

int64_t ExpertParallelRanks::largest(int64_t count) const {
  at::Tensor t = torch::tensor({count}, torch::kLong);
  experts_->all_reduce(t, ReduceOp::kMax);
  return t.item<int64_t>();
}

void ExpertParallelRanks::split(CausalLM& model) const { model->set_expert_parallel(group()); }

void ExpertParallelRanks::use_in(TrainEngine& engine) const {
  engine.set_expert_parallel(group(), owners_.get(), is_expert_parameter_name);
}

ExpertsGathered::ExpertsGathered(const std::vector<CausalLM*>& models) : models_(models) {
  for (CausalLM* model : models_) (*model)->gather_experts();
}

ExpertsGathered::~ExpertsGathered() {
  for (CausalLM* model : models_) (*model)->release_gathered_experts();
}

}  // namespace hybridflow
