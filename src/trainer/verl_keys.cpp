// The data behind verl_key_compat(): verl's keys (as of verl's ppo_trainer.yaml, January 2026) that the
// RL schema does not have under the same path. Keep docs/configuration.md's "verl configs" table in step.
#include "hybridflow/trainer/verl_keys.h"

#include <iterator>

namespace hybridflow {

namespace {

constexpr const char* kExpertsWhole =
    "experts are never split by tensor parallelism; an expert_model_parallel_size that is a multiple of "
    "tensor_model_parallel_size folds the tensor-parallel ranks in, as Megatron does with 1";

// verl key -> hybridflow key. Used only while the schema lacks the verl key, so when hybridflow gains
// verl's own key that key wins and its alias falls silent.
const std::pair<const char*, const char*> kAliases[] = {
    {"actor_rollout_ref.model.path", "model.path"},
    {"critic.model.path", "critic.model_path"},
    {"reward_model.model.path", "reward_model.path"},
    {"data.train_files", "data.train_file"},  // one file or a list
    {"data.val_files", "data.test_file"},
    {"trainer.total_training_steps", "trainer.total_steps"},
    {"trainer.default_local_dir", "trainer.run_dir"},  // checkpoints go to <run_dir>/checkpoints
    {"trainer.max_actor_ckpt_to_keep", "trainer.max_ckpt_to_keep"},
    {"actor_rollout_ref.actor.grad_clip", "actor_rollout_ref.actor.optim.grad_clip"},
    {"actor_rollout_ref.actor.optim.clip_grad", "actor_rollout_ref.actor.optim.grad_clip"},
    {"critic.grad_clip", "critic.optim.grad_clip"},
    {"critic.optim.clip_grad", "critic.optim.grad_clip"},
    {"async_training.trigger_parameter_sync_step", "actor_rollout_ref.rollout.trigger_parameter_sync_step"},
    {"async_training.partial_rollout", "actor_rollout_ref.rollout.partial_rollout"},
    // ppo_megatron_trainer.yaml: the Megatron engine's offloading is the FSDP one's here, and Megatron's
    // optimizer names its schedule lr_decay_style.
    {"actor_rollout_ref.actor.megatron.param_offload", "actor_rollout_ref.actor.fsdp_config.param_offload"},
    {"actor_rollout_ref.actor.megatron.optimizer_offload", "actor_rollout_ref.actor.fsdp_config.optimizer_offload"},
    {"critic.megatron.param_offload", "critic.model.fsdp_config.param_offload"},
    {"critic.megatron.optimizer_offload", "critic.model.fsdp_config.optimizer_offload"},
    {"actor_rollout_ref.actor.optim.lr_decay_style", "actor_rollout_ref.actor.optim.lr_scheduler_type"},
    {"critic.optim.lr_decay_style", "critic.optim.lr_scheduler_type"},
    // Megatron's context parallelism splits each sequence over that many ranks; hybridflow's Ulysses groups do
    // the same job (with the same data-parallel size), all-to-alls around attention instead of a ring.
    {"actor_rollout_ref.actor.megatron.context_parallel_size",
     "actor_rollout_ref.actor.ulysses_sequence_parallel_size"},
    {"actor_rollout_ref.ref.megatron.context_parallel_size", "actor_rollout_ref.ref.ulysses_sequence_parallel_size"},
    {"critic.megatron.context_parallel_size", "critic.ulysses_sequence_parallel_size"},
    // ppo_megatron_trainer.yaml's LoRA block.
    {"actor_rollout_ref.model.lora.rank", "actor_rollout_ref.model.lora_rank"},
    {"actor_rollout_ref.model.lora.alpha", "actor_rollout_ref.model.lora_alpha"},
    {"critic.model.lora.rank", "critic.model.lora_rank"},
    {"critic.model.lora.alpha", "critic.model.lora_alpha"},
    // DAPO's reward manager takes the overlong buffer through reward_model.reward_kwargs.
    {"reward_model.reward_kwargs.overlong_buffer_cfg.enable", "reward_model.overlong_buffer.enable"},
    {"reward_model.reward_kwargs.overlong_buffer_cfg.len", "reward_model.overlong_buffer.len"},
    {"reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor", "reward_model.overlong_buffer.penalty_factor"},
    {"reward_model.reward_kwargs.overlong_buffer_cfg.log", "reward_model.overlong_buffer.log"},
    {"reward_model.reward_kwargs.max_resp_len", "reward_model.overlong_buffer.max_resp_len"},
};

constexpr const char* kEngine = "hybridflow's own C++ engine runs the model";
constexpr const char* kRollout = "hybridflow's own engine generates; there is no vLLM / SGLang server";
constexpr const char* kPython = "only verl's Python stack (FSDP, vLLM, Ray, torch.compile, ...) reads it";
constexpr const char* kProfilerTool =
    "hybridflow profiles with libtorch's profiler only: global_profiler.tool torch or torch_memory";
constexpr const char* kProfilerPath = "every role's traces go under global_profiler.save_path";
constexpr const char* kNotYet = "not supported by hybridflow: only verl's default is accepted";
constexpr const char* kMegatron = "a setting of Megatron-LM, which hybridflow's own engine does not run";

// Accepted and dropped. `accepted` lists the values that keep verl's meaning here: verl's default where
// the feature is missing in hybridflow, so a config that relies on it fails instead of training otherwise.
struct IgnoredKey {
  const char* key;
  const char* accepted;
  const char* note;
};
const IgnoredKey kIgnored[] = {
    // Which engine runs each role: hybridflow has one.
    {"actor_rollout_ref.actor.strategy", "fsdp|fsdp2|megatron", kEngine},
    {"actor_rollout_ref.ref.strategy", "fsdp|fsdp2|megatron", kEngine},
    {"critic.strategy", "fsdp|fsdp2|megatron", kEngine},
    {"reward_model.strategy", "fsdp|fsdp2|megatron", kEngine},
    {"actor_rollout_ref.rollout.name", "hf|vllm|sglang|trtllm", kRollout},
    {"actor_rollout_ref.rollout.mode", "sync|async", kRollout},
    {"reward_model.rollout", "", kRollout},
    {"actor_rollout_ref.hybrid_engine", "true",
     "the actor generates in its own processes unless trainer.placement / pools: place a standalone rollout"},
    // FSDP / Megatron / kernel settings of verl's Python workers.
    {"actor_rollout_ref.actor.fsdp_config", "", kPython},
    {"actor_rollout_ref.ref.fsdp_config", "", kPython},
    {"critic.model.fsdp_config", "", kPython},
    {"reward_model.model.fsdp_config", "", kPython},
    {"actor_rollout_ref.actor.checkpoint", "", kPython},
    {"critic.checkpoint", "", kPython},
    // The profiler: global_profiler.tool (torch) and .save_path decide for every role; the other tools' options.
    {"actor_rollout_ref.actor.profiler.tool", "torch|torch_memory", kProfilerTool},
    {"actor_rollout_ref.actor.profiler.save_path", "", kProfilerPath},
    {"actor_rollout_ref.actor.profiler.tool_config.nsys", "", kProfilerTool},
    {"actor_rollout_ref.actor.profiler.tool_config.npu", "", kProfilerTool},
    {"actor_rollout_ref.actor.profiler.tool_config.torch_memory", "", kProfilerTool},
    {"actor_rollout_ref.ref.profiler.tool", "torch|torch_memory", kProfilerTool},
    {"actor_rollout_ref.ref.profiler.save_path", "", kProfilerPath},
    {"actor_rollout_ref.ref.profiler.tool_config.nsys", "", kProfilerTool},
    {"actor_rollout_ref.ref.profiler.tool_config.npu", "", kProfilerTool},
    {"actor_rollout_ref.ref.profiler.tool_config.torch_memory", "", kProfilerTool},
    {"actor_rollout_ref.rollout.profiler.tool", "torch|torch_memory", kProfilerTool},
    {"actor_rollout_ref.rollout.profiler.save_path", "", kProfilerPath},
    {"actor_rollout_ref.rollout.profiler.tool_config.nsys", "", kProfilerTool},
    {"actor_rollout_ref.rollout.profiler.tool_config.npu", "", kProfilerTool},
    {"actor_rollout_ref.rollout.profiler.tool_config.torch_memory", "", kProfilerTool},
    {"critic.profiler.tool", "torch|torch_memory", kProfilerTool},
    {"critic.profiler.save_path", "", kProfilerPath},
    {"critic.profiler.tool_config.nsys", "", kProfilerTool},
    {"critic.profiler.tool_config.npu", "", kProfilerTool},
    {"critic.profiler.tool_config.torch_memory", "", kProfilerTool},
    {"reward_model.profiler.tool", "torch|torch_memory", kProfilerTool},
    {"reward_model.profiler.save_path", "", kProfilerPath},
    {"reward_model.profiler.tool_config.nsys", "", kProfilerTool},
    {"reward_model.profiler.tool_config.npu", "", kProfilerTool},
    {"reward_model.profiler.tool_config.torch_memory", "", kProfilerTool},
    {"global_profiler.global_tool_config", "", kProfilerTool},
    {"global_profiler.profile_continuous_steps", "", "hybridflow writes a trace per worker call of a profiled step"},
    {"actor_rollout_ref.actor.router_replay.record_file", "null", "the routing travels in the batch, not in files"},
    {"actor_rollout_ref.actor.router_replay.replay_file", "null", "the routing travels in the batch, not in files"},
    {"actor_rollout_ref.ref.router_replay", "", kPython},
    {"actor_rollout_ref.actor.use_torch_compile", "", kPython},
    {"actor_rollout_ref.ref.use_torch_compile", "", kPython},
    {"actor_rollout_ref.actor.use_fused_kernels", "", kPython},
    {"actor_rollout_ref.actor.use_remove_padding", "", kPython},
    {"reward_model.ulysses_sequence_parallel_size", "", kPython},
    {"actor_rollout_ref.actor.entropy_from_logits_with_chunking", "", kPython},
    {"actor_rollout_ref.ref.entropy_from_logits_with_chunking", "", kPython},
    {"actor_rollout_ref.actor.entropy_checkpointing", "", kPython},
    {"actor_rollout_ref.ref.entropy_checkpointing", "", kPython},
    {"actor_rollout_ref.actor.rollout_n", "", kPython},
    {"actor_rollout_ref.ref.rollout_n", "", kPython},
    {"critic.rollout_n", "", kPython},
    {"actor_rollout_ref.actor.data_loader_seed", "", kPython},
    {"critic.data_loader_seed", "", kPython},
    {"actor_rollout_ref.actor.calculate_entropy", "", kPython},
    {"actor_rollout_ref.actor.sum_pi_squared_checkpointing", "",
     "hybridflow computes sum_pi_squared without gradients, a chunk of tokens at a time"},
    {"actor_rollout_ref.actor.use_prefix_grouper", "", kPython},
    {"actor_rollout_ref.actor.freeze_vision_tower", "", kPython},
    {"actor_rollout_ref.nccl_timeout", "", kPython},
    {"critic.enable", "", kPython},  // verl's switch: hybridflow starts a critic exactly for adv_estimator gae
    // Optimizer: AdamW with hybridflow's own schedule.
    {"actor_rollout_ref.actor.optim.optimizer", "AdamW", "hybridflow trains with AdamW"},
    {"critic.optim.optimizer", "AdamW", "hybridflow trains with AdamW"},
    {"actor_rollout_ref.actor.optim.optimizer_impl", "", kPython},
    {"critic.optim.optimizer_impl", "", kPython},
    // Loss variants hybridflow lacks: verl's default only.
    {"actor_rollout_ref.actor.tau_pos", "", "used only by other loss modes"},
    {"actor_rollout_ref.actor.tau_neg", "", "used only by other loss modes"},
    {"algorithm.rollout_correction", "", "used only with rollout_is / rollout_rs"},
    // Model loading options of HF transformers.
    {"actor_rollout_ref.model.hf_config_path", "null", "the model directory's config.json is read"},
    {"actor_rollout_ref.model.tokenizer_path", "null", "the model directory's tokenizer is read"},
    {"critic.model.tokenizer_path", "", "the actor's tokenizer is used"},
    {"reward_model.model.input_tokenizer", "", "the actor's tokenizer is used"},
    {"actor_rollout_ref.model.override_config", "", kPython},
    {"critic.model.override_config", "", kPython},
    {"reward_model.model.override_config", "", kPython},
    {"actor_rollout_ref.model.external_lib", "null", kPython},
    {"critic.model.external_lib", "", kPython},
    {"reward_model.model.external_lib", "", kPython},
    {"actor_rollout_ref.model.trust_remote_code", "", kPython},
    {"critic.model.trust_remote_code", "", kPython},
    {"reward_model.model.trust_remote_code", "", kPython},
    {"actor_rollout_ref.model.use_shm", "", kPython},
    {"critic.model.use_shm", "", kPython},
    {"reward_model.model.use_shm", "", kPython},
    {"actor_rollout_ref.model.enable_activation_offload", "", kPython},
    {"critic.model.enable_activation_offload", "", kPython},
    {"reward_model.model.use_remove_padding", "", kPython},
    {"actor_rollout_ref.model.use_liger", "", kPython},
    {"actor_rollout_ref.model.use_fused_kernels", "", kPython},
    {"reward_model.model.use_fused_kernels", "", kPython},
    {"actor_rollout_ref.model.fused_kernel_options", "", kPython},
    {"actor_rollout_ref.model.tiled_mlp", "", kPython},
    {"critic.model.tiled_mlp", "", kPython},
    {"actor_rollout_ref.model.mtp", "", "multi-token prediction is not supported by hybridflow"},
    // vLLM / SGLang server settings.
    {"actor_rollout_ref.rollout.prompt_length", "", "prompts are limited by data.max_prompt_length"},
    {"actor_rollout_ref.rollout.cudagraph_capture_sizes", "", kRollout},
    {"actor_rollout_ref.rollout.data_parallel_size", "", "rollout data parallelism follows actor_rollout_ref.num_processes"},
    {"actor_rollout_ref.rollout.max_model_len", "", kRollout},
    {"actor_rollout_ref.rollout.enable_chunked_prefill", "", kRollout},
    {"actor_rollout_ref.rollout.logprobs_mode", "", kRollout},
    {"actor_rollout_ref.rollout.scheduling_policy", "", kRollout},
    {"actor_rollout_ref.rollout.load_format", "", kRollout},
    {"actor_rollout_ref.rollout.disable_log_stats", "", kRollout},
    {"actor_rollout_ref.rollout.multi_stage_wake_up", "", kRollout},
    {"actor_rollout_ref.rollout.engine_kwargs", "", kRollout},
    {"actor_rollout_ref.rollout.checkpoint_engine", "", kRollout},
    {"actor_rollout_ref.rollout.trace", "", kRollout},
    {"actor_rollout_ref.rollout.prometheus", "", kRollout},
    {"actor_rollout_ref.rollout.agent", "", kRollout},
    {"actor_rollout_ref.rollout.skip_tokenizer_init", "", kRollout},
    {"actor_rollout_ref.rollout.layered_summon", "", kRollout},
    {"actor_rollout_ref.rollout.calculate_log_probs", "", "old log-probs are always recomputed by the actor"},
    {"actor_rollout_ref.rollout.enable_rollout_routing_replay", "false|true",
     "the rollout records the routing exactly when actor_rollout_ref.actor.router_replay.mode is R3"},
    {"actor_rollout_ref.rollout.quantization", "null", "quantized rollout is not supported by hybridflow"},
    {"actor_rollout_ref.rollout.quantization_config_file", "null", "quantized rollout is not supported by hybridflow"},
    {"actor_rollout_ref.rollout.do_sample", "true", "training rollouts always sample"},
    {"actor_rollout_ref.rollout.over_sample_rate", "",
     "verl's own rollouts no longer read it (verl January 2026: config only); hybridflow generates every sample"},
    {"actor_rollout_ref.rollout.skip_rollout", "false", kNotYet},
    {"actor_rollout_ref.rollout.skip_dump_dir", "", "used only with skip_rollout"},
    {"actor_rollout_ref.rollout.multi_turn", "",
     "trajectories are always built token in, token out (docs/agentic.md); verl's other multi_turn keys are not read"},
    {"actor_rollout_ref.rollout.mtp", "", "multi-token prediction is not supported by hybridflow"},
    // Data loading options of verl's RLHFDataset (docs/data.md says which columns hybridflow reads).
    {"data.tokenizer", "null", "the actor model's tokenizer is used"},
    {"data.use_shm", "", kPython},
    {"data.val_batch_size", "", kPython},
    {"data.tool_config_path", "null", "tools come from actor_rollout_ref.rollout.multi_turn.tool_config_path"},
    {"data.return_raw_input_ids", "", kPython},
    {"data.return_raw_chat", "", kPython},
    {"data.return_full_prompt", "", kPython},
    {"data.return_multi_modal_inputs", "", kPython},
    {"data.dataloader_num_workers", "", kPython},
    {"data.image_patch_size", "", "multi-modal data is not supported by hybridflow"},
    {"data.image_key", "", "multi-modal data is not supported by hybridflow"},
    {"data.video_key", "", "multi-modal data is not supported by hybridflow"},
    {"data.validation_shuffle", "", kPython},
    {"data.filter_overlong_prompts_workers", "", kPython},
    {"data.trust_remote_code", "", kPython},
    {"data.custom_cls.path", "null", "custom dataset classes are Python"},
    {"data.custom_cls", "", "custom dataset classes are Python"},
    {"data.sampler.class_path", "null", "custom samplers are Python"},
    {"data.sampler", "", "custom samplers are Python"},
    {"data.datagen.path", "null", "dataset generators are Python"},
    {"data.datagen", "", "dataset generators are Python"},
    // Reward: hybridflow scores with reward.* (docs/rewards.md), not Python reward managers.
    {"reward_manager", "", "rewards come from reward.* (docs/rewards.md)"},
    {"reward_model.reward_manager", "", "rewards come from reward.* (docs/rewards.md)"},
    {"reward_model.reward_loop_source", "", kPython},
    {"reward_model.reward_loop_module_path", "", kPython},
    {"reward_model.reward_loop_class_name", "", kPython},
    {"reward_model.launch_reward_fn_async", "", kPython},
    {"reward_model.sandbox_fusion", "", kPython},
    {"reward_model.use_reward_loop", "", kPython},
    {"reward_model.num_workers", "", kPython},
    {"reward_model.enable_resource_pool", "", "hybridflow places the reward model with trainer.placement / pools"},
    {"reward_model.n_gpus_per_node", "", "use reward_model.num_processes"},
    {"reward_model.nnodes", "", "use reward_model.num_processes"},
    {"reward_model.max_length", "", kPython},
    // Trainer and cluster settings of verl's Ray driver.
    {"trainer.esi_redundant_time", "", kPython},
    {"trainer.default_hdfs_dir", "null", "HDFS is not supported by hybridflow"},
    {"trainer.del_local_ckpt_after_load", "", kPython},
    {"trainer.max_critic_ckpt_to_keep", "", "trainer.max_ckpt_to_keep covers all roles"},
    {"trainer.ray_wait_register_center_timeout", "", kPython},
    {"trainer.use_legacy_worker_impl", "", kPython},
    {"trainer.npu_profile", "", kPython},
    {"ray_kwargs", "", kPython},
    {"ray_init", "", kPython},
    {"transfer_queue", "", kPython},
    // ppo_megatron_trainer.yaml's engine blocks (megatron's tensor, pipeline and expert parallel sizes and
    // use_distributed_optimizer are hybridflow's keys too; the offloads are aliases above).
    {"actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size", "",
     "hybridflow's pipeline runs 1F1B without virtual (interleaved) stages: the same updates, more bubbles"},
    {"actor_rollout_ref.ref.megatron.virtual_pipeline_model_parallel_size", "",
     "hybridflow's pipeline runs 1F1B without virtual (interleaved) stages: the same updates, more bubbles"},
    {"critic.megatron.virtual_pipeline_model_parallel_size", "",
     "hybridflow's pipeline runs 1F1B without virtual (interleaved) stages: the same updates, more bubbles"},
    {"actor_rollout_ref.actor.megatron.expert_tensor_parallel_size", "1",
     kExpertsWhole},
    {"actor_rollout_ref.ref.megatron.expert_tensor_parallel_size", "1",
     kExpertsWhole},
    {"critic.megatron.expert_tensor_parallel_size", "1",
     kExpertsWhole},
    {"actor_rollout_ref.actor.megatron.grad_offload", "", "the gradients are freed after each optimizer step"},
    {"critic.megatron.grad_offload", "", "the gradients are freed after each optimizer step"},
    {"actor_rollout_ref.ref.megatron.param_offload", "", "the reference's weights follow the actor's placement"},
    {"actor_rollout_ref.ref.megatron.grad_offload", "", "the reference has no gradients"},
    {"actor_rollout_ref.ref.megatron.optimizer_offload", "", "the reference has no optimizer"},
    {"actor_rollout_ref.actor.megatron.override_transformer_config", "",
     "Megatron-LM's model settings; activation checkpointing is actor_rollout_ref.model.enable_gradient_checkpointing"},
    {"actor_rollout_ref.ref.megatron.override_transformer_config", "", kMegatron},
    {"critic.megatron.override_transformer_config", "",
     "Megatron-LM's model settings; activation checkpointing is critic.model.enable_gradient_checkpointing"},
    {"actor_rollout_ref.actor.megatron.sequence_parallel", "", kMegatron},
    {"actor_rollout_ref.actor.megatron.use_dist_checkpointing", "", kMegatron},
    {"actor_rollout_ref.actor.megatron.dist_checkpointing_path", "", kMegatron},
    {"actor_rollout_ref.actor.megatron.dist_checkpointing_prefix", "", kMegatron},
    {"actor_rollout_ref.actor.megatron.seed", "", "trainer.seed seeds every role"},
    {"actor_rollout_ref.actor.megatron.override_ddp_config", "", kMegatron},
    {"actor_rollout_ref.actor.megatron.override_mcore_model_config", "", kMegatron},
    {"actor_rollout_ref.actor.megatron.use_mbridge", "", kMegatron},
    {"actor_rollout_ref.actor.megatron.vanilla_mbridge", "", kMegatron},
    {"actor_rollout_ref.actor.megatron.use_remove_padding", "", "padding-free packing is actor_rollout_ref.model.use_remove_padding"},
    {"actor_rollout_ref.actor.megatron.forward_only", "", kMegatron},
    {"actor_rollout_ref.actor.megatron.dtype", "", kMegatron},
    {"actor_rollout_ref.ref.megatron", "", kMegatron},  // the rest of the reference's block
    {"critic.megatron", "", kMegatron},                 // the rest of the critic's block
    {"actor_rollout_ref.model.lora.type", "lora", "hybridflow's adapters are plain LoRA"},
    {"actor_rollout_ref.model.lora.dropout", "0|0.0", kNotYet},
    {"actor_rollout_ref.model.lora.target_modules", "null",
     "Megatron's module names: set actor_rollout_ref.model.target_modules (all-linear, or HF module names)"},
    {"actor_rollout_ref.model.lora.exclude_modules", "null", "set actor_rollout_ref.model.exclude_modules (HF module names)"},
    {"actor_rollout_ref.model.lora", "", "Megatron's LoRA options (merge, dropout_position, lora_A_init_method); the "
                                         "adapters start as PEFT's do"},
    {"critic.model.lora", "", "Megatron's LoRA options: the critic's adapters are critic.model.lora_rank / lora_alpha"},
    {"actor_rollout_ref.actor.optim.lr_warmup_init", "0|0.0", kNotYet},
    {"actor_rollout_ref.actor.optim.lr_decay_steps", "null", kNotYet},
    {"actor_rollout_ref.actor.optim.min_lr", "0|0.0", "use min_lr_ratio"},
    {"actor_rollout_ref.actor.optim.weight_decay_incr_style", "constant", kNotYet},
    {"actor_rollout_ref.actor.optim.lr_wsd_decay_style", "", "used only by lr_decay_style WSD, which hybridflow lacks"},
    {"actor_rollout_ref.actor.optim.lr_wsd_decay_steps", "", "used only by lr_decay_style WSD, which hybridflow lacks"},
    {"actor_rollout_ref.actor.optim.use_checkpoint_opt_param_scheduler", "", "a resume continues the schedule where it stopped"},
    // Hydra's own entries in a config file, and every _target_ (a Python class to instantiate).
    {"defaults", "", "Hydra composition: write the full config"},
    {"hydra", "", kPython},
    {"**._target_", "", kPython},
};

KeyCompat build() {
  KeyCompat compat;
  for (const auto& [from, to] : kAliases) compat.aliases.emplace_back(from, to);
  for (const auto& k : kIgnored) compat.ignored.push_back({k.key, k.accepted, k.note});
  compat.null_keeps_default = true;
  return compat;
}

}  // namespace

const KeyCompat& verl_key_compat() {
  static const KeyCompat compat = build();
  return compat;
}

}  // namespace hybridflow
