// Router replay for mixture-of-experts actors (verl's actor_rollout_ref.actor.router_replay.mode): the
// experts each token was routed to travel in the batch as tensor routed_experts [B, L, moe_layers, k] int32
// (aligned with input_ids, -1 where no routing was recorded), and the actor's forwards route by them
// (model/moe.h), so that the policy trained is the policy that sampled.
//   disabled: every forward routes by its own router.
//   R2: the old-log-prob pass (compute_log_prob) records its routing; the update replays it.
//   R3: generation records the rollout's routing; the old-log-prob pass and the update replay it.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>

#include "hybridflow/core/data_proto.h"
#include "hybridflow/engine/pipeline.h"
#include "hybridflow/model/moe.h"
#include "hybridflow/model/transformer.h"

namespace hybridflow {

// routed_experts' element type (GenerationOutput::routed_experts too): expert ids and -1 in half the bytes
// of int64; a long rollout's routing is tokens x MoE layers x k of them.
inline constexpr torch::ScalarType kRoutedExpertsDtype = torch::kInt32;

enum class RouterReplayPolicy { kDisabled, kR2, kR3 };
// "disabled" | "R2" | "R3"; the error names `key`.
RouterReplayPolicy parse_router_replay_policy(const std::string& mode, const std::string& key);

// routed_experts [b, L, layers, k] as the model's per-layer routing ([b, L, k] each).
ExpertRouting routing_of(const torch::Tensor& routed_experts);

// [b, L] bool: the real tokens (attention_mask) whose routing routed_experts records.
torch::Tensor recorded_tokens(const torch::Tensor& routed_experts, const torch::Tensor& attention_mask);

// Tokens per expert per row, [b, layers, experts] float32: the real tokens (attention_mask) whose routing is
// recorded, counted once per chosen expert.
torch::Tensor expert_token_counts(const torch::Tensor& routed_experts, const torch::Tensor& attention_mask,
                                  int64_t num_experts);

// One log-prob pass of the actor (compute_log_prob) under a policy: before each micro-batch's forward
// (begin) the model records (R2) or replays the micro-batch's routed_experts (R3); after it (end) the pass
// keeps, per row of the whole batch, its tokens per expert, and for R3 how many of its recorded tokens the
// model's own router would have sent elsewhere; for R2 the recorded routing. The model routes by itself
// again when the pass ends. Micro-batches must carry the row-index tensor that with_row_index() adds.
//
// Pipeline stages: given the stage's runner, the pass runs begin and end around every stage's forward itself
// (PipelineStageRunner::set_micro_batch_hooks; staged() is then true and the caller leaves them out), each
// stage records or checks its own layers, and write() (collective over the stages) combines the stages'.
class RouterReplayPass {
 public:
  RouterReplayPass(CausalLM& model, RouterReplayPolicy policy, const DataProto& batch,
                   PipelineStageRunner* pipeline = nullptr);
  ~RouterReplayPass();
  RouterReplayPass(const RouterReplayPass&) = delete;
  RouterReplayPass& operator=(const RouterReplayPass&) = delete;

  bool active() const { return policy_ != RouterReplayPolicy::kDisabled; }
  bool staged() const { return pipeline_ != nullptr; }
  // The batch with the row-index tensor the micro-batches carry.
  DataProto with_row_index(const DataProto& batch) const;
  void begin(const DataProto& micro);
  void end(const DataProto& micro);
  // Into the pass's output: expert_tokens [B, layers, experts]; R3: routing_changed and routing_recorded
  // [B] (tokens); R2: routed_experts [B, L, layers, k].
  void write(DataProto& out);

 private:
  CausalLM& model_;
  RouterReplayPolicy policy_;
  PipelineStageRunner* pipeline_ = nullptr;  // set when the model is a pipeline stage
  Partition moe_;                            // the model's MoE layers this stage holds
  int64_t prompt_width_ = 0;
  // changed_: R3's tokens [B, L] whose routing some layer of this stage would change; recorded_: per row.
  torch::Tensor expert_tokens_, changed_, recorded_, routed_;
};

// The update's replay on a pipeline stage (R2, R3): while it lives, every forward of the stage (`pipeline`, the
// model's runner) replays its layers of the micro-batch's routed_experts, and the model routes by itself
// after each. Does nothing given no runner (active() false: the caller replays around its own forwards).
class StagedRouterReplay {
 public:
  StagedRouterReplay(PipelineStageRunner* pipeline, CausalLM& model);
  ~StagedRouterReplay();
  StagedRouterReplay(const StagedRouterReplay&) = delete;
  StagedRouterReplay& operator=(const StagedRouterReplay&) = delete;
  bool active() const { return pipeline_ != nullptr; }

 private:
  PipelineStageRunner* pipeline_;
};

// The controller's view of one pass's output (write()): per-layer expert load, max over mean tokens per
// expert (1 = perfectly even; averaged over layers, and the worst layer), and for R3 the fraction of
// recorded tokens whose routing at training time would have differed from the rollout's. Removes those
// per-row tensors from `batch`.
std::map<std::string, double> take_routing_metrics(DataProto& batch);

}  // namespace hybridflow
