// Expert parallelism in a role's processes (verl's <role>.megatron.expert_model_parallel_size): consecutive data-
// parallel ranks form an expert-parallel group (each tensor-parallel rank's alike: experts whole per rank), which
// splits each mixture-of-experts layer's experts while every rank keeps its own data-parallel share of the batch;
// ranks at the same place in their groups own the same experts and sum their gradients (expert data parallelism).
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

namespace hybridflow {

// Whether a parameter name is one of a mixture-of-experts layer's experts ("...experts.<e>....").
bool is_expert_parameter_name(const std::string& name);

class ExpertParallelRanks {
 public:
  // Collective over the role's world (every rank calls it with the same size, on its data-parallel group). Null
  // for size 1. Throws naming `key` when the size does not divide the data-parallel group.
  static std::unique_ptr<ExpertParallelRanks> join(const ProcessGroup& data_parallel, int size, const std::string& key);

  ExpertParallelGroup group() const { return ExpertParallelGroup(experts_.get()); }
  int size() const { return experts_->size(); }
  // The ranks owning the same experts; null when the group is the whole world.
  Communicator* owners() const { return owners_.get(); }
  // Splits the model's experts over the group and, with an engine, tells it which parameters are experts.
  void split(CausalLM& model) const;
  void use_in(TrainEngine& engine) const;
  // The largest of the group's `count`s (a collective: every rank of the group calls it).
  int64_t largest(int64_t count) const;
  // Bytes this rank has sent through all-to-alls so far (token exchanges and counts).
  int64_t all_to_all_bytes() const { return experts_->stats().of("all_to_all").bytes; }

 private:
  std::unique_ptr<Communicator> experts_, owners_;
};

// Every expert of the models in this process for a scope (collective over their groups); dropped again at its end.
class ExpertsGathered {
 public:
  explicit ExpertsGathered(const std::vector<CausalLM*>& models);
  ~ExpertsGathered();
  ExpertsGathered(const ExpertsGathered&) = delete;
  ExpertsGathered& operator=(const ExpertsGathered&) = delete;

 private:
  std::vector<CausalLM*> models_;
};

}  // namespace hybridflow
