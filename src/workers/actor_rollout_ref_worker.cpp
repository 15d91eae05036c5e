#include "hybridflow/workers/actor_rollout_ref_worker.h"

#include <ATen/Parallel.h>

#include "hybridflow/algo/algo_config.h"
#include "hybridflow/algo/kl.h"
#include "hybridflow/algo/losses.h"
#include "hybridflow/core/error.h"
#include "hybridflow/engine/generation.h"
#include "hybridflow/engine/model_log_probs.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/runtime/protocol.h"
#include "hybridflow/workers/checkpoint_io.h"
#include "hybridflow/workers/model_spec.h"
#include "hybridflow/workers/ppo_epochs.h"
#include "hybridflow/workers/rl_batch.h"

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
          {"seconds", s.seconds}};
}

}  // namespace

void ActorRolloutRefWorker::register_methods(MethodTable& table) {
  config_ = context().config;
  at::set_num_threads(config_.value("threads", 1));
  const auto& spec = config_.at("model");
  set_device(model_device(spec));
  // Several processes train as one: tensor-parallel groups split the model, data-parallel groups the batch.
  if (world_size() > 1) groups_ = RoleProcessGroups::connect(context(), device());
  const TensorParallelGroup tp = groups_ ? groups_->tensor_parallel() : TensorParallelGroup();
  const PipelineStage stage = groups_ ? groups_->pipeline_stage() : PipelineStage();
  nlohmann::json actor_spec = spec;
  actor_spec["dtype"] = config_.value("actor", nlohmann::json::object()).value("dtype", spec.value("dtype", "fp32"));
  actor_ = build_model(actor_spec, HeadKind::kLanguageModel, tp, stage);
  if (groups_) actor_pipeline_ = groups_->pipeline_runner(actor_);
  const auto rollout = config_.value("rollout", nlohmann::json::object());
  const int gen_tp = rollout.value("tensor_model_parallel_size", coord().tp_size);
  const int gen_pp = rollout.value("pipeline_model_parallel_size", 1);
  // Generation in another dtype than training (e.g. bf16 rollout of an fp32 actor) runs on a cast copy
  // of the actor's weights, refreshed after every update; in the same dtype it uses the actor itself.
  const std::string rollout_dtype = rollout.value("dtype", actor_spec.at("dtype").get<std::string>());
  if (parse_dtype(rollout_dtype, "rollout dtype") != parse_dtype(actor_spec.at("dtype").get<std::string>(), "actor dtype")) {
    HF_CHECK(gen_tp == coord().tp_size && !stage.enabled(), "role '", context().role, "': a rollout dtype (",
             rollout_dtype, ") other than the actor's needs the actor's tensor-parallel size for generation (",
             coord().tp_size, ", got ", gen_tp, ") and no pipeline stages (pp ", coord().pp_size, ")");
    nlohmann::json rollout_spec = actor_spec;
    rollout_spec["dtype"] = rollout_dtype;
    rollout_ = build_model(rollout_spec, HeadKind::kLanguageModel, tp);
    rollout_->eval();
    for (auto& p : rollout_->parameters()) p.set_requires_grad(false);
  }
  if (config_.value("has_ref", false)) {
    nlohmann::json ref_spec = actor_spec;
    ref_spec["dtype"] = config_.value("ref_dtype", actor_spec.at("dtype").get<std::string>());
    ref_ = build_model(ref_spec, HeadKind::kLanguageModel, tp, stage);
    if (groups_) ref_pipeline_ = groups_->pipeline_runner(ref_);
    ref_->eval();
    for (auto& p : ref_->parameters()) p.set_requires_grad(false);
  }
  engine_ = std::make_unique<TrainEngine>(actor_.ptr(), optimizer_options_from_json(config_.value("actor", nlohmann::json::object())));
  use_model_layout(*engine_, actor_, actor_pipeline_);
  if (groups_)
    dp_ = DataParallel::join(groups_->data_parallel(), context().role, *actor_, *engine_,
                             config_.value("actor", nlohmann::json::object()).value("use_distributed_optimizer", false));
  // The training layout generates as it is when t_g = t and p_g = p; any other generation layout switches
  // through the engine (unstaged generation, p_g = 1, gathers the stages even at t_g = t).
  if (gen_tp != coord().tp_size || gen_pp != coord().pp_size)
    start_hybrid_engine(gen_tp, gen_pp, rollout.value("reshard_mode", std::string("hybridflow")));

  using W = ActorRolloutRefWorker;
  table.add("generate_sequences", rollout_protocol(coord()), this, &W::generate_sequences);
  table.add("compute_log_prob", batch_protocol(coord()), this, &W::compute_log_prob);
  table.add("compute_ref_log_prob", batch_protocol(coord()), this, &W::compute_ref_log_prob);
  table.add("update_actor", batch_protocol(coord()), this, &W::update_actor);
  table.add("save_checkpoint", protocols::kOneToAll, this, &W::save_checkpoint);
  table.add("load_checkpoint", protocols::kOneToAll, this, &W::load_checkpoint);
  table.add("parameter_norm", protocols::kOneToAll, this, &W::parameter_norm);
  table.add("flat_parameters", protocols::kOneToAll, this, &W::flat_parameters);
}

void ActorRolloutRefWorker::start_hybrid_engine(int gen_tp, int gen_pp, const std::string& mode) {
  const MeshCoord& c = coord();
  HF_CHECK(groups_, "role '", context().role, "': generation tensor/pipeline-parallel size ", gen_tp, "/", gen_pp,
           " differs from training's 1/1 on a single process");
  const GenerationLayout layout(DeviceMesh(c.pp_size, c.dp_size, c.tp_size), gen_tp, gen_pp);
  hybrid_ = std::make_unique<HybridEngine>(actor_, layout, groups_->world(), parse_reshard_mode(mode));
  // The controller splits prompts by the coordinates it computed (mesh_coord.h); they must name the replica
  // the engine generates with, or two replicas would generate the same prompts.
  HF_CHECK(hybrid_->generation_replicas() == c.micro_dp_size && hybrid_->generation_replica() == c.micro_dp,
           "role '", context().role, "' rank ", c.rank, ": the controller dispatches prompts to generation replica ",
           c.micro_dp, " of ", c.micro_dp_size, " but the ", mode, " engine made it replica ",
           hybrid_->generation_replica(), " of ", hybrid_->generation_replicas(),
           " (create the worker group with the generation tp and reshard mode of the rollout config)");
}

DataProto ActorRolloutRefWorker::generate_sequences(const DataProto& in) {
  const auto rollout = config_.value("rollout", nlohmann::json::object());
  const ModelConfig& mc = actor_->config();
  GenerationConfig g;
  g.max_new_tokens = rollout.value("response_length", int64_t{32});
  g.temperature = rollout.value("temperature", 1.0);
  g.top_k = rollout.value("top_k", int64_t{0});
  g.top_p = rollout.value("top_p", 1.0);
  g.n = in.meta().value("n", rollout.value("n", int64_t{1}));
  g.greedy = in.meta().value("greedy", false);
  g.max_num_seqs = rollout.value("max_num_seqs", int64_t{0});
  // Each generation replica draws from its own stream, so replicas do not repeat each other's samples, and
  // the tensor-parallel ranks of a replica draw the same tokens.
  g.seed = in.meta().value("seed", rollout.value("seed", uint64_t{0})) * 1000003ULL + static_cast<uint64_t>(coord().micro_dp);
  const auto& spec = config_.at("model");
  if (spec.contains("eos_token_ids"))
    g.eos_token_ids = spec.at("eos_token_ids").get<std::vector<int64_t>>();
  else if (mc.eos_token_id >= 0)
    g.eos_token_ids = {mc.eos_token_id};
  g.pad_token_id = mc.pad_token_id >= 0 ? mc.pad_token_id : 0;
  // The spec's vocab_size is the tokenizer's: embedding rows past it (a padded vocabulary) decode to nothing.
  g.sampleable_vocab_size = std::min<int64_t>(spec.value("vocab_size", int64_t{0}), mc.vocab_size);

  const auto prompts = prompt_token_lists(in);
  GenerationOutput out;
  nlohmann::json reshard;
  if (hybrid_) {
    reshard["to_generation"] = reshard_json(hybrid_->to_generation());
    out = generate(hybrid_->generation_model(), prompts, g, hybrid_->generation_stages());
    reshard["to_training"] = reshard_json(hybrid_->to_training());
  } else {
    // Without the engine the training stages (if any) generate together; a cast rollout copy has none.
    out = generate(rollout_ ? rollout_ : actor_, prompts, g, groups_ ? groups_->pipeline() : nullptr);
  }
  DataProto result = rollout_batch(out, g.max_new_tokens, g.pad_token_id);
  if (hybrid_) result.meta()["reshard"] = reshard;
  if (in.has_tensor("input_ids")) result = left_pad_prompts(result, in.tensor("input_ids").size(1), g.pad_token_id);
  // Per-prompt fields follow their samples (prompt text and answer stay with each response).
  if (!in.fields().empty()) {
    DataProto fields;
    for (const auto& [key, values] : in.fields()) fields.set_field(key, values);
    result.update(fields.repeat(g.n, /*interleave=*/true));
  }
  return result;
}

torch::Tensor ActorRolloutRefWorker::log_probs_of(CausalLM& model, PipelineStageRunner* pipeline,
                                                  const DataProto& in, int64_t micro) const {
  torch::NoGradGuard no_grad;
  const auto rollout = config_.value("rollout", nlohmann::json::object());
  const double temperature = rollout.value("temperature", 1.0);
  const int64_t response_len = in.tensor("responses").size(1);
  torch::Tensor log_probs = forward_micro_batches(pipeline, in, micro, [&](const DataProto& m) {
    return response_log_probs(model, m.tensor("input_ids"), m.tensor("attention_mask"), response_len, temperature,
                              /*with_entropy=*/false)
        .log_probs;
  });
  if (!log_probs.defined()) return log_probs;  // a stage before the last
  return (log_probs * in.tensor("response_mask").to(torch::kFloat)).contiguous();
}

DataProto ActorRolloutRefWorker::compute_log_prob(const DataProto& in) {
  DataProto out;
  const auto rollout = config_.value("rollout", nlohmann::json::object());
  torch::Tensor log_probs =
      log_probs_of(actor_, actor_pipeline_.get(), in, rollout.value("log_prob_micro_batch_size", int64_t{16}));
  if (log_probs.defined()) out.set_tensor("old_log_probs", log_probs);
  return out;
}

DataProto ActorRolloutRefWorker::compute_ref_log_prob(const DataProto& in) {
  HF_CHECK(!ref_.is_empty(), "compute_ref_log_prob: role '", context().role,
           "' was created without a reference model (config has_ref: false)");
  DataProto out;
  const auto rollout = config_.value("rollout", nlohmann::json::object());
  torch::Tensor log_probs = log_probs_of(ref_, ref_pipeline_.get(), in,
                                         rollout.value("ref_log_prob_micro_batch_size",
                                                       rollout.value("log_prob_micro_batch_size", int64_t{16})));
  if (log_probs.defined()) out.set_tensor("ref_log_prob", log_probs);
  return out;
}

DataProto ActorRolloutRefWorker::update_actor(const DataProto& in) {
  if (dp_) dp_->check_same_rows(in.batch_size(), "update_actor");
  const auto actor = config_.value("actor", nlohmann::json::object());
  const algo::PolicyLossConfig loss_cfg = algo::policy_loss_config(actor);
  const double entropy_coeff = actor.value("entropy_coeff", 0.0);
  const bool use_kl_loss = actor.value("use_kl_loss", false);
  const double kl_coef = actor.value("kl_loss_coef", 0.001);
  const algo::KlType kl_type = algo::parse_kl_type(actor.value("kl_loss_type", std::string("low_var_kl")));
  const double temperature = config_.value("rollout", nlohmann::json::object()).value("temperature", 1.0);
  HF_CHECK(!use_kl_loss || in.has_tensor("ref_log_prob"), "update_actor: use_kl_loss needs tensor ref_log_prob in the batch");

  MetricAverager metrics;
  auto loss_fn = [&](const DataProto& m) {
    const auto mask = m.tensor("response_mask").to(torch::kFloat);
    const int64_t response_len = mask.size(1);
    auto lp = response_log_probs(actor_, m.tensor("input_ids"), m.tensor("attention_mask"), response_len, temperature,
                                 /*with_entropy=*/true);
    auto pg = algo::policy_loss(m.tensor("old_log_probs"), lp.log_probs, m.tensor("advantages"), mask, loss_cfg);
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
    metrics.add("actor/ppo_kl", pg.approx_kl.item<double>());
    metrics.add("actor/entropy", entropy.item<double>());
    return loss;
  };
  actor_->train();
  MiniBatchPlan plan = mini_batch_plan_from_json(actor, in.meta());
  // The policy loss decides how micro-batches combine (GSPO's is per sequence whatever loss_agg_mode says).
  plan.weighting = loss_weighting_for(loss_cfg.policy_agg_mode());
  run_ppo_epochs(*engine_, in, plan, loss_fn, "response_mask", "actor/", metrics);
  // fp32 moments and masters this rank holds: 1/d of them with use_distributed_optimizer.
  metrics.add("actor/optimizer_state_bytes", static_cast<double>(engine_->optimizer_state_numel()) * 4);
  sync_rollout_weights();
  // One row per rank: the runtime's collect drops the meta of row-less outputs.
  DataProto out;
  out.set_tensor("update_rank", torch::full({1}, static_cast<int64_t>(rank()), torch::kLong));
  out.meta()["metrics"] = dp_ ? dp_->metrics(metrics, "actor/") : metrics.to_json();
  if (dp_) out.meta()["comm"] = dp_->comm_stats();
  return out;
}

DataProto ActorRolloutRefWorker::flat_parameters(const DataProto&) { return hybridflow::flat_parameters(*actor_); }

DataProto ActorRolloutRefWorker::save_checkpoint(const DataProto& in) {
  HF_CHECK(in.meta().contains("dir") && in.meta().contains("tokenizer"),
           "save_checkpoint: meta 'dir' and 'tokenizer' (path of tokenizer.json) are required");
  save_role_checkpoint(in.meta().at("dir").get<std::string>(), context().role, coord(), actor_, *engine_,
                       in.meta().at("tokenizer").get<std::string>(), groups_ ? groups_->pipeline() : nullptr);
  return DataProto();
}

DataProto ActorRolloutRefWorker::load_checkpoint(const DataProto& in) {
  HF_CHECK(in.meta().contains("dir"), "load_checkpoint: meta 'dir' is required");
  // The reference model stays as built: it is the initial policy, not a trained one.
  load_role_checkpoint(in.meta().at("dir").get<std::string>(), context().role, coord(), actor_, *engine_);
  sync_rollout_weights();
  return DataProto();
}

void ActorRolloutRefWorker::sync_rollout_weights() {
  if (!rollout_) return;
  torch::NoGradGuard no_grad;
  auto source = actor_->parameters();
  auto target = rollout_->parameters();
  for (size_t i = 0; i < target.size(); ++i) target[i].copy_(source[i]);
}

DataProto ActorRolloutRefWorker::parameter_norm(const DataProto&) {
  DataProto out;
  out.set_tensor("param_sq_norm",
                 torch::full({1}, parameter_sq_norm(actor_, groups_ ? groups_->pipeline() : nullptr), torch::kDouble));
  return out;
}

}  // namespace hybridflow
