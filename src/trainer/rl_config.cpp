#include "hybridflow/algo/algo_config.h"
#include "hybridflow/core/config.h"
#include "hybridflow/core/logging.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/trainer/verl_keys.h"
#include "hybridflow/workers/reward_function.h"

namespace hybridflow {

namespace {
// verl's names where the concept is the same. Batch sizes count prompts (train_batch_size,
// ppo_mini_batch_size, over all ranks) like verl; a micro-batch key counts samples over all data-parallel
// ranks and its _per_gpu twin samples per process (trainer/rl_batch_sizes.h).
const char* const kRLSchema = R"(trainer:
  total_steps: 10
  seed: 1
  run_dir: ""
  threads_per_worker: 1
  device: auto
  placement: null
  colocate: null
  save_checkpoint: false
  save_freq: -1
  max_ckpt_to_keep: 0
  resume_mode: auto
  resume_from_path: ""
  max_rollout_restarts: 0
  log_every: 1
  logger: [console, jsonl, tensorboard]
  test_freq: 0
  log_samples_freq: 10
  log_samples_count: 4
  val_before_train: true
  val_only: false
  log_val_generations: 0
  rollout_data_dir: null
  validation_data_dir: null
  critic_warmup: 0
  balance_batch: true
  project_name: ""
  experiment_name: ""
  total_epochs: null
  n_gpus_per_node: null
  nnodes: null
global_profiler:
  tool: null
  steps: null
  save_path: null
  trace: true
  global_tool_config:
    torch_memory:
      trace_alloc_max_entries: 100000
      stack_depth: 32
      context: all
      stacks: all
data:
  task: addition_reversed
  min_digits: 1
  max_digits: 3
  min_length: 3
  max_length: 6
  train_file: null
  test_file: null
  train_size: 512
  train_max_samples: -1
  prompt_key: prompt
  reward_fn_key: data_source
  test_size: 64
  val_max_samples: -1
  train_batch_size: 8
  gen_batch_size: null
  shuffle: true
  seed: null
  add_bos: true
  max_prompt_length: 512
  max_response_length: 16
  truncation: error
  filter_overlong_prompts: false
  apply_chat_template: false
  apply_chat_template_kwargs: {}
model:
  path: ""
  preset: tiny
  hidden_size: 0
  num_hidden_layers: 0
  intermediate_size: 0
  num_attention_heads: 0
  num_key_value_heads: 0
  init_seed: 0
actor_rollout_ref:
  num_processes: 1
  model:
    enable_gradient_checkpointing: false
    lora_rank: 0
    lora_alpha: 16.0
    target_modules: null
    exclude_modules: null
    lora_adapter_path: null
    use_remove_padding: false
    custom_chat_template: null
  actor:
    ppo_mini_batch_size: 8
    ppo_micro_batch_size: null
    ppo_micro_batch_size_per_gpu: null
    use_dynamic_bsz: false
    ppo_max_token_len_per_gpu: 16384
    ppo_epochs: 1
    shuffle: true
    ulysses_sequence_parallel_size: 1
)";
// The actor's loss keys come from algo/algo_config.h (kActorLossYaml), placed here under actor.
const char* const kRLSchemaAfterActorLoss = R"(    dtype: fp32
    router_replay:
      mode: disabled
    calculate_sum_pi_squared: false
    megatron:
      tensor_model_parallel_size: 1
      pipeline_model_parallel_size: 1
      expert_model_parallel_size: 1
      use_distributed_optimizer: false
    fsdp_config:
      param_offload: false
      optimizer_offload: false
    optim:
      lr: 1.0e-5
      weight_decay: 0.01
      betas: [0.9, 0.999]
      grad_clip: 1.0
      lr_warmup_steps: -1
      lr_warmup_steps_ratio: 0.0
      lr_scheduler_type: constant
      warmup_style: null
      min_lr_ratio: 0.0
      num_cycles: 0.5
      total_training_steps: null
      override_optimizer_config: {}
@PROFILER4@
  rollout:
    dtype: null
    n: 1
    temperature: null
    top_k: null
    top_p: null
    val_kwargs:
      do_sample: false
      n: 1
      temperature: 0.0
      top_k: -1
      top_p: 1.0
    response_length: null
    ignore_eos: false
    log_prob_micro_batch_size: null
    log_prob_micro_batch_size_per_gpu: null
    log_prob_use_dynamic_bsz: null
    log_prob_max_token_len_per_gpu: null
    tensor_model_parallel_size: null
    pipeline_model_parallel_size: 1
    expert_parallel_size: 1
    reshard_mode: hybridflow
    num_processes: 1
    staleness: 0
    trigger_parameter_sync_step: 1
    partial_rollout: false
    stream_groups: false
    update_weights_bucket_megabytes: 512
    free_cache_engine: true
    batch_invariant: false
    max_num_seqs: 1024
    admission_rows: -1
    kv_cache: paged
    kv_block_size: 16
    enable_prefix_caching: true
    max_num_batched_tokens: 8192
    gpu_memory_utilization: 0.5
    enforce_eager: null
    readback_interval: null
    lora_merge: true
    multi_turn:
      enable: false
      max_assistant_turns: null
      max_user_turns: null
      tool_config_path: null
      interaction_config_path: null
      format: hermes
      max_parallel_calls: 1
      max_tool_response_length: 256
      tool_response_truncate_side: middle
@PROFILER4@
  ref:
    dtype: null
    ulysses_sequence_parallel_size: null
    log_prob_micro_batch_size: null
    log_prob_micro_batch_size_per_gpu: null
    log_prob_use_dynamic_bsz: null
    log_prob_max_token_len_per_gpu: null
    megatron:
      tensor_model_parallel_size: null
      pipeline_model_parallel_size: null
      expert_model_parallel_size: null
@PROFILER4@
critic:
  num_processes: 1
  megatron:
    tensor_model_parallel_size: 1
    pipeline_model_parallel_size: 1
    expert_model_parallel_size: 1
    use_distributed_optimizer: false
  model_path: ""
  model:
    fsdp_config:
      param_offload: false
      optimizer_offload: false
    enable_gradient_checkpointing: false
    lora_rank: 0
    lora_alpha: 16.0
    target_modules: null
    exclude_modules: null
    lora_adapter_path: null
    use_remove_padding: false
  dtype: fp32
  ppo_mini_batch_size: 8
  ppo_micro_batch_size: null
  ppo_micro_batch_size_per_gpu: null
  forward_micro_batch_size: null
  forward_micro_batch_size_per_gpu: null
  use_dynamic_bsz: null
  ppo_max_token_len_per_gpu: 32768
  forward_max_token_len_per_gpu: null
  ppo_epochs: 1
  shuffle: true
  ulysses_sequence_parallel_size: 1
  cliprange_value: 0.5
  loss_agg_mode: token-mean
  optim:
    lr: 1.0e-5
    weight_decay: 0.01
    betas: [0.9, 0.999]
    grad_clip: 1.0
    lr_warmup_steps: -1
    lr_warmup_steps_ratio: 0.0
    lr_scheduler_type: constant
    warmup_style: null
    min_lr_ratio: 0.0
    num_cycles: 0.5
    total_training_steps: null
    override_optimizer_config: {}
@PROFILER2@
reward_model:
  enable: false
  path: ""
  overlong_buffer:
    enable: false
    len: 0
    penalty_factor: 1.0
    log: false
    max_resp_len: null
  reward_clip: null
  dtype: fp32
  num_processes: 1
  micro_batch_size: null
  micro_batch_size_per_gpu: null
  use_dynamic_bsz: null
  forward_max_token_len_per_gpu: null
  megatron:
    tensor_model_parallel_size: 1
    pipeline_model_parallel_size: 1
@PROFILER2@
cost_model:
  enable: false
  path: ""
  dtype: fp32
  num_processes: 1
  micro_batch_size: null
  micro_batch_size_per_gpu: null
  megatron:
    tensor_model_parallel_size: 1
    pipeline_model_parallel_size: 1
)";
// Each role's profiler section (verl's names; trainer/run_spec.h: ProfilerRunSpec), at @PROFILER<indent>@.
const char* const kRoleProfilerYaml = R"(profiler:
  enable: false
  all_ranks: false
  ranks: []
  tool_config:
    torch:
      contents: []
      discrete: false
)";

std::string with_role_profilers(std::string yaml) {
  for (int indent : {2, 4}) {
    const std::string marker = "@PROFILER" + std::to_string(indent) + "@\n";
    for (size_t at = yaml.find(marker); at != std::string::npos; at = yaml.find(marker))
      yaml.replace(at, marker.size(), algo::indent_yaml(kRoleProfilerYaml, indent));
  }
  return yaml;
}

}  // namespace

std::string rl_trainer_defaults_yaml() {
  // The actor's loss keys are algo's (algo/algo_config.h) and the cost's scorer keys the reward's
  // (workers/reward_function.h), defaults included: each default is written once.
  return with_role_profilers(std::string(kRLSchema) + algo::indent_yaml(algo::kActorLossYaml, 4) +
                             kRLSchemaAfterActorLoss + "cost:\n  type: none\n  contains: []\n" + kScorerKeysYaml +
                             "pools: {}\n" + algo::kAlgorithmSectionYaml + kRewardConfigDefaults +
                             "custom_reward_function:\n  path: null\n  name: compute_score\n  reward_kwargs: {}\n"
                             "  python: python3\n");
}

int64_t rl_response_length(const Config& config) {
  const std::string rollout_key = "actor_rollout_ref.rollout.response_length";
  return config.is_null(rollout_key) ? config.get<int64_t>("data.max_response_length") : config.get<int64_t>(rollout_key);
}

Config load_rl_config(const std::string& user_file, const std::vector<std::string>& overrides) {
  const std::string defaults = rl_trainer_defaults_yaml();
  CompatReport report;
  const Config config = Config::load(defaults, user_file, overrides, verl_key_compat(), &report);
  if (!report.ignored.empty()) {
    std::string keys;
    for (const auto& key : report.ignored) keys += "\n  " + key;
    log_warn("ignoring ", report.ignored.size(), " verl config key", report.ignored.size() == 1 ? "" : "s",
             " that only verl's Python stack (FSDP, vLLM, Ray, ...) reads; hybridflow's own engine runs "
             "(docs/configuration.md, \"verl configs\"):", keys);
  }
  for (const auto& [verl_key, key] : report.renamed) log_debug("verl config key ", verl_key, " read as ", key);
  // Values verl derives from other keys: set as overrides after the user's, so config.yaml shows them.
  std::vector<std::string> derived = verl_derived_overrides(config);
  if (derived.empty()) return config;
  std::vector<std::string> all = overrides;
  all.insert(all.end(), derived.begin(), derived.end());
  return Config::load(defaults, user_file, all, verl_key_compat(), nullptr);
}

}  // namespace hybridflow
