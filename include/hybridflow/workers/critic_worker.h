// Value-head models: the PPO critic and the reward (or cost) model.
// CriticWorker methods (batch_protocol: split over data-parallel groups, role_process_groups.h):
//   compute_values  in: input_ids, attention_mask, responses -> values [B, R]: V of the state before each
//                   response token (the hidden state at the previous position), 0 where masked
//   update_critic   in: + response_mask, values (old), returns; clipped value loss over epochs x
//                   mini-batches; out: meta "metrics" (critic/vf_loss, vf_clipfrac, vpred_mean, grad_norm)
//   parameter_norm  out: param_sq_norm [1]
//   flat_parameters out: parameters [1, P] fp32 (tests compare data-parallel replicas)
//   save_checkpoint / load_checkpoint  meta dir (+ tokenizer to save): value model as HF directory
//   save_lora_adapter   meta dir, base: the LoRA adapters as a PEFT directory (the value head is in checkpoints)
//                   <dir>/<role> (with score.weight) + optimizer and RNG state (workers/checkpoint_io.h)
// The value model, its engine, offload, data parallelism and checkpoints are a TrainableModel
// (workers/trainable_model.h); this file holds the value loss and the value read-out.
// Config JSON: model (ModelSpec), threads, critic (CriticSpec, workers/role_specs.h). Both types also have memory_stats (workers/role_memory.h).
// RewardModelWorker methods (batch_protocol):
//   compute_rm_score  in: input_ids, attention_mask -> rm_scores [B]: the value head at the last real token
// Config JSON: model, threads, scoring (ScoringModelSpec). A max_token_len > 0 forms micro-batches by
// token count instead of rows, each trimmed of padding (engine/token_micro_batches.h). Either model is split over the tensor-parallel groups of
// the worker group's layout and its layers over the pipeline stages (the batch passes through the stages in
// micro-batches; a critic's update runs them in 1F1B order, engine/pipeline.h); a critic trains
// data-parallel over its data-parallel groups (workers/data_parallel.h; update_critic's meta "comm" has the
// gradient all-reduce's byte counts).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>

#include "hybridflow/model/transformer.h"
#include "hybridflow/runtime/worker.h"
#include "hybridflow/workers/role_memory.h"
#include "hybridflow/workers/role_process_groups.h"
#include "hybridflow/workers/role_specs.h"
#include "hybridflow/workers/sequence_parallel_rows.h"
#include "hybridflow/workers/trainable_model.h"

namespace hybridflow {

class CriticWorker : public Worker {
 public:
  void register_methods(MethodTable& table) override;
  DataProto compute_values(const DataProto& in);
  DataProto update_critic(const DataProto& in);
  DataProto parameter_norm(const DataProto& in);
  DataProto flat_parameters(const DataProto& in);
  DataProto save_checkpoint(const DataProto& in);
  DataProto load_checkpoint(const DataProto& in);
  DataProto save_lora_adapter(const DataProto& in);
  DataProto memory_stats(const DataProto& in);  // this process's memory (workers/role_memory.h)

 private:
  torch::Tensor response_values(const DataProto& micro);  // [B, R], with grad when enabled
  DataProto update_critic_rows(const DataProto& in);     // update_critic on the rows it trains on

  CriticSpec spec_;
  std::unique_ptr<RoleProcessGroups> groups_;  // when the role has several processes; outlives the model
  std::unique_ptr<TrainableModel> trainable_;  // the value model with its engine, offload and checkpoints
  std::unique_ptr<SequenceParallelRows> sequence_parallel_;  // ulysses_sequence_parallel_size > 1
  bool remove_padding_ = false;  // use_remove_padding: values on packed rows
};

class RewardModelWorker : public Worker {
 public:
  void register_methods(MethodTable& table) override;
  DataProto compute_rm_score(const DataProto& in);
  DataProto memory_stats(const DataProto& in);

 private:
  ScoringModelSpec spec_;
  std::unique_ptr<RoleProcessGroups> groups_;  // when the model is split
  CausalLM model_{nullptr};
  std::shared_ptr<PipelineStageRunner> pipeline_;
};

}  // namespace hybridflow
