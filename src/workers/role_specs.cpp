#include "hybridflow/workers/role_specs.h"

#include "hybridflow/algo/kl.h"
#include "hybridflow/core/error.h"
#include "hybridflow/workers/router_replay.h"

namespace hybridflow {
namespace {

// Sets `field` from j[key] when present and not null; a value of another type fails naming spec and key.
template <typename T>
void take_spec_field(const nlohmann::json& j, const char* spec, const char* key, T& field) {
  if (!j.is_object()) HF_FAIL(spec, " spec: expected a JSON object, got ", j.dump());
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  try {
    field = it->get<T>();
  } catch (const nlohmann::json::exception& e) {
    HF_FAIL(spec, " spec: field '", key, "' has the wrong type (", e.what(), "): ", it->dump());
  }
}

template <typename T>
void take_spec_field(const nlohmann::json& j, const char* spec, const char* key, std::optional<T>& field) {
  if (j.contains(key) && !j.at(key).is_null()) {
    T value{};
    take_spec_field(j, spec, key, value);
    field = value;
  }
}

template <typename T>
nlohmann::json optional_json(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json();
}

}  // namespace

void to_json(nlohmann::json& j, const ModelSpec& s) {
  j = {{"path", s.path},
       {"preset", s.preset},
       {"vocab_size", s.vocab_size},
       {"hidden_size", s.hidden_size},
       {"num_hidden_layers", s.num_hidden_layers},
       {"intermediate_size", s.intermediate_size},
       {"num_attention_heads", s.num_attention_heads},
       {"num_key_value_heads", s.num_key_value_heads},
       {"init_seed", s.init_seed},
       {"eos_token_id", optional_json(s.eos_token_id)},
       {"pad_token_id", optional_json(s.pad_token_id)},
       {"eos_token_ids", optional_json(s.eos_token_ids)},
       {"device", s.device},
       {"dtype", s.dtype},
       {"enable_gradient_checkpointing", s.enable_gradient_checkpointing},
       {"ulysses_sequence_parallel_size", s.ulysses_sequence_parallel_size},
       {"expert_model_parallel_size", s.expert_model_parallel_size},
       {"expert_key", s.expert_key},
       {"use_remove_padding", s.use_remove_padding},
       {"lora_rank", s.lora.rank},
       {"lora_alpha", s.lora.alpha},
       {"target_modules", s.lora.target_modules},
       {"exclude_modules", s.lora.exclude_modules},
       {"target_regex", s.lora.target_regex},
       {"exclude_regex", s.lora.exclude_regex},
       {"lora_adapter_path", s.lora_adapter_path},
       {"lora_key", s.lora_key}};
}

void from_json(const nlohmann::json& j, ModelSpec& s) {
  constexpr const char* k = "model";
  take_spec_field(j, k, "path", s.path);
  take_spec_field(j, k, "preset", s.preset);
  take_spec_field(j, k, "vocab_size", s.vocab_size);
  take_spec_field(j, k, "hidden_size", s.hidden_size);
  take_spec_field(j, k, "num_hidden_layers", s.num_hidden_layers);
  take_spec_field(j, k, "intermediate_size", s.intermediate_size);
  take_spec_field(j, k, "num_attention_heads", s.num_attention_heads);
  take_spec_field(j, k, "num_key_value_heads", s.num_key_value_heads);
  take_spec_field(j, k, "init_seed", s.init_seed);
  take_spec_field(j, k, "eos_token_id", s.eos_token_id);
  take_spec_field(j, k, "pad_token_id", s.pad_token_id);
  take_spec_field(j, k, "eos_token_ids", s.eos_token_ids);
  take_spec_field(j, k, "device", s.device);
  take_spec_field(j, k, "dtype", s.dtype);
  take_spec_field(j, k, "enable_gradient_checkpointing", s.enable_gradient_checkpointing);
  take_spec_field(j, k, "ulysses_sequence_parallel_size", s.ulysses_sequence_parallel_size);
  take_spec_field(j, k, "expert_model_parallel_size", s.expert_model_parallel_size);
  take_spec_field(j, k, "expert_key", s.expert_key);
  take_spec_field(j, k, "use_remove_padding", s.use_remove_padding);
  take_spec_field(j, k, "lora_rank", s.lora.rank);
  take_spec_field(j, k, "lora_alpha", s.lora.alpha);
  take_spec_field(j, k, "target_modules", s.lora.target_modules);
  take_spec_field(j, k, "exclude_modules", s.lora.exclude_modules);
  take_spec_field(j, k, "target_regex", s.lora.target_regex);
  take_spec_field(j, k, "exclude_regex", s.lora.exclude_regex);
  take_spec_field(j, k, "lora_adapter_path", s.lora_adapter_path);
  take_spec_field(j, k, "lora_key", s.lora_key);
}

void to_json(nlohmann::json& j, const RolloutSpec& s) {
  j = {{"dtype", s.dtype},
       {"n", s.n},
       {"response_length", s.response_length},
       {"temperature", s.temperature},
       {"top_k", s.top_k},
       {"top_p", s.top_p},
       {"seed", s.seed},
       {"max_num_seqs", s.max_num_seqs},
       {"admission_rows", s.admission_rows},
       {"paged_kv_cache", s.paged_kv_cache},
       {"kv_block_size", s.kv_block_size},
       {"enable_prefix_caching", s.enable_prefix_caching},
       {"ignore_eos", s.ignore_eos},
       {"max_num_batched_tokens", s.max_num_batched_tokens},
       {"gpu_memory_utilization", s.gpu_memory_utilization},
       {"tensor_model_parallel_size", s.tensor_model_parallel_size},
       {"pipeline_model_parallel_size", s.pipeline_model_parallel_size},
       {"expert_parallel_size", s.expert_parallel_size},
       {"reshard_mode", s.reshard_mode},
       {"free_cache_engine", s.free_cache_engine},
       {"cuda_graphs", optional_json(s.cuda_graphs)},
       {"readback_interval", optional_json(s.readback_interval)},
       {"batch_invariant", s.batch_invariant},
       {"log_prob_micro_batch_size", s.log_prob.rows},
       {"log_prob_max_token_len", s.log_prob.max_tokens},
       {"update_weights_bucket_megabytes", s.update_weights_bucket_megabytes},
       {"lora_merge", s.lora_merge},
       {"partial_rollout", s.partial_rollout},
       {"stream_groups", s.stream_groups},
       {"multi_turn", s.multi_turn},
       {"record_routing", s.record_routing}};
}

void from_json(const nlohmann::json& j, RolloutSpec& s) {
  constexpr const char* k = "rollout";
  take_spec_field(j, k, "dtype", s.dtype);
  take_spec_field(j, k, "n", s.n);
  take_spec_field(j, k, "response_length", s.response_length);
  take_spec_field(j, k, "temperature", s.temperature);
  take_spec_field(j, k, "top_k", s.top_k);
  take_spec_field(j, k, "top_p", s.top_p);
  take_spec_field(j, k, "seed", s.seed);
  take_spec_field(j, k, "max_num_seqs", s.max_num_seqs);
  take_spec_field(j, k, "admission_rows", s.admission_rows);
  take_spec_field(j, k, "paged_kv_cache", s.paged_kv_cache);
  take_spec_field(j, k, "kv_block_size", s.kv_block_size);
  take_spec_field(j, k, "enable_prefix_caching", s.enable_prefix_caching);
  take_spec_field(j, k, "ignore_eos", s.ignore_eos);
  take_spec_field(j, k, "max_num_batched_tokens", s.max_num_batched_tokens);
  take_spec_field(j, k, "gpu_memory_utilization", s.gpu_memory_utilization);
  take_spec_field(j, k, "tensor_model_parallel_size", s.tensor_model_parallel_size);
  take_spec_field(j, k, "pipeline_model_parallel_size", s.pipeline_model_parallel_size);
  take_spec_field(j, k, "expert_parallel_size", s.expert_parallel_size);
  take_spec_field(j, k, "reshard_mode", s.reshard_mode);
  take_spec_field(j, k, "free_cache_engine", s.free_cache_engine);
  take_spec_field(j, k, "cuda_graphs", s.cuda_graphs);
  take_spec_field(j, k, "readback_interval", s.readback_interval);
  take_spec_field(j, k, "batch_invariant", s.batch_invariant);
  take_spec_field(j, k, "log_prob_micro_batch_size", s.log_prob.rows);
  take_spec_field(j, k, "log_prob_max_token_len", s.log_prob.max_tokens);
  take_spec_field(j, k, "update_weights_bucket_megabytes", s.update_weights_bucket_megabytes);
  take_spec_field(j, k, "lora_merge", s.lora_merge);
  take_spec_field(j, k, "partial_rollout", s.partial_rollout);
  take_spec_field(j, k, "stream_groups", s.stream_groups);
  if (j.contains("multi_turn")) s.multi_turn = j.at("multi_turn");
  take_spec_field(j, k, "record_routing", s.record_routing);
}

void to_json(nlohmann::json& j, const TrainSpec& s) {
  j = {{"lr", s.optim.schedule.lr},
       {"warmup_steps", s.optim.schedule.warmup_steps},
       {"warmup_from_zero", s.optim.schedule.warmup_from_zero},
       {"lr_schedule", s.optim.schedule.kind},
       {"min_lr_ratio", s.optim.schedule.min_lr_ratio},
       {"num_cycles", s.optim.schedule.num_cycles},
       {"total_steps", s.optim.schedule.total_steps},
       {"weight_decay", s.optim.weight_decay},
       {"beta1", s.optim.beta1},
       {"beta2", s.optim.beta2},
       {"eps", s.optim.eps},
       {"grad_clip", s.optim.grad_clip},
       {"mini_batch_rows", s.mini_batch_rows},
       {"micro_batch_rows", s.micro_batch_rows},
       {"max_token_len", s.max_token_len},
       {"epochs", s.epochs},
       {"shuffle", s.shuffle},
       {"seed", s.seed},
       {"use_distributed_optimizer", s.use_distributed_optimizer},
       {"offload", {{"param_offload", s.param_offload}, {"optimizer_offload", s.optimizer_offload}}}};
}

void from_json(const nlohmann::json& j, TrainSpec& s) {
  constexpr const char* k = "train";
  take_spec_field(j, k, "lr", s.optim.schedule.lr);
  take_spec_field(j, k, "warmup_steps", s.optim.schedule.warmup_steps);
  take_spec_field(j, k, "warmup_from_zero", s.optim.schedule.warmup_from_zero);
  take_spec_field(j, k, "lr_schedule", s.optim.schedule.kind);
  take_spec_field(j, k, "min_lr_ratio", s.optim.schedule.min_lr_ratio);
  take_spec_field(j, k, "num_cycles", s.optim.schedule.num_cycles);
  take_spec_field(j, k, "total_steps", s.optim.schedule.total_steps);
  take_spec_field(j, k, "weight_decay", s.optim.weight_decay);
  take_spec_field(j, k, "beta1", s.optim.beta1);
  take_spec_field(j, k, "beta2", s.optim.beta2);
  take_spec_field(j, k, "eps", s.optim.eps);
  take_spec_field(j, k, "grad_clip", s.optim.grad_clip);
  take_spec_field(j, k, "mini_batch_rows", s.mini_batch_rows);
  take_spec_field(j, k, "micro_batch_rows", s.micro_batch_rows);
  take_spec_field(j, k, "max_token_len", s.max_token_len);
  take_spec_field(j, k, "epochs", s.epochs);
  take_spec_field(j, k, "shuffle", s.shuffle);
  take_spec_field(j, k, "seed", s.seed);
  take_spec_field(j, k, "use_distributed_optimizer", s.use_distributed_optimizer);
  if (j.contains("offload")) {
    take_spec_field(j.at("offload"), "offload", "param_offload", s.param_offload);
    take_spec_field(j.at("offload"), "offload", "optimizer_offload", s.optimizer_offload);
  }
}

void to_json(nlohmann::json& j, const ActorSpec& s) {
  j = s.train;  // the training fields and the loss's side by side in one object
  const algo::PolicyLossConfig& p = s.policy_loss;
  j.update({{"dtype", s.dtype},
            {"clip_ratio", p.clip_ratio},
            {"clip_ratio_low", optional_json(p.clip_ratio_low)},
            {"clip_ratio_high", optional_json(p.clip_ratio_high)},
            {"clip_ratio_c", p.clip_ratio_c},
            {"loss_agg_mode", algo::to_string(p.agg_mode)},
            {"loss_scale_factor", optional_json(p.loss_scale_factor)},
            {"tau_pos", p.tau_pos},
            {"tau_neg", p.tau_neg},
            {"policy_loss",
             {{"loss_mode", algo::to_string(p.loss_mode)},
              {"clip_cov_ratio", p.clip_cov_ratio},
              {"clip_cov_lb", p.clip_cov_lb},
              {"clip_cov_ub", p.clip_cov_ub},
              {"kl_cov_ratio", p.kl_cov_ratio},
              {"ppo_kl_coef", p.ppo_kl_coef}}},
            {"entropy_coeff", s.loss_terms.entropy_coeff},
            {"use_kl_loss", s.loss_terms.use_kl_loss},
            {"kl_loss_coef", s.loss_terms.kl_loss_coef},
            {"kl_loss_type", algo::to_string(s.loss_terms.kl_loss_type)},
            {"router_replay", s.router_replay},
            {"calculate_sum_pi_squared", s.calculate_sum_pi_squared}});
}

void from_json(const nlohmann::json& j, ActorSpec& s) {
  constexpr const char* k = "actor";
  take_spec_field(j, k, "dtype", s.dtype);
  from_json(j, s.train);
  algo::PolicyLossConfig& p = s.policy_loss;
  take_spec_field(j, k, "clip_ratio", p.clip_ratio);
  take_spec_field(j, k, "clip_ratio_low", p.clip_ratio_low);
  take_spec_field(j, k, "clip_ratio_high", p.clip_ratio_high);
  take_spec_field(j, k, "clip_ratio_c", p.clip_ratio_c);
  std::string agg = algo::to_string(p.agg_mode);
  take_spec_field(j, k, "loss_agg_mode", agg);
  p.agg_mode = algo::parse_loss_agg_mode(agg);
  take_spec_field(j, k, "loss_scale_factor", p.loss_scale_factor);
  HF_CHECK(!p.loss_scale_factor || *p.loss_scale_factor > 0, "actor spec: loss_scale_factor must be > 0 or null, got ",
           *p.loss_scale_factor);
  take_spec_field(j, k, "tau_pos", p.tau_pos);
  take_spec_field(j, k, "tau_neg", p.tau_neg);
  if (j.contains("policy_loss")) {
    const nlohmann::json& pl = j.at("policy_loss");
    constexpr const char* kp = "actor.policy_loss";
    std::string mode = algo::to_string(p.loss_mode);
    take_spec_field(pl, kp, "loss_mode", mode);
    p.loss_mode = algo::parse_policy_loss_mode(mode);
    take_spec_field(pl, kp, "clip_cov_ratio", p.clip_cov_ratio);
    take_spec_field(pl, kp, "clip_cov_lb", p.clip_cov_lb);
    take_spec_field(pl, kp, "clip_cov_ub", p.clip_cov_ub);
    take_spec_field(pl, kp, "kl_cov_ratio", p.kl_cov_ratio);
    take_spec_field(pl, kp, "ppo_kl_coef", p.ppo_kl_coef);
  }
  algo::check_policy_loss_config(p);
  take_spec_field(j, k, "entropy_coeff", s.loss_terms.entropy_coeff);
  take_spec_field(j, k, "use_kl_loss", s.loss_terms.use_kl_loss);
  take_spec_field(j, k, "kl_loss_coef", s.loss_terms.kl_loss_coef);
  std::string kl = algo::to_string(s.loss_terms.kl_loss_type);
  take_spec_field(j, k, "kl_loss_type", kl);
  s.loss_terms.kl_loss_type = algo::parse_kl_type(kl);
  take_spec_field(j, k, "router_replay", s.router_replay);
  parse_router_replay_policy(s.router_replay, "actor spec: router_replay");
  take_spec_field(j, k, "calculate_sum_pi_squared", s.calculate_sum_pi_squared);
}

void to_json(nlohmann::json& j, const RefSpec& s) {
  j = {{"dtype", s.dtype}, {"log_prob_micro_batch_size", s.log_prob.rows}, {"log_prob_max_token_len", s.log_prob.max_tokens}};
}

void from_json(const nlohmann::json& j, RefSpec& s) {
  constexpr const char* k = "ref";
  take_spec_field(j, k, "dtype", s.dtype);
  take_spec_field(j, k, "log_prob_micro_batch_size", s.log_prob.rows);
  take_spec_field(j, k, "log_prob_max_token_len", s.log_prob.max_tokens);
}

void to_json(nlohmann::json& j, const CriticSpec& s) {
  j = s.train;
  j.update({{"cliprange_value", s.cliprange_value},
            {"loss_agg_mode", algo::to_string(s.loss_agg_mode)},
            {"forward_micro_batch_size", s.values.rows},
            {"forward_max_token_len", s.values.max_tokens}});
}

void from_json(const nlohmann::json& j, CriticSpec& s) {
  constexpr const char* k = "critic";
  from_json(j, s.train);
  take_spec_field(j, k, "cliprange_value", s.cliprange_value);
  std::string agg = algo::to_string(s.loss_agg_mode);
  take_spec_field(j, k, "loss_agg_mode", agg);
  s.loss_agg_mode = algo::parse_loss_agg_mode(agg);
  take_spec_field(j, k, "forward_micro_batch_size", s.values.rows);
  take_spec_field(j, k, "forward_max_token_len", s.values.max_tokens);
}

void to_json(nlohmann::json& j, const ScoringModelSpec& s) {
  j = {{"micro_batch_size", s.forward.rows}, {"max_token_len", s.forward.max_tokens}};
}

void from_json(const nlohmann::json& j, ScoringModelSpec& s) {
  constexpr const char* k = "scoring model";
  take_spec_field(j, k, "micro_batch_size", s.forward.rows);
  take_spec_field(j, k, "max_token_len", s.forward.max_tokens);
}

}  // namespace hybridflow
