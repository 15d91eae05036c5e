// The actor of PPO-style RL in one process (verl's ActorRolloutRefWorker): the trainable policy with its
// TrainEngine, the rollout (generation with the same weights, no copy) and optionally a frozen reference
// copy. Methods (the batch split across data-parallel groups in order, see role_process_groups.h):
//   generate_sequences  in: prompts as tensors input_ids/attention_mask [B, P] (left padded) or field
//                       prompt_ids (token lists); meta n, greedy, seed (optional overrides).
//                       out [B*n rows, sample j of prompt i at row i*n+j]: prompts, responses,
//                       response_mask [.., response_length], input_ids, attention_mask = prompt+response,
//                       rollout_log_probs; the input's fields repeated per sample. With a generation tp below
//                       the training tp, meta "reshard" holds this rank's two 3D-HybridEngine switches.
//   compute_log_prob    in: input_ids, attention_mask, responses -> old_log_probs [B, R]
//   compute_ref_log_prob  same -> ref_log_prob (needs a ref spec)
//   update_actor        in: + response_mask, old_log_probs, advantages (+ ref_log_prob with use_kl_loss);
//                       PPO epochs x mini-batches; out: meta "metrics" (actor/pg_loss, clipfrac, ...)
//   save_checkpoint     meta dir, tokenizer: HF model directory <dir>/<role> + optimizer and RNG state
//                       (layout in workers/checkpoint_io.h)
//   load_checkpoint     meta dir: restores the actor's weights, optimizer and RNG state (not the reference)
//   save_lora_adapter   meta dir, base: the LoRA adapters as a PEFT directory (workers/checkpoint_io.h)
//   parameter_norm      out: tensor param_sq_norm [1] (test and debugging fingerprint)
//   flat_parameters     out: tensor parameters [1, P] fp32 (tests compare data-parallel replicas)
//   join_weight_sync    meta weight_sync (workers/weight_sync_link.h): joins the c10d group spanning this
//                       role's and a standalone rollout pool's processes
//   send_weights        sends the training shards to the rollout ranks' layout (engine/weight_sync.h);
//                       out: meta weight_sync {bytes_sent, ...} per rank
//   memory_stats        this process's memory (workers/role_memory.h), one row per rank
// update_actor also reads tensor rollout_is_weights [B, R] when present: each token's policy loss is
// weighted by it (truncated importance sampling against the rollout policy, algo/rollout_correction.h).
// Config JSON: model (ModelSpec), threads, and the role specs (workers/role_specs.h): actor
// (ActorSpec), rollout (RolloutSpec) and, when the role holds a reference model, ref (RefSpec). A
// max_token_len > 0 forms micro-batches of at most that many padded tokens, trimmed of padding
// (engine/token_micro_batches.h). dtypes are fp32 | bf16 (model_spec.h); rollout and reference default to
// the actor's.
// LoRA (the model spec's lora keys): only the adapters train; the reference policy is the actor with its
// adapters switched off (no reference model is built), and generation runs on the weights with the adapters
// merged in for the call (rollout lora_merge; through the 3D-HybridEngine always) or beside them.
// The policy's model, engine (bf16 weights with fp32 masters), offload, data parallelism and checkpoints
// are a TrainableModel (workers/trainable_model.h); this file holds the policy loss, generation and the
// rollout and reference models.
// Layout: the worker group's ParallelLayout (tp, pp, gen_tp). Actor and reference are split over the tp
// groups and their layers over the pp stages (log-probs pass through the stages in micro-batches, updates
// run 1F1B, engine/pipeline.h), and trained data-parallel over the dp groups (workers/data_parallel.h;
// update_actor's meta "comm" has the gradient all-reduce's byte counts). A rollout
// tensor_model_parallel_size below tp, or pipeline stages (generation runs unstaged, p_g = 1), generates
// through the 3D-HybridEngine (engine/hybrid_engine.h) in reshard_mode hybridflow | hybridflow-v | allgather
// (with stages: hybridflow).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "hybridflow/workers/agent_rollout.h"
#include "hybridflow/engine/decode_graph_cache.h"
#include "hybridflow/engine/expert_reshard.h"
#include "hybridflow/engine/hybrid_engine.h"
#include "hybridflow/engine/weight_sync.h"
#include "hybridflow/model/transformer.h"
#include "hybridflow/runtime/worker.h"
#include "hybridflow/workers/role_memory.h"
#include "hybridflow/workers/role_process_groups.h"
#include "hybridflow/workers/role_specs.h"
#include "hybridflow/workers/router_replay.h"
#include "hybridflow/workers/sequence_parallel_rows.h"
#include "hybridflow/workers/trainable_model.h"

namespace hybridflow {

class ActorRolloutRefWorker : public Worker {
 public:
  void register_methods(MethodTable& table) override;

  DataProto generate_sequences(const DataProto& in);
  DataProto compute_log_prob(const DataProto& in);
  DataProto compute_ref_log_prob(const DataProto& in);
  DataProto update_actor(const DataProto& in);
  DataProto save_checkpoint(const DataProto& in);
  DataProto load_checkpoint(const DataProto& in);
  DataProto save_lora_adapter(const DataProto& in);
  DataProto parameter_norm(const DataProto& in);
  DataProto flat_parameters(const DataProto& in);
  DataProto join_weight_sync(const DataProto& in);
  DataProto send_weights(const DataProto& in);
  DataProto memory_stats(const DataProto& in);

 private:
  // Log-probs of the responses of `in` under `model`, in micro-batches as `how` says; undefined on pipeline
  // stages before the last. With `replay`, each micro-batch's forward records or replays its routing. With
  // `sum_pi_squared`, each token's sum of p^2 over the vocabulary goes there too ([B, R], masked alike).
  torch::Tensor log_probs_of(CausalLM& model, PipelineStageRunner* pipeline, const DataProto& in,
                             const MicroBatching& how, RouterReplayPass* replay = nullptr,
                             torch::Tensor* sum_pi_squared = nullptr) const;
  // Copies the actor's weights into the rollout's cast copy (no-op when generation uses the actor itself,
  // or when the copy is released between rollouts).
  void sync_rollout_weights();
  // free_cache_engine: the cast copy made from the actor's weights before a rollout, released after it.
  void make_rollout_copy();
  void release_rollout_copy();
  void start_hybrid_engine(int gen_tp, int gen_pp, const std::string& mode);
  // Expert parallelism: the experts' switch to the layout of rollout.expert_parallel_size (null experts: checks
  // that the key is 1).
  void start_expert_reshard(const ExpertParallelRanks* experts);
  DataProto update_actor_rows(const DataProto& in);  // update_actor on the rows it trains on
  CausalLM& actor() { return trainable_->model(); }  // the policy being trained

  ModelSpec model_spec_;
  ActorSpec actor_spec_;
  RolloutSpec rollout_spec_;
  std::optional<RefSpec> ref_spec_;  // the role holds a reference model
  std::unique_ptr<RoleProcessGroups> groups_;  // when the role has several processes; outlives the models
  std::unique_ptr<TrainableModel> trainable_;  // the policy with its engine, offload and checkpoints
  std::unique_ptr<SequenceParallelRows> sequence_parallel_;  // ulysses_sequence_parallel_size > 1
  CausalLM rollout_{nullptr};  // only when rollout.dtype differs from actor.dtype
  CausalLM ref_{nullptr};
  std::shared_ptr<PipelineStageRunner> ref_pipeline_;  // when the role has pipeline stages
  std::unique_ptr<HybridEngine> hybrid_;       // when generation's layout differs from training's
  std::unique_ptr<ExpertReshard> expert_reshard_;  // when the actor's experts are split (expert parallelism)
  bool free_rollout_copy_ = false;             // the cast copy is released between rollouts
  // rollout.free_cache_engine false: the KV pools and decode graphs kept between rollouts
  std::shared_ptr<DecodeGraphCache> kept_decode_graphs_ = std::make_shared<DecodeGraphCache>();
  std::unique_ptr<WeightSync> weight_sync_;    // to a standalone rollout pool, once joined
  std::unique_ptr<AgentRolloutRuntime> agent_;  // rollout.multi_turn.enable: one episode per sample
};

}  // namespace hybridflow
