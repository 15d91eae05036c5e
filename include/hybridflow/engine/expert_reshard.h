// The 3D-HybridEngine's expert step: a mixture-of-experts actor trained with its experts split over an
// expert-parallel group of n ranks (actor_rollout_ref.actor.megatron.expert_model_parallel_size) switches them
// to the generation layout that actor_rollout_ref.rollout.expert_parallel_size names, and back:
//
//   rollout expert_parallel_size   to_generation                                  per rank, X = every expert's bytes
//   n (the actor's)                nothing moves; generation exchanges tokens      sent 0, received 0, held X / n
//                                  with the group (all-to-all) as training does
//   1                              all-gather over the group; the rank's own       sent = received = (n - 1) / n * X,
//                                  experts become slices of the gathered set       held X, redundant 0
//
// Experts folded over the tensor-parallel ranks of one replica (CausalLM::experts_follow_tensor_parallel) stay
// in place whatever the size: those ranks generate in step anyway.
//
// Under pipeline parallelism the group is a stage's and X its layers' experts; expert_model_bytes still counts every
// expert of the model (summed over the stages), as model_bytes counts every weight.
//
// The non-expert weights are replicated under expert parallelism: they never move (replicated_bytes). Each
// switch returns ReshardStats with the expert figures in its expert_* fields and in the totals, so they are
// reported like the dense switch's (HybridEngine); to_training() gives the own experts memory of their own
// back, bit for bit, and drops the others'.
#pragma once

#include <string>

#include "hybridflow/model/transformer.h"
#include "hybridflow/parallel/collectives.h"
#include "hybridflow/parallel/resharding.h"

namespace hybridflow {

class ExpertReshard {
 public:
  // `train` is this rank's actor with its experts split (set_expert_parallel). Throws naming `key` unless
  // generation_size is 1 or the training group's size. `stages`: the communicator over the pipeline stages when
  // `train` is one (it must outlive this).
  ExpertReshard(CausalLM train, int generation_size, const std::string& key, Communicator* stages = nullptr);

  // Collective over the expert-parallel group (and the stages). Throws when already generating.
  ReshardStats to_generation();
  // Local. Throws unless generating.
  ReshardStats to_training();

  bool generating() const { return generating_; }
  // Whether generation exchanges tokens with the group (the experts stay split) rather than running alone.
  bool expert_parallel_generation() const {
    return generation_size_ > 1 && !train_->experts_follow_tensor_parallel();
  }
  int generation_size() const { return generation_size_; }

 private:
  // Whether the experts stay where training keeps them (the size is the group's, or they follow the
  // tensor-parallel ranks) rather than being gathered.
  bool in_place() const { return generation_size_ > 1 || train_->experts_follow_tensor_parallel(); }

  CausalLM train_;
  int generation_size_;
  Communicator* stages_;
  bool generating_ = false;
};

}  // namespace hybridflow
