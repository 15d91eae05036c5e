#include "hybridflow/workers/actor_rollout_ref_worker.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include "hybridflow/algo/algo_config.h"
#include "hybridflow/algo/kl.h"
#include "hybridflow/algo/losses.h"
#include "hybridflow/algo/rollout_correction.h"
#include "hybridflow/core/error.h"
#include "hybridflow/core/logging.h"
#include "hybridflow/core/process_memory.h"
#include "hybridflow/engine/generation.h"
#include "hybridflow/engine/model_log_probs.h"
#include "hybridflow/engine/packed_rows.h"
#include "hybridflow/model/batch_invariant.h"
#include "hybridflow/model/lora.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/runtime/protocol.h"
#include "hybridflow/workers/agent_rollout.h"
#include "hybridflow/workers/expert_parallel_ranks.h"
#include "hybridflow/workers/lora_scopes.h"
#include "hybridflow/workers/model_spec.h"
#include "hybridflow/workers/ppo_epochs.h"
#include "hybridflow/workers/rl_batch.h"
#include "hybridflow/workers/role_specs.h"
#include "hybridflow/workers/rollout_generation.h"
#include "hybridflow/workers/router_replay.h"
#include "hybridflow/workers/weight_sync_link.h"

namespace hybridflow {
namespace {

// One switch's figures as this rank measured them (resharding.h).
nlohmann::json reshard_json(const ReshardStats& s) {
  return {{"mode", s.mode},
          {"model_bytes", s.model_bytes},
          {"bytes_sent", s.bytes_sent},
          {"bytes_received", s.bytes_received},
          {"peak_extra_weight_bytes", s.peak_extra_weight_bytes},
          {"redundant_bytes", s.redundant_bytes},
          {"seconds", s.seconds},
          {"expert_model_bytes", s.expert_model_bytes},
          {"expert_bytes_sent", s.expert_bytes_sent},
          {"expert_bytes_received", s.expert_bytes_received},
          {"expert_peak_extra_weight_bytes", s.expert_peak_extra_weight_bytes},
          {"expert_redundant_bytes", s.expert_redundant_bytes}};
}

// The expert step of a rollout's switches (engine/expert_reshard.h): to the generation layout now, back at
// finish() or, if generation throws, when the scope ends.
class ExpertSwitchScope {
 public:
  ExpertSwitchScope(ExpertReshard* reshard, nlohmann::json& record) : reshard_(reshard), record_(record) {
    if (reshard_) record_["to_generation"] = reshard_json(reshard_->to_generation());
  }
  void finish() {
    if (reshard_ && reshard_->generating()) record_["to_training"] = reshard_json(reshard_->to_training());
  }
  ~ExpertSwitchScope() {
    if (reshard_ && reshard_->generating()) reshard_->to_training();
  }
  ExpertSwitchScope(const ExpertSwitchScope&) = delete;
  ExpertSwitchScope& operator=(const ExpertSwitchScope&) = delete;

 private:
  ExpertReshard* reshard_;
  nlohmann::json& record_;
};

// Points a parameter at other storage in place (the optimizer and the module keep the same tensor).
void point_at(torch::Tensor& param, const torch::Tensor& source) {
  torch::NoGradGuard no_grad;
  param.set_(source);
}

// The bytes of this rank's part of `model`'s base weights (adapters left out) in `dtype`: what a separate
// reference copy would take in this process.
int64_t base_weight_bytes(const CausalLM& model, torch::Dtype dtype) {
  int64_t numel = 0;
  for (const auto& item : model->named_parameters())
    if (!is_lora_parameter_name(item.key())) numel += item.value().numel();
  return numel * static_cast<int64_t>(c10::elementSize(dtype));
}

// The response log-probs of a micro-batch, on packed rows with use_remove_padding.
TokenLogProbs policy_log_probs(bool packed, CausalLM& model, const DataProto& m, int64_t response_len,
                               double temperature, bool with_entropy, bool with_sum_pi_squared = false) {
  const auto& ids = m.tensor("input_ids");
  const auto& mask = m.tensor("attention_mask");
  return packed ? packed_response_log_probs(model, ids, mask, response_len, temperature, with_entropy,
                                            with_sum_pi_squared)
                : response_log_probs(model, ids, mask, response_len, temperature, with_entropy, with_sum_pi_squared);
}

}  // namespace

void ActorRolloutRefWorker::register_methods(MethodTable& table) {
  const nlohmann::json& config = context().config;
  at::set_num_threads(config.value("threads", 1));
  model_spec_ = config.at("model").get<ModelSpec>();
  actor_spec_ = decode_spec<ActorSpec>(config, "actor");
  rollout_spec_ = decode_spec<RolloutSpec>(config, "rollout");
  if (config.contains("ref")) ref_spec_ = config.at("ref").get<RefSpec>();
  set_device(model_device(model_spec_));
  // Several processes train as one: tensor-parallel groups split the model, data-parallel groups the batch.
  if (world_size() > 1) groups_ = RoleProcessGroups::connect(context(), device());
  const TensorParallelGroup tp = groups_ ? groups_->tensor_parallel() : TensorParallelGroup();
  const PipelineStage stage = groups_ ? groups_->pipeline_stage() : PipelineStage();
  // Unset dtypes: the actor's is the model spec's, generation's and the reference's the actor's.
  ModelSpec actor_model = model_spec_;
  if (!actor_spec_.dtype.empty()) actor_model.dtype = actor_spec_.dtype;
  const std::string actor_dtype = actor_model.dtype;
  const std::string rollout_dtype = rollout_spec_.dtype.empty() ? actor_dtype : rollout_spec_.dtype;
  trainable_ = std::make_unique<TrainableModel>(context(), device(), groups_.get(), actor_model,
                                                HeadKind::kLanguageModel, actor_spec_.train);
  // Ulysses: consecutive ranks split the sequences of the actor's and the reference's whole-sequence passes.
  const int sp_size = actor_model.ulysses_sequence_parallel_size;
  HF_CHECK(sp_size == 1 || groups_, "actor_rollout_ref.actor.ulysses_sequence_parallel_size = ", sp_size,
           " needs as many processes; role '", context().role, "' has one");
  if (groups_)
    sequence_parallel_ = SequenceParallelRows::join(groups_->world(), coord(), sp_size,
                                                    "actor_rollout_ref.actor.ulysses_sequence_parallel_size");
  if (sequence_parallel_) {  // the model refuses a head count or layout it cannot split: at creation, not mid-run
    actor()->set_sequence_parallel(sequence_parallel_->group());
    actor()->set_sequence_parallel({});
  }
  const int gen_tp = rollout_spec_.tensor_model_parallel_size > 0 ? rollout_spec_.tensor_model_parallel_size : coord().tp_size;
  const int gen_pp = rollout_spec_.pipeline_model_parallel_size;
  // Generation in another dtype than training (e.g. bf16 rollout of an fp32 actor) runs on a cast copy
  // of the actor's weights, refreshed after every update; in the same dtype it uses the actor itself.
  const ExpertParallelRanks* experts = trainable_->expert_parallel();
  // Split experts generate in the actor's dtype: the engine's switch (another layout, engine/hybrid_engine.h)
  // or the in-layout gather hands generation the actor's own expert weights, not a cast copy.
  HF_CHECK(!experts || parse_dtype(rollout_dtype, "rollout dtype") == parse_dtype(actor_dtype, "actor dtype"),
           actor_model.expert_key, " = ", actor_model.expert_model_parallel_size, ": generation runs on the actor's ",
           "experts, in the actor's dtype (rollout dtype ", rollout_dtype, " vs actor ", actor_dtype, ")");
  if (parse_dtype(rollout_dtype, "rollout dtype") != parse_dtype(actor_dtype, "actor dtype")) {
    HF_CHECK(gen_tp == coord().tp_size && !stage.enabled(), "role '", context().role, "': a rollout dtype (",
             rollout_dtype, ") other than the actor's needs the actor's tensor-parallel size for generation (",
             coord().tp_size, ", got ", gen_tp, ") and no pipeline stages (pp ", coord().pp_size, ")");
    ModelSpec rollout_model = actor_model;
    rollout_model.dtype = rollout_dtype;
    rollout_ = build_model(rollout_model, HeadKind::kLanguageModel, tp);
    rollout_->eval();
    for (auto& p : rollout_->parameters()) p.set_requires_grad(false);
    // verl's free_cache_engine: the cast copy exists only during a rollout, made from the actor's weights.
    free_rollout_copy_ = rollout_spec_.free_cache_engine;
    if (free_rollout_copy_) release_rollout_copy();
  }
  if (ref_spec_ && actor()->has_lora()) {
    // With LoRA the reference policy is the actor with its adapters switched off (bit-equal to the base
    // model): no second copy is built.
    const std::string ref_dtype = ref_spec_->dtype.empty() ? actor_dtype : ref_spec_->dtype;
    const int64_t saved = base_weight_bytes(actor(), parse_dtype(ref_dtype, "ref dtype"));
    if (rank() == 0)
      log_info("role '", context().role, "': LoRA: the reference policy is the actor with its adapters disabled; no ",
               "reference model is built, which saves ", static_cast<double>(saved) / (1 << 20), " MiB of ", ref_dtype,
               " weights in this process");
  } else if (ref_spec_) {
    ModelSpec ref_model = actor_model;
    if (!ref_spec_->dtype.empty()) ref_model.dtype = ref_spec_->dtype;
    ref_ = build_model(ref_model, HeadKind::kLanguageModel, tp, stage);
    if (experts) experts->split(ref_);  // between its passes it holds this rank's experts only
    if (groups_) ref_pipeline_ = groups_->pipeline_runner(ref_);
    ref_->eval();
    for (auto& p : ref_->parameters()) p.set_requires_grad(false);
  }
  // The training layout generates as it is when t_g = t and p_g = p; any other generation layout switches
  // through the engine (unstaged generation, p_g = 1, gathers the stages even at t_g = t).
  if (gen_tp != coord().tp_size || gen_pp != coord().pp_size) start_hybrid_engine(gen_tp, gen_pp, rollout_spec_.reshard_mode);

  if (rollout_spec_.multi_turn.is_object() && rollout_spec_.multi_turn.value("enable", false))
    agent_ = std::make_unique<AgentRolloutRuntime>(rollout_spec_.multi_turn);
  start_expert_reshard(experts);
  using W = ActorRolloutRefWorker;
  table.add("generate_sequences", rollout_protocol(coord()), this, &W::generate_sequences);
  table.add("compute_log_prob", batch_protocol(coord()), this, &W::compute_log_prob);
  table.add("compute_ref_log_prob", batch_protocol(coord()), this, &W::compute_ref_log_prob);
  table.add("update_actor", batch_protocol(coord()), this, &W::update_actor);
  table.add("save_checkpoint", protocols::kOneToAll, this, &W::save_checkpoint);
  table.add("load_checkpoint", protocols::kOneToAll, this, &W::load_checkpoint);
  table.add("save_lora_adapter", protocols::kOneToAll, this, &W::save_lora_adapter);
  table.add("parameter_norm", protocols::kOneToAll, this, &W::parameter_norm);
  table.add("flat_parameters", protocols::kOneToAll, this, &W::flat_parameters);
  table.add("join_weight_sync", protocols::kOneToAll, this, &W::join_weight_sync);
  table.add("send_weights", protocols::kOneToAll, this, &W::send_weights);
  table.add("memory_stats", protocols::kOneToAll, this, &W::memory_stats);
  // Weights live in host memory between calls from the start (param_offload).
  trainable_->offload_params();
}

void ActorRolloutRefWorker::start_expert_reshard(const ExpertParallelRanks* experts) {
  const std::string key = "actor_rollout_ref.rollout.expert_parallel_size";
  const int size = rollout_spec_.expert_parallel_size;
  if (experts == nullptr) {
    HF_CHECK(size == 1, key, " = ", size, ": the actor's experts are not split ",
             "(actor_rollout_ref.actor.megatron.expert_model_parallel_size = 1); leave it 1");
    return;
  }
  if (hybrid_ && !actor()->experts_follow_tensor_parallel()) {
    // The engine's switch gathers the split experts itself and hands them to the generation layout whole.
    HF_CHECK(size == 1, key, " = ", size, ": expert-parallel decoding runs in the actor's own training layout, not ",
             "through the 3D-HybridEngine's switch to another; leave it 1");
    return;
  }
  expert_reshard_ = std::make_unique<ExpertReshard>(actor(), size, key, groups_ ? groups_->pipeline() : nullptr);
  // The trainer refuses these with the keys' names; a worker group made by hand meets them here.
  HF_CHECK(!expert_reshard_->expert_parallel_generation() || (!agent_ && !rollout_spec_.record_routing), key, " = ",
           size, ": expert-parallel decoding runs single-turn rollouts without recording the routing");
}

void ActorRolloutRefWorker::start_hybrid_engine(int gen_tp, int gen_pp, const std::string& mode) {
  const MeshCoord& c = coord();
  HF_CHECK(groups_, "role '", context().role, "': generation tensor/pipeline-parallel size ", gen_tp, "/", gen_pp,
           " differs from training's 1/1 on a single process");
  const GenerationLayout layout(DeviceMesh(c.pp_size, c.dp_size, c.tp_size), gen_tp, gen_pp);
  hybrid_ = std::make_unique<HybridEngine>(actor(), layout, groups_->world(), parse_reshard_mode(mode));
  // The controller splits prompts by the coordinates it computed (mesh_coord.h); they must name the replica
  // the engine generates with, or two replicas would generate the same prompts.
  HF_CHECK(hybrid_->generation_replicas() == c.micro_dp_size && hybrid_->generation_replica() == c.micro_dp,
           "role '", context().role, "' rank ", c.rank, ": the controller dispatches prompts to generation replica ",
           c.micro_dp, " of ", c.micro_dp_size, " but the ", mode, " engine made it replica ",
           hybrid_->generation_replica(), " of ", hybrid_->generation_replicas(),
           " (create the worker group with the generation tp and reshard mode of the rollout config)");
}

DataProto ActorRolloutRefWorker::generate_sequences(const DataProto& in) {
  auto on = trainable_->params_on_device();
  // Expert parallelism: the experts switch to the rollout's layout, gathered (each rank generates alone) or
  // left split (the group decodes in step, exchanging tokens).
  nlohmann::json reshard;
  ExpertSwitchScope expert_switch(expert_reshard_.get(), reshard);
  BatchInvariantGuard batch_invariant(rollout_spec_.batch_invariant);
  const GenerationConfig g = rollout_generation_config(rollout_spec_, model_spec_, actor()->config(), in, coord().micro_dp,
                                                       device(), kept_decode_graphs_);
  const auto prompts = prompt_token_lists(in);
  // Multi-turn: one episode per sample on the generating model (with stages, stage 0 runs the episodes and the
  // other stages follow its schedule).
  DataProto agent_result;
  auto run = [&](CausalLM& model, Communicator* stages) {
    if (!agent_) return generate(model, prompts, g, stages);
    HF_CHECK(!g.record_routing, "role '", context().role, "': router_replay.mode R3 records the routing of ",
             "single-turn rollouts only; multi-turn rollouts do not record it yet (use R2)");
    agent_result = agent_generate_sequences(model, g, in, agent_->context(), stages);
    return GenerationOutput();
  };
  GenerationOutput out;
  if (hybrid_) {
    // The engine's generation model has no adapters: it gathers the actor's weights with them merged in
    // (lora_merge; the start checks it), and the actor's own weights come back bit for bit after.
    MergedLoraScope merged(actor(), /*merge=*/true);
    reshard["to_generation"] = reshard_json(hybrid_->to_generation());
    out = run(hybrid_->generation_model(), hybrid_->generation_stages());
    reshard["to_training"] = reshard_json(hybrid_->to_training());
  } else {
    // Without the engine the training stages (if any) generate together; a cast rollout copy has none.
    if (rollout_ && free_rollout_copy_) make_rollout_copy();
    CausalLM& model = rollout_ ? rollout_ : actor();
    {
      MergedLoraScope merged(model, rollout_spec_.lora_merge);
      out = run(model, groups_ ? groups_->pipeline() : nullptr);
    }
    if (rollout_ && free_rollout_copy_) release_rollout_copy();
  }
  // The KV cache was this call's own; on a GPU its blocks go back to the device for the colocated roles.
  expert_switch.finish();
  if (rollout_spec_.free_cache_engine) release_cached_device_memory();
  DataProto result = agent_ ? std::move(agent_result) : rollout_result(out, g, in);
  if (hybrid_ || expert_reshard_) result.meta()["reshard"] = reshard;
  return result;
}

torch::Tensor ActorRolloutRefWorker::log_probs_of(CausalLM& model, PipelineStageRunner* pipeline,
                                                  const DataProto& in, const MicroBatching& how,
                                                  RouterReplayPass* replay, torch::Tensor* sum_pi_squared) const {
  torch::NoGradGuard no_grad;
  // The old (and reference) log-probs on the kernels the rollout recorded its own with.
  BatchInvariantGuard batch_invariant(rollout_spec_.batch_invariant);
  const double temperature = rollout_spec_.temperature;
  const bool replaying = replay != nullptr && replay->active();
  const bool here = replaying && !replay->staged();  // a staged pass runs around every stage's forward itself
  // Each micro-batch's own response width: one formed by token count is cut to its longest response. With
  // sum_pi_squared the two [b, w] results travel stacked as one [b, w, 2].
  const bool with_sum_pi_squared = sum_pi_squared != nullptr;
  torch::Tensor log_probs =
      forward_micro_batches(pipeline, replaying ? replay->with_row_index(in) : in, how, [&](const DataProto& m) {
        if (here) replay->begin(m);
        const TokenLogProbs lp = policy_log_probs(model_spec_.use_remove_padding, model, m,
                                                  m.tensor("responses").size(1), temperature, /*with_entropy=*/false,
                                                  with_sum_pi_squared);
        if (here) replay->end(m);
        if (!with_sum_pi_squared || !lp.log_probs.defined()) return lp.log_probs;
        return torch::stack({lp.log_probs, lp.sum_pi_squared}, -1);
      });
  if (!log_probs.defined()) return log_probs;  // a stage before the last
  const torch::Tensor mask = in.tensor("response_mask").to(torch::kFloat);
  if (with_sum_pi_squared) {
    *sum_pi_squared = (log_probs.select(-1, 1) * mask).contiguous();
    log_probs = log_probs.select(-1, 0);
  }
  return (log_probs * mask).contiguous();
}

DataProto ActorRolloutRefWorker::compute_log_prob(const DataProto& in) {
  auto on = trainable_->params_on_device();
  // Expert parallelism: the pass runs on every expert in each rank (micro-batches formed by tokens may differ in
  // number between the ranks).
  ExpertsGathered gathered({&actor()});
  return on_sequence_parallel_rows(sequence_parallel_.get(), {&actor()}, in, [&](const DataProto& rows) {
    DataProto out;
    RouterReplayPass replay(actor(), parse_router_replay_policy(actor_spec_.router_replay, "router_replay.mode"), rows,
                            trainable_->pipeline());
    torch::Tensor sum_pi_squared;
    torch::Tensor log_probs = log_probs_of(actor(), trainable_->pipeline(), rows, rollout_spec_.log_prob, &replay,
                                           actor_spec_.calculate_sum_pi_squared ? &sum_pi_squared : nullptr);
    if (log_probs.defined()) out.set_tensor("old_log_probs", log_probs);
    if (sum_pi_squared.defined()) out.set_tensor("sum_pi_squared", sum_pi_squared);
    replay.write(out);
    return out;
  });
}

DataProto ActorRolloutRefWorker::compute_ref_log_prob(const DataProto& in) {
  HF_CHECK(ref_spec_, "compute_ref_log_prob: role '", context().role,
           "' was created without a reference model (has_ref: false, no `ref` spec)");
  ExpertsGathered gathered({ref_ ? &ref_ : &actor()});  // as in compute_log_prob
  return on_sequence_parallel_rows(sequence_parallel_.get(), {ref_ ? &ref_ : &actor()}, in, [&](const DataProto& rows) {
    DataProto out;
    torch::Tensor log_probs;
    if (ref_) {
      log_probs = log_probs_of(ref_, ref_pipeline_.get(), rows, ref_spec_->log_prob);
    } else {  // LoRA: the actor without its adapters
      auto on = trainable_->params_on_device();
      LoraDisabledScope base(actor());
      log_probs = log_probs_of(actor(), trainable_->pipeline(), rows, ref_spec_->log_prob);
    }
    if (log_probs.defined()) out.set_tensor("ref_log_prob", log_probs);
    return out;
  });
}

DataProto ActorRolloutRefWorker::update_actor(const DataProto& in) {
  return update_on_sequence_parallel_rows(sequence_parallel_.get(), {&actor()}, in, "actor/",
                                          [&](const DataProto& rows) { return update_actor_rows(rows); });
}

DataProto ActorRolloutRefWorker::update_actor_rows(const DataProto& in) {
  auto on = trainable_->params_on_device();
  algo::PolicyLossConfig loss_cfg = actor_spec_.policy_loss;
  // seq-mean-token-sum-norm divides by the batch's response width, not by a micro-batch's: one formed by
  // token count is cut to its own longest response.
  if (!loss_cfg.loss_scale_factor && in.has_tensor("response_mask"))
    loss_cfg.loss_scale_factor = static_cast<double>(in.tensor("response_mask").size(1));
  const double entropy_coeff = actor_spec_.loss_terms.entropy_coeff;
  const bool use_kl_loss = actor_spec_.loss_terms.use_kl_loss;
  const double kl_coef = actor_spec_.loss_terms.kl_loss_coef;
  const algo::KlType kl_type = actor_spec_.loss_terms.kl_loss_type;
  const double temperature = rollout_spec_.temperature;
  HF_CHECK(!use_kl_loss || in.has_tensor("ref_log_prob"), "update_actor: use_kl_loss needs tensor ref_log_prob in the batch");

  // Bypass mode (the old log-probs are the rollout's): the correction is taken against the current policy
  // per micro-batch, as verl's bypass loss does.
  std::optional<algo::RolloutCorrectionConfig> bypass;
  if (in.meta().contains("rollout_correction"))
    bypass = algo::rollout_correction_config_from_json(in.meta().at("rollout_correction"));

  // Router replay (R2, R3): every forward routes by the batch's routed_experts.
  const bool replay =
      parse_router_replay_policy(actor_spec_.router_replay, "router_replay.mode") != RouterReplayPolicy::kDisabled &&
      actor()->config().num_moe_layers() > 0;
  HF_CHECK(!replay || in.has_tensor("routed_experts"), "update_actor: router_replay.mode ", actor_spec_.router_replay,
           " needs tensor routed_experts in the batch (from the rollout, R3, or the old-log-prob pass, R2)");
  // Pipeline stages: every stage's forward replays its layers of the micro-batch's routing (the loss function
  // runs on the last stage only). The update's router_replay_differs then covers the last stage's layers alone
  // and is not reported.
  StagedRouterReplay staged_replay(replay ? trainable_->pipeline() : nullptr, actor());

  MetricAverager metrics;
  auto loss_fn = [&](const DataProto& m) {
    auto mask = m.tensor("response_mask").to(torch::kFloat);
    const int64_t response_len = mask.size(1);
    const bool replay_here = replay && !staged_replay.active();
    if (replay_here) actor()->set_router_replay(RouterReplayMode::kReplay, routing_of(m.tensor("routed_experts")));
    TokenLogProbs lp;
    {
      RECORD_USER_SCOPE("hf::policy_log_probs");  // the model's forward and the head's log-probs
      lp = policy_log_probs(model_spec_.use_remove_padding, actor(), m, response_len, temperature,
                            /*with_entropy=*/true);
    }
    if (replay_here) {
      // The share of replayed tokens the current router would send elsewhere: how far training has moved it.
      const auto recorded = recorded_tokens(m.tensor("routed_experts"), m.tensor("attention_mask"));
      const auto changed = actor()->replay_differs().to(recorded.device()).logical_and(recorded);
      metrics.add("actor/router_replay_differs",
                  changed.sum().item<double>() / std::max(1.0, recorded.sum().item<double>()));
      actor()->set_router_replay(RouterReplayMode::kOff);
    }
    algo::PolicyLossOutput pg;
    if (bypass) {
      const auto rc = algo::rollout_correction(lp.log_probs.detach(), m.tensor("old_log_probs"), mask, *bypass);
      for (const auto& [key, value] : rc.metrics) metrics.add(key, value);
      if (rc.keep_mask.defined()) mask = rc.keep_mask;  // rejected tokens leave every term of the loss
      // ppo_clip's ratio is already against the rollout: its weights would correct twice.
      pg = bypass->loss_type == algo::RolloutLossType::kReinforce
               ? algo::reinforce_policy_loss(m.tensor("old_log_probs"), lp.log_probs, m.tensor("advantages"), mask,
                                             loss_cfg.agg_mode, loss_cfg.loss_scale_factor, rc.weights)
               : algo::policy_loss(m.tensor("old_log_probs"), lp.log_probs, m.tensor("advantages"), mask, loss_cfg);
    } else {
      // Importance weights against the rollout policy (algo/rollout_correction.h), when sent.
      pg = algo::policy_loss(m.tensor("old_log_probs"), lp.log_probs, m.tensor("advantages"), mask, loss_cfg,
                             m.has_tensor("rollout_is_weights") ? m.tensor("rollout_is_weights") : torch::Tensor());
    }
    torch::Tensor loss = pg.loss;
    // Entropy and KL keep loss_agg_mode even under GSPO, as verl's actor does.
    const auto entropy = algo::agg_loss(lp.entropy, mask, loss_cfg.agg_mode, loss_cfg.loss_scale_factor);
    if (entropy_coeff != 0) loss = loss - entropy_coeff * entropy;
    if (use_kl_loss) {
      auto kl = algo::kl_loss(lp.log_probs, m.tensor("ref_log_prob"), mask, kl_type, loss_cfg.agg_mode,
                              std::nullopt, loss_cfg.loss_scale_factor);
      loss = loss + kl_coef * kl;
      metrics.add("actor/kl_loss", kl.item<double>());
    }
    metrics.add("actor/pg_loss", pg.loss.item<double>());
    metrics.add("actor/pg_clipfrac", pg.clip_frac.item<double>());
    metrics.add("actor/pg_clipfrac_lower", pg.clip_frac_lower.item<double>());
    // clip_cov / kl_cov: the share of tokens the covariance selected (dropped, or KL-penalised).
    if (pg.cov_frac.defined()) metrics.add("actor/pg_cov_frac", pg.cov_frac.item<double>());
    metrics.add("actor/ppo_kl", pg.approx_kl.item<double>());
    metrics.add("actor/entropy", entropy.item<double>());
    return loss;
  };
  MiniBatchPlan plan = mini_batch_plan(actor_spec_.train, in.meta());
  // The policy loss decides how micro-batches combine (GSPO's is per sequence whatever loss_agg_mode says).
  plan.weighting = loss_weighting_for(loss_cfg.policy_agg_mode());
  plan.max_token_len_key = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu";
  DataProto out = trainable_->update(in, plan, loss_fn, "actor/", metrics, "update_actor");
  sync_rollout_weights();
  return out;
}

DataProto ActorRolloutRefWorker::flat_parameters(const DataProto&) { return trainable_->flat_parameters(); }

DataProto ActorRolloutRefWorker::join_weight_sync(const DataProto& in) {
  HF_CHECK(in.meta().contains("weight_sync"), "join_weight_sync: meta 'weight_sync' is required");
  HF_CHECK(!hybrid_, "role '", context().role, "': a standalone rollout pool takes the actor's training layout; ",
           "the actor itself must not switch layouts (leave actor_rollout_ref.rollout's parallel sizes to the rollout)");
  weight_sync_ = hybridflow::join_weight_sync(in.meta().at("weight_sync"), rank(), device());
  return DataProto();
}

DataProto ActorRolloutRefWorker::send_weights(const DataProto&) {
  HF_CHECK(weight_sync_, "send_weights: call join_weight_sync first");
  auto on = trainable_->params_on_device();
  // Split experts go out gathered (each whole on every rank, as the pool's model holds them), then drop again.
  ExpertsGathered gathered({&actor()}, /*even_when_folded=*/true);
  return weight_sync_reply(weight_sync_->send(actor()), rank());
}

DataProto ActorRolloutRefWorker::memory_stats(const DataProto&) { return memory_stats_row(); }

DataProto ActorRolloutRefWorker::save_checkpoint(const DataProto& in) { return trainable_->save_checkpoint(in); }

DataProto ActorRolloutRefWorker::save_lora_adapter(const DataProto& in) { return trainable_->save_lora_adapter(in); }

DataProto ActorRolloutRefWorker::load_checkpoint(const DataProto& in) {
  // The reference model stays as built: it is the initial policy, not a trained one.
  return trainable_->load_checkpoint(in, [this] { sync_rollout_weights(); });
}

void ActorRolloutRefWorker::make_rollout_copy() {
  torch::NoGradGuard no_grad;
  auto source = actor()->parameters();
  auto target = rollout_->parameters();
  for (size_t i = 0; i < target.size(); ++i) point_at(target[i], source[i].detach().to(target[i].scalar_type()));
}

void ActorRolloutRefWorker::release_rollout_copy() {
  for (auto& p : rollout_->parameters()) point_at(p, torch::empty({0}, p.options()));
}

void ActorRolloutRefWorker::sync_rollout_weights() {
  if (!rollout_ || free_rollout_copy_) return;  // a released copy is made afresh at each rollout
  torch::NoGradGuard no_grad;
  auto source = actor()->parameters();
  auto target = rollout_->parameters();
  for (size_t i = 0; i < target.size(); ++i) target[i].copy_(source[i]);
}

DataProto ActorRolloutRefWorker::parameter_norm(const DataProto&) { return trainable_->parameter_norm(); }

}  // namespace hybridflow
