#include "role_spec_builders.h"

#include <set>

#include "hybridflow/algo/algo_config.h"
#include "hybridflow/core/error.h"
#include "hybridflow/core/logging.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/parallel/resharding.h"
#include "hybridflow/trainer/lora_keys.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/workers/expert_parallel_ranks.h"
#include "hybridflow/workers/router_replay.h"

namespace hybridflow {
namespace {

// verl hands override_optimizer_config's entries to the optimizer's constructor as keyword arguments, over the
// block's own: the ones torch.optim.AdamW takes are read; its kernel switches (foreach, fused, ...) are dropped,
// hybridflow picks its own kernels.
void apply_optimizer_overrides(const ConfigReader& optim, const std::string& key, OptimizerOptions& o) {
  optim.note("override_optimizer_config");
  const Config overrides = optim.config().subtree("override_optimizer_config");
  for (const std::string& name : overrides.keys()) {
    if (overrides.is_null(name)) continue;
    const std::string full = key + ".override_optimizer_config." + name;
    if (name == "lr") {
      o.schedule.lr = overrides.get<double>(name);
    } else if (name == "weight_decay") {
      o.weight_decay = overrides.get<double>(name);
    } else if (name == "eps") {
      o.eps = overrides.get<double>(name);
      HF_CHECK(o.eps > 0, full, " must be > 0, got ", o.eps);
    } else if (name == "betas") {
      set_adam_betas(o, overrides.get<std::vector<double>>(name), full);
    } else if (name == "amsgrad" || name == "maximize") {
      HF_CHECK(!overrides.get<bool>(name), full, ": only false is supported by hybridflow's AdamW");
    } else if (name == "optimizer_cpu_offload" || name == "optimizer_offload_fraction" ||
               name == "overlap_cpu_optimizer_d2h_h2d" || name == "use_precision_aware_optimizer") {
      // Megatron's hybrid CPU optimizer (verl's Megatron examples): the update is the same AdamW step.
      const std::string role = key.substr(0, key.size() - std::string(".optim").size());
      log_warn(full, " (Megatron-LM's CPU optimizer) is ignored: hybridflow steps AdamW on the device; ", role,
               role == "critic" ? ".model" : "", ".fsdp_config.optimizer_offload keeps its state in host memory ",
               "between steps");
    } else if (name != "foreach" && name != "fused" && name != "capturable" && name != "differentiable") {
      HF_FAIL(full, ": not an AdamW argument; expected lr, weight_decay, eps, betas, amsgrad / maximize (false), ",
              "foreach / fused / capturable / differentiable (ignored) or Megatron's optimizer_cpu_offload, ",
              "optimizer_offload_fraction, overlap_cpu_optimizer_d2h_h2d, use_precision_aware_optimizer (ignored)");
    }
  }
}

// A role's verl optim block (`section`.optim) as its optimizer: one reader for the actor's and the
// critic's. The schedule advances once per RL step, as verl's: warm-up from 0 over lr_warmup_steps (or
// lr_warmup_steps_ratio x the total steps when negative), then constant or a cosine decay to min_lr_ratio x
// lr at total_training_steps (num_cycles waves of it).
OptimizerOptions optim_spec(const ConfigReader& role, const std::string& section, int64_t total_steps) {
  const ConfigReader optim = role.subtree("optim");
  const std::string key = section + ".optim";
  const int64_t total = optim.is_null("total_training_steps") ? total_steps : optim.get<int64_t>("total_training_steps");
  HF_CHECK(total > 0, key, ".total_training_steps must be > 0 (or null: trainer.total_steps), got ", total);
  std::string kind = optim.get<std::string>("lr_scheduler_type");
  if (!optim.is_null("warmup_style")) {  // verl's older name; a config that sets both means the old one
    const std::string style = optim.get<std::string>("warmup_style");
    if (style != kind)
      log_warn(key, ".warmup_style = ", style, " (verl's deprecated name) overrides lr_scheduler_type = ", kind);
    kind = style;
  }
  HF_CHECK(kind == "constant" || kind == "cosine", key, ".lr_scheduler_type: expected constant | cosine (verl's), got '",
           kind, "'");
  const double ratio = optim.get<double>("lr_warmup_steps_ratio");
  HF_CHECK(ratio >= 0 && ratio <= 1, key, ".lr_warmup_steps_ratio must be in [0, 1], got ", ratio);
  const int64_t steps = optim.get<int64_t>("lr_warmup_steps");
  const int64_t warmup = steps >= 0 ? steps : static_cast<int64_t>(ratio * static_cast<double>(total));
  HF_CHECK(kind == "constant" || warmup < total, key, ": a cosine decay needs lr_warmup_steps (", warmup,
           ") < total_training_steps (", total, ")");
  const double min_lr_ratio = optim.get<double>("min_lr_ratio");
  HF_CHECK(min_lr_ratio >= 0 && min_lr_ratio <= 1, key, ".min_lr_ratio must be in [0, 1], got ", min_lr_ratio);
  OptimizerOptions o;
  o.schedule.lr = optim.get<double>("lr");
  o.schedule.warmup_steps = warmup;
  o.schedule.warmup_from_zero = true;
  o.schedule.kind = kind;
  o.schedule.min_lr_ratio = min_lr_ratio;
  o.schedule.total_steps = total;
  o.schedule.num_cycles = optim.get<double>("num_cycles");
  HF_CHECK(o.schedule.num_cycles > 0, key, ".num_cycles must be > 0 (0.5: half a cosine), got ", o.schedule.num_cycles);
  o.weight_decay = optim.get<double>("weight_decay");
  set_adam_betas(o, optim.get<std::vector<double>>("betas"), key + ".betas");
  o.grad_clip = optim.get<double>("grad_clip");
  apply_optimizer_overrides(optim, key, o);
  return o;
}

// A role's dtype key (null = `fallback`), normalised to fp32 | bf16 | fp16; the error names the full key.
std::string role_dtype(const ConfigReader& role, const std::string& full_key, const std::string& fallback) {
  if (role.is_null("dtype")) return fallback;
  switch (parse_dtype(role.get<std::string>("dtype"), full_key)) {
    case torch::kBFloat16: return "bf16";
    case torch::kFloat16: return "fp16";
    default: return "fp32";
  }
}

// A role's training layout from verl's megatron keys under `section`, checked against its pool.
ParallelLayout role_layout(const ConfigReader& c, const std::string& section, const RoleFacts::Pool& pool) {
  const std::string tp_key = section + ".megatron.tensor_model_parallel_size";
  const std::string pp_key = section + ".megatron.pipeline_model_parallel_size";
  const int tp = c.get<int>(tp_key);
  const int pp = c.get<int>(pp_key);
  HF_CHECK(tp >= 1, tp_key, " must be >= 1, got ", tp);
  HF_CHECK(pp >= 1, pp_key, " must be >= 1, got ", pp);
  HF_CHECK(pool.processes % (tp * pp) == 0, pool.key, " = ", pool.processes,
           " processes do not divide into model-parallel groups of ", tp_key, " = ", tp, " x ", pp_key, " = ", pp);
  ParallelLayout layout;
  layout.tp = tp;
  layout.pp = pp;
  return layout;
}

int dp_of(const ParallelLayout& layout, const RoleFacts::Pool& pool) { return pool.processes / (layout.tp * layout.pp); }

// <section>.use_remove_padding: padding-free packing of the role's passes (not through pipeline stages).
bool remove_padding(const ConfigReader& c, const std::string& section, const ParallelLayout& layout) {
  const std::string key = section + ".use_remove_padding";
  const bool on = c.get<bool>(key);
  HF_CHECK(!on || layout.pp == 1, key, " = true with pipeline_model_parallel_size = ", layout.pp,
           ": packed rows do not pass through pipeline stages yet; set one of them off");
  return on;
}

// <section>.ulysses_sequence_parallel_size: groups of that many consecutive data-parallel ranks (of one pipeline
// stage and tensor rank) split each sequence (workers/sequence_parallel_rows.h), so the role's batches split over
// dp / size groups, as in verl and as Megatron's context_parallel_size, which is read as this key.
int sequence_parallel_size(const ConfigReader& c, const std::string& section, const ParallelLayout& layout, int dp) {
  const std::string key = section + ".ulysses_sequence_parallel_size";
  const int sp = c.get<int>(key);
  HF_CHECK(sp >= 1, key, " must be >= 1, got ", sp);
  if (sp == 1) return sp;
  HF_CHECK(dp % sp == 0, key, " = ", sp, " does not divide the role's ", dp, " data-parallel processes (",
           dp * layout.tp * layout.pp, " processes over tensor_model_parallel_size ", layout.tp,
           " and pipeline_model_parallel_size ", layout.pp, ")");
  return sp;
}

// <section>.megatron.expert_model_parallel_size: groups of that many ranks split each mixture-of-experts layer's
// experts, every rank keeping its share of the batch (workers/expert_parallel_ranks.h: under tensor parallelism
// the groups fold the tensor-parallel ranks in when the size is a multiple of theirs, Megatron's layout; else
// they are data-parallel ranks of one tensor rank), in every pipeline stage (the experts of the stage's layers);
// with sequence parallelism the group exchanges each rank's slice of its rows.
int expert_parallel_size(const ConfigReader& c, const std::string& section, const ParallelLayout& layout, int dp) {
  const std::string key = section + ".megatron.expert_model_parallel_size";
  const int ep = c.get<int>(key);
  const ExpertParallelShape shape = expert_parallel_shape(ep, layout.tp, dp, key);
  if (ep == 1) return ep;
  // Experts folded over exactly the tensor-parallel ranks are that group's split for the engine, which combines
  // it with stages and the distributed optimizer as for dense weights.
  const int pp = c.get<int>(section + ".megatron.pipeline_model_parallel_size");
  HF_CHECK(pp == 1 || shape.follows_tensor_parallel() || !c.get<bool>(section + ".megatron.use_distributed_optimizer"),
           key, " = ", ep, " with ", section, ".megatron.pipeline_model_parallel_size = ", pp, " and ", section,
           ".megatron.use_distributed_optimizer = true: expert parallelism over data-parallel ranks is combined with ",
           "pipeline stages or with the distributed optimizer, not yet with both; set one of them off, or fold the ",
           "experts over the tensor-parallel ranks (expert_model_parallel_size = tensor_model_parallel_size)");
  return ep;
}

// How a role trains besides its optimizer and batch sizes: epochs, order, sharding and offload.
void train_settings(const ConfigReader& role, const std::string& section, const std::string& fsdp, TrainSpec* t) {
  t->epochs = role.get<int64_t>("ppo_epochs");
  HF_CHECK(t->epochs > 0, section, ".ppo_epochs must be > 0, got ", t->epochs);
  t->shuffle = role.get<bool>("shuffle");
  t->use_distributed_optimizer = role.get<bool>("megatron.use_distributed_optimizer");
  t->param_offload = role.get<bool>(fsdp + ".param_offload");
  t->optimizer_offload = role.get<bool>(fsdp + ".optimizer_offload");
}

// A role's LoRA keys under `section` (<role>.model) into its model spec (trainer/lora_keys.h).
void lora_settings(const ConfigReader& model, const std::string& section, ModelSpec* spec) {
  for (const char* key : kLoraKeys) model.note(key);
  spec->lora = read_lora_keys(model.config(), &spec->lora_adapter_path);
  spec->lora_key = section;
}

// Training roles split their adapters with their base weights under tensor parallelism; a standalone
// rollout pool's adapter-only sync does not split them yet.
void check_lora_unsplit(const ModelSpec& model, const std::string& tp_key, int tp, const char* what) {
  HF_CHECK(!model.uses_lora() || tp == 1, model.lora_key, ".lora_rank / lora_adapter_path: LoRA adapters need ",
           tp_key, " = 1 (", what, " are not supported yet), got ", tp);
}

// actor_rollout_ref.rollout.n, checked against the advantage estimator.
int64_t samples_per_prompt(const ConfigReader& c, const RoleFacts& f) {
  const int64_t n = c.get<int64_t>("actor_rollout_ref.rollout.n");
  HF_CHECK(n >= 1, "actor_rollout_ref.rollout.n must be >= 1, got ", n);
  // A group of one sample has no baseline: as in verl its mean is 0 (and its std 1), so its advantage is its
  // score, REINFORCE without a baseline. verl runs it; say so rather than refuse.
  static const std::set<std::string> kGroupBaselines = {"grpo", "rloo", "reinforce_plus_plus_baseline", "gpg"};
  if (n == 1 && kGroupBaselines.count(f.adv_estimator) > 0)
    log_warn("algorithm.adv_estimator=", f.adv_estimator, " with actor_rollout_ref.rollout.n = 1: every prompt's group ",
             "is one sample, whose baseline is 0 (verl's rule), so each advantage follows the sample's score alone ",
             "(REINFORCE without a baseline); set n >= 2 for the group comparison");
  return n;
}

// Generation's layout in the actor's processes: a smaller tensor-parallel size switches through the
// 3D-HybridEngine. With a standalone rollout pool the rollout keys describe that pool, and the actor
// generates (never, in fact) in its training layout.
void generation_layout(const ConfigReader& rollout, const RoleFacts& f, ParallelLayout* layout) {
  const std::string gen_key = "actor_rollout_ref.rollout.tensor_model_parallel_size";
  const std::string gen_pp_key = "actor_rollout_ref.rollout.pipeline_model_parallel_size";
  const std::string mode_key = "actor_rollout_ref.rollout.reshard_mode";
  const bool tp_unset = rollout.is_null("tensor_model_parallel_size");
  const int gen_pp = rollout.get<int>("pipeline_model_parallel_size");
  const std::string mode_name = rollout.get<std::string>("reshard_mode");
  if (f.standalone_rollout) {
    layout->gen_tp = layout->tp;
    layout->gen_pp = layout->pp;
    return;
  }
  layout->gen_tp = tp_unset ? layout->tp : rollout.get<int>("tensor_model_parallel_size");
  if (layout->gen_tp > layout->tp && layout->gen_tp % layout->tp == 0) {
    // verl's usual layout: an FSDP actor (no tensor parallelism) and vLLM at TP 2 or more. Here each training rank
    // already holds its whole tensor-parallel part of the model, so generating at the training's size takes no
    // more memory and no weight exchange; the samples are the same up to rounding.
    log_warn(gen_key, " = ", layout->gen_tp, " is larger than the actor's tensor_model_parallel_size = ", layout->tp,
             ": the actor generates at ", layout->tp, " (its training groups hold the whole model, so the memory is ",
             "the same); a standalone rollout pool (trainer.placement: standalone) generates at any size");
    layout->gen_tp = layout->tp;
  }
  HF_CHECK(layout->gen_tp >= 1 && layout->tp % layout->gen_tp == 0, gen_key, " = ", layout->gen_tp,
           " must divide actor_rollout_ref.actor.megatron.tensor_model_parallel_size = ", layout->tp,
           " (generation groups are made of parts of the training groups)");
  layout->gen_pp = gen_pp;
  HF_CHECK(layout->gen_pp >= 1 && layout->pp % layout->gen_pp == 0, gen_pp_key, " = ", layout->gen_pp,
           " must divide actor_rollout_ref.actor.megatron.pipeline_model_parallel_size = ", layout->pp,
           " (a generation stage is made of consecutive training stages; 1 generates unstaged)");
  ReshardMode mode;
  try {
    mode = parse_reshard_mode(mode_name);
  } catch (const Error& e) {
    HF_FAIL(mode_key, ": ", e.what());
  }
  layout->consecutive_generation_groups = mode == ReshardMode::kHybridFlowV;
  HF_CHECK(layout->gen_pp == 1 || mode == ReshardMode::kHybridFlow ||
               (layout->gen_pp == layout->pp && layout->gen_tp == layout->tp),
           gen_pp_key, " = ", layout->gen_pp, ": generation in pipeline stages switches layouts in ", mode_key,
           " = hybridflow only, got ", mode_name);
}

// A standalone rollout pool's layout: rollout.tensor_model_parallel_size ranks per replica (null: 1), unstaged.
ParallelLayout standalone_rollout_layout(const ConfigReader& rollout, const RoleFacts& f) {
  const std::string tp_key = "actor_rollout_ref.rollout.tensor_model_parallel_size";
  const std::string pp_key = "actor_rollout_ref.rollout.pipeline_model_parallel_size";
  ParallelLayout layout;
  layout.tp = rollout.is_null("tensor_model_parallel_size") ? 1 : rollout.get<int>("tensor_model_parallel_size");
  HF_CHECK(layout.tp >= 1, tp_key, " must be >= 1, got ", layout.tp);
  const int pp = rollout.get<int>("pipeline_model_parallel_size");
  HF_CHECK(pp == 1, pp_key, " = ", pp, ": a standalone rollout pool generates unstaged; leave it 1");
  HF_CHECK(f.rollout.processes % layout.tp == 0, f.rollout.key, " = ", f.rollout.processes,
           " processes do not divide into generation replicas of ", tp_key, " = ", layout.tp);
  const int replicas = f.rollout.processes / layout.tp;
  HF_CHECK(f.batch_prompts % replicas == 0, "data.train_batch_size = ", f.batch_prompts,
           " prompts must divide across the rollout pool's ", replicas, " generation replicas (", f.rollout.key,
           " = ", f.rollout.processes, " / rollout.tensor_model_parallel_size = ", layout.tp, ")");
  return layout;
}

// The actor (actor_rollout_ref.actor and actor_rollout_ref.model): its layout over its pool, optimizer,
// batch split and loss.
RolePlan<ActorSpec> actor_plan(const ConfigReader& c, const RoleFacts& f, const ModelSpec& model, int64_t n,
                               DynamicBsz* bsz) {
  const std::string section = "actor_rollout_ref.actor";
  const ConfigReader actor = c.subtree(section);
  RolePlan<ActorSpec> plan;
  plan.layout = role_layout(c, section, f.actor);
  plan.dp = dp_of(plan.layout, f.actor);
  HF_CHECK((f.batch_prompts * n) % plan.dp == 0, "data.train_batch_size x rollout.n = ", f.batch_prompts * n,
           " samples must divide across the actor's ", plan.dp, " data-parallel groups (", f.actor.key, " = ",
           f.actor.processes, " / (tensor_model_parallel_size = ", plan.layout.tp,
           " x pipeline_model_parallel_size = ", plan.layout.pp, "))");
  ActorSpec& spec = plan.spec;
  spec.dtype = role_dtype(actor, section + ".dtype", "fp32");
  TrainSpec& t = spec.train;
  t.optim = optim_spec(actor, section, f.total_steps);
  const int sp = sequence_parallel_size(c, section, plan.layout, plan.dp);
  // verl's batch semantics (rl_batch_sizes.h); 8 samples per process per micro-batch when neither key is set.
  // A sequence-parallel group trains on its members' rows together: the batch splits over dp / sp groups.
  t.mini_batch_rows = mini_batch_rows_per_process(c, section + ".ppo_mini_batch_size", n, plan.dp / sp);
  t.micro_batch_rows = micro_batch_rows_per_process(c, section + ".ppo_micro_batch_size", plan.dp / sp, 8);
  *bsz = dynamic_bsz(c, section + ".use_dynamic_bsz", false, section + ".ppo_max_token_len_per_gpu", 0);
  // With use_dynamic_bsz the micro-batches are cut by tokens and their row count is not read (as in verl).
  if (!bsz->on)
    check_micro_divides_mini(t.mini_batch_rows, t.micro_batch_rows, section + ".ppo_mini_batch_size",
                             section + ".ppo_micro_batch_size(_per_gpu)");
  t.max_token_len = bsz->budget();
  t.seed = f.seed;
  train_settings(actor, section, "fsdp_config", &t);
  // The loss keys (algo/algo_config.h reads them, with their checks).
  for (const char* key : {"clip_ratio", "clip_ratio_low", "clip_ratio_high", "clip_ratio_c", "loss_agg_mode",
                          "loss_scale_factor", "policy_loss.loss_mode", "tau_pos", "tau_neg",
                          "policy_loss.clip_cov_ratio", "policy_loss.clip_cov_lb", "policy_loss.clip_cov_ub",
                          "policy_loss.kl_cov_ratio", "policy_loss.ppo_kl_coef", "use_kl_loss", "kl_loss_coef", "kl_loss_type",
                          "entropy_coeff"})
    actor.note(key);
  spec.policy_loss = algo::policy_loss_config(actor.config());
  spec.loss_terms = algo::actor_loss_terms(actor.config());
  spec.router_replay = actor.get<std::string>("router_replay.mode");
  parse_router_replay_policy(spec.router_replay, section + ".router_replay.mode");
  // The optimal token baseline needs each position's sum of p^2; verl asks for the key, here the estimator
  // turns it on too.
  spec.calculate_sum_pi_squared = actor.get<bool>("calculate_sum_pi_squared") ||
                                  f.adv_estimator == "optimal_token_baseline" ||
                                  f.adv_estimator == "tir_optimal_token_baseline";
  plan.model = model;
  plan.model.dtype = spec.dtype;
  plan.model.ulysses_sequence_parallel_size = sp;
  plan.model.expert_model_parallel_size = expert_parallel_size(c, section, plan.layout, plan.dp);
  plan.model.expert_key = section + ".megatron.expert_model_parallel_size";
  plan.model.use_remove_padding = remove_padding(c, "actor_rollout_ref.model", plan.layout);
  // Activation checkpointing is per role (verl's <role>.model.enable_gradient_checkpointing); it only acts
  // where a model trains.
  plan.model.enable_gradient_checkpointing = c.get<bool>("actor_rollout_ref.model.enable_gradient_checkpointing");
  lora_settings(c.subtree("actor_rollout_ref.model"), "actor_rollout_ref.model", &plan.model);
  return plan;
}

// Generation (actor_rollout_ref.rollout) in the actor's processes, and on a standalone pool when there is one.
RolloutSpec rollout_spec(const ConfigReader& c, const RoleFacts& f, const RolePlan<ActorSpec>& actor, int64_t n,
                         const DynamicBsz& actor_bsz, const RolloutSampling& sampling) {
  const std::string section = "actor_rollout_ref.rollout";
  const ConfigReader rollout = c.subtree(section);
  RolloutSpec spec;
  spec.n = n;
  spec.dtype = role_dtype(rollout, section + ".dtype", actor.spec.dtype);
  c.note("data.max_response_length");
  rollout.note("response_length");
  spec.response_length = rl_response_length(c.config());
  HF_CHECK(spec.response_length > 0, rollout.is_null("response_length") ? "data.max_response_length" : section + ".response_length",
           " must be > 0, got ", spec.response_length);
  spec.temperature = sampling.temperature;
  spec.top_k = sampling.top_k;
  spec.top_p = sampling.top_p;
  spec.seed = f.seed;
  spec.max_num_seqs = rollout.get<int64_t>("max_num_seqs");
  HF_CHECK(spec.max_num_seqs >= 0, section, ".max_num_seqs must be >= 0 (0 = every sequence at once), got ",
           spec.max_num_seqs);
  spec.admission_rows = rollout.get<int64_t>("admission_rows");
  HF_CHECK(spec.admission_rows >= -1, section, ".admission_rows must be >= -1 (-1 = a quarter of max_num_seqs, 0 = a "
           "prompt joins as soon as its samples fit), got ", spec.admission_rows);
  const std::string kv_cache = rollout.get<std::string>("kv_cache");
  HF_CHECK(kv_cache == "paged" || kv_cache == "slots", section, ".kv_cache must be paged or slots, got '", kv_cache,
           "'");
  spec.paged_kv_cache = kv_cache == "paged";
  spec.kv_block_size = rollout.get<int64_t>("kv_block_size");
  HF_CHECK(spec.kv_block_size >= 1, section, ".kv_block_size must be >= 1 (positions per block), got ",
           spec.kv_block_size);
  spec.enable_prefix_caching = rollout.get<bool>("enable_prefix_caching");
  spec.ignore_eos = rollout.get<bool>("ignore_eos");
  spec.max_num_batched_tokens = rollout.get<int64_t>("max_num_batched_tokens");
  HF_CHECK(spec.max_num_batched_tokens >= 1, section, ".max_num_batched_tokens must be >= 1 (positions one prefill ",
           "forward may hold), got ", spec.max_num_batched_tokens);
  spec.gpu_memory_utilization = rollout.get<double>("gpu_memory_utilization");
  HF_CHECK(spec.gpu_memory_utilization > 0 && spec.gpu_memory_utilization <= 1, section,
           ".gpu_memory_utilization must be in (0, 1] (the fraction of a GPU's memory the rollout may use), got ",
           spec.gpu_memory_utilization);
  spec.tensor_model_parallel_size = actor.layout.gen_tp;
  spec.pipeline_model_parallel_size = actor.layout.gen_pp;
  spec.reshard_mode = rollout.get<std::string>("reshard_mode");
  spec.expert_parallel_size = rollout.get<int>("expert_parallel_size");
  const int actor_ep = actor.model.expert_model_parallel_size;
  HF_CHECK(spec.expert_parallel_size == 1 || (spec.expert_parallel_size == actor_ep && !f.standalone_rollout), section,
           ".expert_parallel_size = ", spec.expert_parallel_size, " must be 1 (generation on the experts gathered from ",
           "the actor's group) or, colocated, actor_rollout_ref.actor.megatron.expert_model_parallel_size = ", actor_ep,
           " (generation with the experts where training keeps them)");
  // Experts folded over exactly the tensor-parallel ranks stay in place for generation whatever this size: those
  // ranks decode in step anyway (engine/expert_reshard.h), with none of in-place decoding's limits below; and
  // the 3D-HybridEngine folds them over another generation layout's tensor ranks (engine/hybrid_engine.h).
  const bool experts_follow_tp =
      expert_parallel_shape(actor_ep, actor.layout.tp, actor.dp, actor.model.expert_key).follows_tensor_parallel();
  if (experts_follow_tp) spec.expert_parallel_size = 1;
  const bool own_layout = actor.layout.gen_tp == actor.layout.tp && actor.layout.gen_pp == actor.layout.pp;
  // Another generation layout goes through the 3D-HybridEngine, which gathers split experts in their stage and
  // folds them over the generation's tensor ranks (engine/hybrid_engine.h): decoding with the experts where
  // training keeps them is for the actor's own layout only.
  HF_CHECK(actor_ep == 1 || f.standalone_rollout || own_layout || spec.expert_parallel_size == 1, section,
           ".expert_parallel_size = ", spec.expert_parallel_size, " decodes with the experts where training keeps ",
           "them, in the actor's own layout; with ", section, ".tensor_model_parallel_size = ", actor.layout.gen_tp,
           " and ", section, ".pipeline_model_parallel_size = ", actor.layout.gen_pp, " (the actor trains at ",
           actor.layout.tp, " and ", actor.layout.pp, ") leave it 1");
  HF_CHECK(actor_ep == 1 || f.standalone_rollout || own_layout || spec.reshard_mode == "hybridflow", section,
           ".reshard_mode = ", spec.reshard_mode, ": the actor's experts (actor_rollout_ref.actor.megatron.",
           "expert_model_parallel_size = ", actor_ep, ") switch to another generation layout in reshard mode ",
           "hybridflow only");
  HF_CHECK(spec.expert_parallel_size == 1 || actor.layout.pp == 1, section, ".expert_parallel_size = ",
           spec.expert_parallel_size, ": expert-parallel decoding runs unstaged, not in the actor's ",
           "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size = ", actor.layout.pp,
           " stages; leave it 1 to generate on the gathered experts");
  HF_CHECK(spec.expert_parallel_size == 1 || actor.layout.tp == 1, section, ".expert_parallel_size = ",
           spec.expert_parallel_size, ": expert-parallel decoding is not combined with tensor parallelism ",
           "(actor_rollout_ref.actor.megatron.tensor_model_parallel_size = ", actor.layout.tp,
           "); leave it 1 to generate on the gathered experts");
  spec.free_cache_engine = rollout.get<bool>("free_cache_engine");
  // Unset (null): the worker's device decides (graphs and chunked reads on a GPU, rollout_generation.h).
  if (!rollout.is_null("enforce_eager")) spec.cuda_graphs = !rollout.get<bool>("enforce_eager");
  if (!rollout.is_null("readback_interval")) {
    spec.readback_interval = rollout.get<int64_t>("readback_interval");
    HF_CHECK(*spec.readback_interval >= 1, section,
             ".readback_interval must be >= 1 (decode steps between two reads of the device), got ",
             *spec.readback_interval);
  }
  spec.batch_invariant = rollout.get<bool>("batch_invariant");
  // The fixed-order kernels attend over one whole sequence per row: packed rows and sequence slices
  // would be read as one sequence.
  HF_CHECK(!spec.batch_invariant ||
               (!actor.model.use_remove_padding && actor.model.ulysses_sequence_parallel_size <= 1),
           section, ".batch_invariant = true needs whole padded rows in the log-prob passes: ",
           "actor_rollout_ref.model.use_remove_padding must be false (got ", actor.model.use_remove_padding,
           ") and actor_rollout_ref.actor.ulysses_sequence_parallel_size 1 (got ",
           actor.model.ulysses_sequence_parallel_size, ")");
  // Old log-probs: 16 samples per process when unset; by tokens as the actor's switch says unless set.
  spec.log_prob.rows = micro_batch_rows_per_process(c, section + ".log_prob_micro_batch_size", actor.dp, 16);
  spec.log_prob.max_tokens = dynamic_bsz(c, section + ".log_prob_use_dynamic_bsz", actor_bsz.on,
                                         section + ".log_prob_max_token_len_per_gpu", actor_bsz.max_tokens)
                                 .budget();
  spec.update_weights_bucket_megabytes = rollout.get<int64_t>("update_weights_bucket_megabytes");
  spec.lora_merge = rollout.get<bool>("lora_merge");
  spec.record_routing = actor.spec.router_replay == "R3";
  HF_CHECK(!spec.record_routing || actor.layout.gen_pp == 1 || f.standalone_rollout,
           "actor_rollout_ref.actor.router_replay.mode = R3 records the rollout's routing, which generation in ",
           "pipeline stages does not do yet (", section, ".pipeline_model_parallel_size = ", actor.layout.gen_pp,
           "); generate unstaged (1) or use R2");
  spec.partial_rollout = rollout.get<bool>("partial_rollout");
  // Only a standalone pool's generations overlap a weight sync; its ranks of one replica would have to agree
  // on the token at which they switch, and adapters merged into the weights would have to come out first.
  HF_CHECK(!spec.partial_rollout || (f.standalone_rollout && actor.layout.gen_tp == 1 && !actor.model.uses_lora()),
           section, ".partial_rollout = true needs a standalone rollout (trainer.placement) of tensor-parallel size 1 ",
           "without LoRA adapters (got ", f.standalone_rollout ? "standalone" : "colocated", ", tensor-parallel size ",
           actor.layout.gen_tp, actor.model.uses_lora() ? ", LoRA" : "", ")");
  HF_CHECK(!spec.partial_rollout || !spec.record_routing, section, ".partial_rollout = true cannot record the ",
           "routing for router replay (actor_rollout_ref.actor.router_replay.mode R3): a prefix prefilled again with ",
           "new weights would be routed twice");
  // The 3D-HybridEngine's generation model (pipeline stages gathered) has no adapters of its own: it
  // generates on the actor's weights with the adapters merged in.
  HF_CHECK(spec.lora_merge || !actor.model.uses_lora() || f.standalone_rollout ||
               (actor.layout.gen_tp == actor.layout.tp && actor.layout.gen_pp == actor.layout.pp),
           section, ".lora_merge = false: generating with separate adapters needs generation in the training layout ",
           "(no switch through the 3D-HybridEngine: actor_rollout_ref.actor.megatron.pipeline_model_parallel_size = ",
           actor.layout.pp, ", ", section, ".pipeline_model_parallel_size = ", actor.layout.gen_pp, ")");
  spec.stream_groups = rollout.get<bool>("stream_groups");
  HF_CHECK(!spec.stream_groups || (f.standalone_rollout && f.rollout.processes == 1 && !spec.partial_rollout &&
                                   !spec.record_routing),
           section, ".stream_groups = true needs a standalone rollout (trainer.placement) of one process (", f.rollout.key,
           " = 1), without partial_rollout and without router replay R3 (got ",
           f.standalone_rollout ? "standalone, " + std::to_string(f.rollout.processes) + " process(es)" : "colocated",
           spec.partial_rollout ? ", partial_rollout" : "", spec.record_routing ? ", R3" : "", ")");
  spec.multi_turn = multi_turn_rollout_spec(rollout.subtree("multi_turn"), actor.model.path, spec.response_length,
                                            f.standalone_rollout ? 1 : actor.layout.gen_pp, actor.layout.gen_tp,
                                            f.prompts);
  const bool multi_turn = spec.multi_turn.is_object() && spec.multi_turn.value("enable", false);
  HF_CHECK(spec.expert_parallel_size == 1 || (!spec.record_routing && !multi_turn), section,
           ".expert_parallel_size = ", spec.expert_parallel_size, ": expert-parallel decoding runs single-turn ",
           "rollouts without recording the routing (got", multi_turn ? " multi_turn.enable = true" : "",
           spec.record_routing ? " actor_rollout_ref.actor.router_replay.mode = R3" : "",
           "); set it to 1 to generate on the experts gathered from the group");
  return spec;
}

// The reference policy (actor_rollout_ref.ref): it lives in the actor's processes, split like the actor.
// Checked whether or not it runs; returned when it does.
std::optional<RefSpec> ref_spec(const ConfigReader& c, const RoleFacts& f, const RolePlan<ActorSpec>& actor,
                                const RolloutSpec& rollout, const DynamicBsz& actor_bsz) {
  const std::string section = "actor_rollout_ref.ref";
  const ConfigReader ref = c.subtree(section);
  for (const auto& [key, actor_value] :
       {std::pair<std::string, int>{"tensor_model_parallel_size", actor.layout.tp},
        std::pair<std::string, int>{"pipeline_model_parallel_size", actor.layout.pp},
        std::pair<std::string, int>{"expert_model_parallel_size", actor.model.expert_model_parallel_size}}) {
    const std::string full = section + ".megatron." + key;
    HF_CHECK(ref.is_null("megatron." + key) || ref.get<int>("megatron." + key) == actor_value, full, " = ",
             ref.get<int>("megatron." + key), ": the reference model lives in the actor's processes and is split like ",
             "the actor (", actor_value, "); leave it null");
  }
  const int actor_sp = actor.model.ulysses_sequence_parallel_size;
  HF_CHECK(ref.is_null("ulysses_sequence_parallel_size") || ref.get<int>("ulysses_sequence_parallel_size") == actor_sp,
           section, ".ulysses_sequence_parallel_size = ", ref.get<int>("ulysses_sequence_parallel_size"),
           ": the reference model lives in the actor's processes and splits its sequences over the actor's groups (",
           "actor_rollout_ref.actor.ulysses_sequence_parallel_size = ", actor_sp, "); leave it null or set it equal");
  RefSpec spec;
  spec.dtype = role_dtype(ref, section + ".dtype", actor.spec.dtype);
  // The reference's log-prob pass defaults to the rollout's micro-batch and to the actor's token budget.
  spec.log_prob.rows = micro_batch_rows_per_process(c, section + ".log_prob_micro_batch_size", actor.dp, rollout.log_prob.rows);
  spec.log_prob.max_tokens = dynamic_bsz(c, section + ".log_prob_use_dynamic_bsz", actor_bsz.on,
                                         section + ".log_prob_max_token_len_per_gpu", actor_bsz.max_tokens)
                                 .budget();
  if (!actor.spec.loss_terms.use_kl_loss && !f.kl_in_reward) return std::nullopt;
  return spec;
}

// The critic's dynamic batch size for its update and its values pass (they inherit the actor's switch),
// read whether or not a critic runs: the reward model's values pass inherits them.
struct CriticBsz {
  DynamicBsz update, forward;
};
CriticBsz critic_bsz(const ConfigReader& c, const DynamicBsz& actor_bsz) {
  CriticBsz b;
  b.update = dynamic_bsz(c, "critic.use_dynamic_bsz", actor_bsz.on, "critic.ppo_max_token_len_per_gpu", 0);
  b.forward = dynamic_bsz(c, "critic.use_dynamic_bsz", actor_bsz.on, "critic.forward_max_token_len_per_gpu",
                          b.update.max_tokens);
  return b;
}

// The critic (critic): its layout over its pool, optimizer, batch split and value loss. The cost critic
// of Safe-RLHF takes the same settings on its own pool, with its own data order.
RolePlan<CriticSpec> critic_plan(const ConfigReader& c, const RoleFacts& f, const ModelSpec& model, int64_t n,
                                 const CriticBsz& bsz, const std::string& dtype) {
  const ConfigReader critic = c.subtree("critic");
  RolePlan<CriticSpec> plan;
  plan.layout = role_layout(c, "critic", f.critic);
  plan.dp = dp_of(plan.layout, f.critic);
  HF_CHECK((f.batch_prompts * n) % plan.dp == 0, "data.train_batch_size x rollout.n = ", f.batch_prompts * n,
           " samples must divide across the critic's ", plan.dp, " data-parallel groups");
  const int sp = sequence_parallel_size(c, "critic", plan.layout, plan.dp);
  const int ep = expert_parallel_size(c, "critic", plan.layout, plan.dp);
  if (f.need_cost_critic) {  // the cost critic's pool, checked alike
    const ParallelLayout cost = role_layout(c, "critic", f.cost_critic);
    const int cost_dp = dp_of(cost, f.cost_critic);
    sequence_parallel_size(c, "critic", cost, cost_dp);
    expert_parallel_size(c, "critic", cost, cost_dp);
  }
  plan.model = model;
  plan.model.ulysses_sequence_parallel_size = sp;
  plan.model.expert_model_parallel_size = ep;
  plan.model.expert_key = "critic.megatron.expert_model_parallel_size";
  plan.model.use_remove_padding = remove_padding(c, "critic.model", plan.layout);
  const std::string path = critic.get<std::string>("model_path");
  if (!path.empty()) plan.model.path = path;
  plan.model.dtype = dtype;
  plan.model.enable_gradient_checkpointing = critic.get<bool>("model.enable_gradient_checkpointing");
  lora_settings(critic.subtree("model"), "critic.model", &plan.model);
  CriticSpec& spec = plan.spec;
  TrainSpec& t = spec.train;
  t.optim = optim_spec(critic, "critic", f.total_steps);
  t.mini_batch_rows = mini_batch_rows_per_process(c, "critic.ppo_mini_batch_size", n, plan.dp / sp);
  t.micro_batch_rows = micro_batch_rows_per_process(c, "critic.ppo_micro_batch_size", plan.dp / sp, 8);
  if (!bsz.update.on)
    check_micro_divides_mini(t.mini_batch_rows, t.micro_batch_rows, "critic.ppo_mini_batch_size",
                             "critic.ppo_micro_batch_size(_per_gpu)");
  t.max_token_len = bsz.update.budget();
  t.seed = f.seed + 1;
  train_settings(critic, "critic", "model.fsdp_config", &t);
  spec.cliprange_value = critic.get<double>("cliprange_value");
  spec.loss_agg_mode = algo::parse_loss_agg_mode(critic.get<std::string>("loss_agg_mode"));
  // The values pass: verl's forward_micro_batch_size keys, defaulting to the training micro-batch.
  spec.values.rows = micro_batch_rows_per_process(c, "critic.forward_micro_batch_size", plan.dp, t.micro_batch_rows);
  spec.values.max_tokens = bsz.forward.budget();
  return plan;
}

// A scoring model (reward_model, cost_model): a value-head model from `section`.path on its own pool.
RolePlan<ScoringModelSpec> scoring_plan(const ConfigReader& c, const std::string& section, const RoleFacts::Pool& pool,
                                        const ModelSpec& model, const std::string& dtype, int64_t max_tokens) {
  RolePlan<ScoringModelSpec> plan;
  plan.layout = role_layout(c, section, pool);
  plan.dp = dp_of(plan.layout, pool);
  plan.model = model;
  plan.model.path = c.get<std::string>(section + ".path");
  plan.model.dtype = dtype;
  plan.spec.forward.rows = micro_batch_rows_per_process(c, section + ".micro_batch_size", plan.dp, 16);
  plan.spec.forward.max_tokens = max_tokens;
  return plan;
}

}  // namespace

ModelSpec model_spec_from_config(const ConfigReader& c) {
  ModelSpec spec;
  spec.path = c.get<std::string>("model.path");
  spec.preset = c.get<std::string>("model.preset");
  spec.init_seed = static_cast<uint64_t>(c.get<int64_t>("model.init_seed"));
  spec.hidden_size = c.get<int64_t>("model.hidden_size");
  spec.num_hidden_layers = c.get<int64_t>("model.num_hidden_layers");
  spec.intermediate_size = c.get<int64_t>("model.intermediate_size");
  spec.num_attention_heads = c.get<int64_t>("model.num_attention_heads");
  spec.num_key_value_heads = c.get<int64_t>("model.num_key_value_heads");
  return spec;
}

RoleSpecs build_role_specs(const Config& config, const RoleFacts& f, const ModelSpec& base_model,
                           RoleSpecKeys* keys) {
  auto reader = [&](const std::string& spec) { return ConfigReader(config, keys ? &(*keys)[spec] : nullptr); };
  const ConfigReader rollout_keys = reader("rollout");
  const ConfigReader actor_keys = reader("actor");
  const ConfigReader ref_keys = reader("ref");
  const ConfigReader critic_keys = reader("critic");
  const ConfigReader rm_keys = reader("reward_model");
  const ConfigReader cm_keys = reader("cost_model");
  RoleSpecs specs;

  const ConfigReader sampling_keys = rollout_keys.subtree("actor_rollout_ref.rollout");
  for (const char* key : {"temperature", "top_k", "top_p"}) sampling_keys.note(key);
  specs.sampling =
      resolve_rollout_sampling(sampling_keys.config(), base_model.path, base_model.eos_token_id.value_or(-1));
  if (specs.sampling.source != "config")
    log_info("rollout sampling from ", specs.sampling.source, ": temperature ", specs.sampling.temperature, ", top_k ",
             specs.sampling.top_k, ", top_p ", specs.sampling.top_p);
  ModelSpec model = base_model;
  model.eos_token_ids = specs.sampling.eos_token_ids;

  const int64_t n = samples_per_prompt(rollout_keys, f);
  DynamicBsz actor_bsz;
  specs.actor = actor_plan(actor_keys, f, model, n, &actor_bsz);
  generation_layout(sampling_keys, f, &specs.actor.layout);
  // Each generation replica is gen_pp stages of gen_tp ranks.
  const ParallelLayout& actor_layout = specs.actor.layout;
  const int gen_replicas = f.actor.processes / (actor_layout.gen_tp * actor_layout.gen_pp);
  HF_CHECK(f.standalone_rollout || f.batch_prompts % gen_replicas == 0, "data.train_batch_size = ", f.batch_prompts,
           " prompts must divide across the actor's ", gen_replicas, " generation replicas (", f.actor.key, " = ",
           f.actor.processes, " / (rollout.tensor_model_parallel_size = ", actor_layout.gen_tp,
           " x rollout.pipeline_model_parallel_size = ", actor_layout.gen_pp, "))");
  specs.rollout = rollout_spec(rollout_keys, f, specs.actor, n, actor_bsz, specs.sampling);
  specs.response_length_key = config.is_null("actor_rollout_ref.rollout.response_length")
                                  ? "data.max_response_length"
                                  : "actor_rollout_ref.rollout.response_length";
  if (f.standalone_rollout) {  // generation on its own pool, from a shadow copy of the actor's weights
    RolePlan<RolloutSpec> standalone;
    standalone.layout = standalone_rollout_layout(sampling_keys, f);
    standalone.dp = f.rollout.processes / standalone.layout.tp;
    standalone.spec = specs.rollout;
    standalone.spec.tensor_model_parallel_size = standalone.layout.tp;
    standalone.spec.pipeline_model_parallel_size = 1;
    // The actor's adapters too (the base weights never change, so only adapters travel at each sync).
    standalone.model = specs.actor.model;
    standalone.model.enable_gradient_checkpointing = false;
    standalone.model.dtype = specs.rollout.dtype;
    check_lora_unsplit(standalone.model, "actor_rollout_ref.rollout.tensor_model_parallel_size", standalone.layout.tp,
                       "adapters split over a standalone rollout pool");
    specs.standalone_rollout = standalone;
    // The actor's processes never generate: they keep their training layout and dtype.
    specs.rollout.dtype = specs.actor.spec.dtype;
  }
  specs.ref = ref_spec(ref_keys, f, specs.actor, specs.rollout, actor_bsz);

  // Every role's dtype is checked, whether or not the role runs: a typo fails before any process starts.
  const std::string critic_dtype = role_dtype(critic_keys.subtree("critic"), "critic.dtype", "fp32");
  const std::string rm_dtype = role_dtype(rm_keys.subtree("reward_model"), "reward_model.dtype", "fp32");
  const std::string cm_dtype = role_dtype(cm_keys.subtree("cost_model"), "cost_model.dtype", "fp32");
  const CriticBsz critic_batches = critic_bsz(critic_keys, actor_bsz);
  if (f.need_critic) {
    specs.critic = critic_plan(critic_keys, f, model, n, critic_batches, critic_dtype);
    if (f.need_cost_critic) {
      specs.cost_critic = specs.critic;
      specs.cost_critic->spec.train.seed = f.seed + 2;
      specs.cost_critic->dp = dp_of(specs.critic->layout, f.cost_critic);
    }
  }
  // The reward model's values pass inherits the critic's dynamic batch size; the cost model takes the
  // reward model's.
  const DynamicBsz rm_bsz = dynamic_bsz(rm_keys, "reward_model.use_dynamic_bsz", critic_batches.update.on,
                                        "reward_model.forward_max_token_len_per_gpu", critic_batches.forward.max_tokens);
  if (f.need_reward_model)
    specs.reward_model = scoring_plan(rm_keys, "reward_model", f.reward_model, model, rm_dtype, rm_bsz.budget());
  if (f.need_cost_model)
    specs.cost_model = scoring_plan(cm_keys, "cost_model", f.cost_model, model, cm_dtype, rm_bsz.budget());
  return specs;
}

}  // namespace hybridflow
