// The 3D-HybridEngine (HybridFlow paper, section 5): the actor's weights switch in place between the
// training layout (pp p, tp t, dp d) and a generation layout with a smaller tensor-parallel size t_g and
// d*t/t_g generation replicas, so one set of processes both trains and generates, each with the layout
// that suits it.
//
// hybridflow mode: to_generation() all-gathers each split weight inside the rank's micro-DP group into a
// new generation tensor of which the rank's training shard is a slice; the training parameter is then
// re-pointed at that slice (its old memory is freed), so no weight exists twice on a rank. to_training()
// copies the training shards back out and frees the generation tensors. The KV cache is the generation
// call's own and is gone when it returns. The two baselines of the paper's Table 2 (resharding.h) are the
// same interface with their own groups, so all three can be measured on the same processes.
//
// Pipeline stages (p > 1) generate in p_g stages (p_g divides p; p_g = 1: unstaged), in hybridflow mode:
// each rank's micro-DP group then spans the l = p/p_g training stages of its generation stage,
// (j, r) -> (j % l) * k + r with k = t/t_g, and to_generation() builds every generation tensor of that
// stage from broadcasts inside it: a split weight's k pieces from the k ranks of the stage that owns it (each
// piece a training shard, which then lives on as a slice of the generation tensor), a weight whole on its
// stage (norms) in k chunks from those ranks. Each rank receives the generation shard less what it held,
// and the last stage's copy of a tied embedding becomes a slice of the gathered embedding (or, generating
// in stages, is gathered as the generation model's own copy), so nothing is held twice. The baselines with stages gather the whole model on every rank the same way, from the
// replica's model-parallel group (hybridflow-v) or from the world with each data-parallel replica sending
// 1/d (allgather), and keep their training weights apart.
//
// Mixture-of-experts actors whose experts are folded over exactly their tensor-parallel ranks (Megatron's layout
// with expert_model_parallel_size = t: CausalLM::experts_follow_tensor_parallel) fold them over the t_g
// generation ranks the same way, in hybridflow mode: generation tensor rank q holds the experts of training
// tensor ranks qk .. qk + k - 1, each of which comes whole from the one piece of its stage's micro-DP group that
// trains it (and stays in place there). Experts split any other way (over data-parallel replicas, or Megatron's
// folding over more than one replica's tensor ranks) are first all-gathered within their stage's expert-parallel
// group and then travel whole, as a stage's norms do, into the generation model, which folds them over its
// tensor ranks (all of them at t_g = 1); the stage's gathered set is dropped before generation starts. That
// gather is the one transient copy: each rank holds its stage's experts whole while the switch fills the
// generation tensors (expert_peak_extra_weight_bytes).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hybridflow/model/transformer.h"
#include "hybridflow/parallel/collectives.h"
#include "hybridflow/parallel/device_mesh.h"
#include "hybridflow/parallel/resharding.h"

namespace hybridflow {

class HybridEngine {
 public:
  // Collective over the actor's world (the ranks of layout.train(), every one calling with the same
  // arguments). `train` is this rank's training-layout model over its training tensor-parallel group.
  HybridEngine(CausalLM train, const GenerationLayout& layout, const ProcessGroup& world, ReshardMode mode);
  ~HybridEngine();

  // Collective over the world. Throws when already generating.
  ReshardStats to_generation();
  // Collective over the world. Throws unless generating.
  ReshardStats to_training();

  bool generating() const { return generating_; }
  // The generation-layout model (valid while generating; its parameters are empty otherwise).
  CausalLM& generation_model();
  const TensorParallelGroup& generation_group() const { return gen_group_; }
  // The communicator over the generation model's pipeline stages (one rank per stage of this rank's
  // replica), which generate() takes; null when generation is unstaged (p_g = 1).
  Communicator* generation_stages() const { return gen_pp_comm_.get(); }
  // This rank's generation replica and how many there are: prompts split over replicas (3D_ALL_MICRO_DP).
  int generation_replica() const { return gen_replica_; }
  int generation_replicas() const { return gen_replicas_; }
  ReshardMode mode() const { return mode_; }

 private:
  struct Weight;  // one parameter in both layouts
  void gather_in_place(Weight& w, ReshardStats& stats);
  void gather_full(Weight& w, ReshardStats& stats);
  void gather_stages(ReshardStats& stats);        // p > 1, hybridflow
  // gather_stages, with split experts gathered in their stage around it.
  void gather_stages_with_experts(ReshardStats& stats);
  void gather_stages_whole(ReshardStats& stats);  // p > 1, the baselines: every rank gathers the whole model
  // Broadcasts inside gather_comm_, counting the bytes this rank sent or received.
  void broadcast_counted(torch::Tensor& piece, int root, ReshardStats& stats);
  // The actor's experts follow its tensor-parallel ranks (and so the generation model's follow its own).
  bool experts_folded() const { return train_->experts_follow_tensor_parallel(); }
  // The actor's experts are split any other way (over data-parallel replicas, or over more ranks than one
  // replica's tensor ranks).
  bool experts_split() const { return train_->expert_parallel().enabled() && !experts_folded(); }

  CausalLM train_;
  GenerationLayout layout_;
  ReshardMode mode_;
  int world_rank_;
  std::unique_ptr<Communicator> gather_comm_;  // micro-DP group, training tp group or world, by mode
  std::unique_ptr<Communicator> gen_tp_comm_;
  std::unique_ptr<Communicator> gen_pp_comm_;  // p_g > 1 only
  TensorParallelGroup gen_group_;
  CausalLM generation_{nullptr};
  std::vector<Weight> weights_;  // the generation model's, in its order
  torch::Tensor tied_copy_;      // a later stage's copy of the first stage's tied embedding
  std::map<std::string, torch::Tensor> stage_experts_;  // during a switch: the stage's gathered split experts
  int gen_tp_rank_ = 0;
  int gen_replica_ = 0, gen_replicas_ = 1;
  bool generating_ = false;
};

}  // namespace hybridflow
