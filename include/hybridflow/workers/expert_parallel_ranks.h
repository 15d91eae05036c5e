// Expert parallelism in a role's processes (verl's <role>.megatron.expert_model_parallel_size n): each group of
// n ranks splits every mixture-of-experts layer's experts, and ranks at the same place in their groups own the
// same experts and sum their gradients (expert data parallelism). Within a pipeline stage a group is, in
// Megatron's rank order (tensor-parallel rank fastest):
//
//   - with tensor parallelism t > 1 and n a multiple of t (n / t dividing the data-parallel size): n / t
//     consecutive data-parallel replicas, all t tensor-parallel ranks of each (Megatron's experts folded over
//     the tensor-parallel ranks, expert_tensor_parallel_size 1). The t ranks of a replica hold the same tokens
//     and share them out around each expert exchange, so each expert's work runs once;
//   - otherwise n consecutive data-parallel ranks of one tensor-parallel rank (n dividing the data-parallel
//     size): every tensor-parallel rank's replicas split alike, each rank routing its replica's tokens.
//
// Training runs expert-parallel (tokens exchanged with the group around each expert layer). Passes whose ranks
// may take different numbers of forwards (generation, whose sequences end at different steps) and the
// no-gradient log-prob passes run on the experts gathered from the group for their duration (ExpertsGathered),
// so that a rank never waits on another's exchange; the gathered copies are dropped after.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hybridflow/engine/train_engine.h"
#include "hybridflow/model/transformer.h"
#include "hybridflow/parallel/collectives.h"
#include "hybridflow/parallel/expert_parallel.h"
#include "hybridflow/runtime/mesh_coord.h"

namespace hybridflow {

// An expert-parallel group's shape within a stage: `tensor_ranks` tensor-parallel ranks (t, or 1) of
// `data_ranks` consecutive data-parallel replicas.
struct ExpertParallelShape {
  int tensor_ranks = 1;
  int data_ranks = 1;
  // Exactly one replica's tensor-parallel ranks (CausalLM::experts_follow_tensor_parallel): the experts are that
  // group's split, with no exchange, and stay in place for generation.
  bool follows_tensor_parallel() const { return tensor_ranks > 1 && data_ranks == 1; }
};
// The shape of groups of `size` in a stage of tp x dp ranks (above). Throws naming `key` when neither fits.
ExpertParallelShape expert_parallel_shape(int size, int tp, int dp, const std::string& key);

class ExpertParallelRanks {
 public:
  // Collective over the role's world (every rank calls it with the same size). Null for size 1. Throws naming
  // `key` when no group shape fits the layout.
  static std::unique_ptr<ExpertParallelRanks> join(const ProcessGroup& world, const MeshCoord& coord, int size,
                                                   const std::string& key);

  ExpertParallelGroup group() const { return ExpertParallelGroup(experts_.get()); }
  int size() const { return experts_->size(); }
  // The ranks owning the same experts; null when the group is the whole world.
  Communicator* owners() const { return owners_.get(); }
  // Whether the group folds the tensor-parallel ranks in (their tokens shared out, not each routed whole).
  bool over_tensor_parallel() const { return shape_.tensor_ranks > 1; }
  // Splits the model's experts over the group and, with an engine, tells it which parameters are experts (not
  // for experts folded over one replica's tensor-parallel ranks: workers/role_process_groups.h, use_model_split,
  // counts them as that group's split; call split before it).
  void split(CausalLM& model) const;
  void use_in(TrainEngine& engine) const;
  // The largest of the group's `count`s (a collective: every rank of the group calls it).
  int64_t largest(int64_t count) const;
  // Bytes this rank has sent through all-to-alls so far (token exchanges and counts).
  int64_t all_to_all_bytes() const { return experts_->stats().of("all_to_all").bytes; }

 private:
  ExpertParallelShape shape_;
  std::unique_ptr<Communicator> experts_, owners_;
};

// Every expert of the models in this process for a scope (collective over their groups); dropped again at its end.
class ExpertsGathered {
 public:
  // `even_when_folded`: also experts folded over exactly the tensor-parallel ranks (CausalLM::gather_experts).
  explicit ExpertsGathered(const std::vector<CausalLM*>& models, bool even_when_folded = false);
  ~ExpertsGathered();
  ExpertsGathered(const ExpertsGathered&) = delete;
  ExpertsGathered& operator=(const ExpertsGathered&) = delete;

 private:
  std::vector<CausalLM*> models_;
};

}  // namespace hybridflow
