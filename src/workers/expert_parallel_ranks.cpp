#include "hybridflow/workers/expert_parallel_ranks.h"

#include "hybridflow/core/error.h"

namespace hybridflow {

bool is_expert_parameter_name(const std::string& name) { return name.find(".experts.") != std::string::npos; }

std::unique_ptr<ExpertParallelRanks> ExpertParallelRanks::join(const ProcessGroup& world, int size,
                                                               const std::string& key) {
  HF_CHECK(size >= 1, key, " must be >= 1, got ", size);
  if (size == 1) return nullptr;
  HF_CHECK(world.size() % size == 0, key, " = ", size, " does not divide the role's ", world.size(), " processes");
  std::vector<std::vector<int>> groups(static_cast<size_t>(world.size() / size)), owners(static_cast<size_t>(size));
  for (int rank = 0; rank < world.size(); ++rank) {
    groups[static_cast<size_t>(rank / size)].push_back(rank);
    owners[static_cast<size_t>(rank % size)].push_back(rank);
  }
  std::unique_ptr<ExpertParallelRanks> ranks(new ExpertParallelRanks());
  ranks->experts_ = std::make_unique<Communicator>(groups.size() == 1 ? world : world.split(groups));
  if (groups.size() > 1) ranks->owners_ = std::make_unique<Communicator>(world.split(owners));
  return ranks;
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
