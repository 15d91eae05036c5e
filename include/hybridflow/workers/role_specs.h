// What each role's workers are told when their group is created: one typed specification per role. The
// trainer builds each once from the configuration, with every check and every default there
// (trainer/role_spec_builders.h); it travels to the workers as a whole (to_json) and each worker decodes it
// once (from_json) when it starts. No worker reads a configuration key of its own.
//
// A field left out of the JSON keeps the value written here: specs built in code (tests, benchmarks) name
// only what they change. These are not the configuration's defaults (the trainer always sends every field):
// they are the neutral settings of a worker used on its own.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "hybridflow/algo/algo_config.h"
#include "hybridflow/algo/losses.h"
#include "hybridflow/engine/token_micro_batches.h"
#include "hybridflow/engine/train_engine.h"
#include "hybridflow/model/lora_config.h"

namespace hybridflow {

// The model a role builds (workers/model_spec.h): a Hugging Face directory, or a preset made whole from
// init_seed, with the tokenizer's ids, where it computes and in which dtype. Every role starts from the
// trainer's model (model.*) and sets its own dtype, path and activation checkpointing.
struct ModelSpec {
  std::string path;  // a model directory; when set, preset and the dimensions are not used
  std::string preset = "tiny";
  int64_t vocab_size = 0;  // the tokenizer's: required without a path (and rows past it are never sampled)
  // 0: the preset's.
  int64_t hidden_size = 0, num_hidden_layers = 0, intermediate_size = 0, num_attention_heads = 0,
          num_key_value_heads = 0;
  uint64_t init_seed = 0;
  std::optional<int64_t> eos_token_id, pad_token_id;  // unset: the preset's
  std::optional<std::vector<int64_t>> eos_token_ids;  // the ids a rollout stops at (unset: eos_token_id)
  std::string device = "cpu";  // cpu | cuda (this process's device, runtime worker_device)
  std::string dtype = "fp32";  // fp32 | bf16 | fp16
  bool enable_gradient_checkpointing = false;
  // Ulysses sequence parallelism (verl's <role>.ulysses_sequence_parallel_size): consecutive ranks of this
  // many split each sequence of the role's whole-sequence passes (workers/sequence_parallel_rows.h).
  int ulysses_sequence_parallel_size = 1;
  // Expert parallelism (verl's <role>.megatron.expert_model_parallel_size): consecutive ranks of this many split
  // each mixture-of-experts layer's experts (workers/expert_parallel_ranks.h); expert_key names it in errors.
  int expert_model_parallel_size = 1;
  std::string expert_key = "expert_model_parallel_size";
  // Padding-free packing (verl's <role>.model.use_remove_padding): each micro-batch's sequences run as one
  // packed row (engine/packed_rows.h).
  bool use_remove_padding = false;
  // LoRA adapters (model/lora.h; verl's <role>.model.lora_* keys): lora.rank 0 trains every weight. With
  // lora_adapter_path the adapters start from that PEFT directory (its adapter_config.json sets the rank and
  // targets). lora_key names the configuration section in errors ("actor_rollout_ref.model").
  LoraConfig lora;
  std::string lora_adapter_path;
  std::string lora_key = "model";
  bool uses_lora() const { return lora.enabled() || !lora_adapter_path.empty(); }
};
void to_json(nlohmann::json& j, const ModelSpec& spec);
void from_json(const nlohmann::json& j, ModelSpec& spec);

// Generation (actor_rollout_ref.rollout): sampling, the generation layout and its memory settings, and the
// old-log-prob pass that runs on the generated batch.
struct RolloutSpec {
  std::string dtype;           // the generating model's ("": the actor's)
  int64_t n = 1;               // samples per prompt
  int64_t response_length = 32;
  double temperature = 1.0;    // also the temperature of every log-prob of the responses
  int64_t top_k = 0;           // 0: off
  double top_p = 1.0;
  uint64_t seed = 0;
  int64_t max_num_seqs = 0;  // sequences decoded at once (0: all)
  int64_t admission_rows = -1;  // the fewest samples waiting prompts join with (GenerationConfig::admission_rows)
  // The KV cache: paged (blocks of kv_block_size positions, a prompt stored once for its samples) or one slab
  // row per sequence ("slots"); on a GPU the paged pool is gpu_memory_utilization of the device's memory
  // less the weights (verl's key), on the CPU what the sequences that run at once can hold.
  bool paged_kv_cache = true;
  int64_t kv_block_size = 16;
  // Contexts that begin with the same whole blocks of ids as one whose blocks are held start on them
  // (GenerationConfig::enable_prefix_caching; verl's key).
  bool enable_prefix_caching = true;
  // verl's ignore_eos: no eos id ends a response (GenerationConfig::eos_token_ids left empty), so every one runs
  // to response_length, as vLLM's SamplingParams(ignore_eos=True) does; for throughput benchmarks.
  bool ignore_eos = false;
  // Positions one multi-turn prefill forward may hold (GenerationConfig::max_num_batched_tokens; verl's key).
  int64_t max_num_batched_tokens = 8192;
  double gpu_memory_utilization = 0.5;
  // Generation's layout: 0 = the training tensor-parallel size; a smaller one (or pipeline stages) switches
  // through the 3D-HybridEngine in reshard_mode.
  int tensor_model_parallel_size = 0;
  int pipeline_model_parallel_size = 1;
  // With the actor's experts split over n ranks (expert_model_parallel_size): 1 generates on experts gathered
  // from the group, n with them where training keeps them (tokens exchanged by all-to-all in every decode step).
  int expert_parallel_size = 1;
  std::string reshard_mode = "hybridflow";
  bool free_cache_engine = true;  // the KV cache (and a cast copy of the weights) only during a rollout
  // Decode steps as CUDA graphs (verl's enforce_eager: false). Unset: on a CUDA device wherever they apply,
  // eagerly elsewhere without a message; true: asked for by name, so a combination they do not cover on a CUDA
  // device fails naming it; false: eagerly. The CPU decodes eagerly in every case (rollout_generation.h).
  std::optional<bool> cuda_graphs;
  // Decode steps between two reads of the device (GenerationConfig). Unset: kCudaReadbackInterval on a CUDA
  // device, 1 elsewhere.
  std::optional<int64_t> readback_interval;
  // Generation and the log-prob passes on the batch-invariant kernels (model/batch_invariant.h): recorded and
  // recomputed log-probs equal bit for bit.
  bool batch_invariant = false;
  // The old-log-prob pass (compute_log_prob) in micro-batches of rows, or of tokens when max_tokens > 0.
  MicroBatching log_prob{16, 0, "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"};
  // The controller's: the bucket size of weight updates sent to a standalone rollout pool.
  int64_t update_weights_bucket_megabytes = 512;
  // With LoRA adapters: generate on weights with the adapters merged in (true), or with the adapters applied
  // beside the base weights (false).
  bool lora_merge = true;
  // A standalone rollout's generations in flight at a weight sync take the new weights between two tokens
  // and go on (engine/generation.h's refresh_weights); each token records the version that drew it.
  bool partial_rollout = false;
  // A standalone rollout of one process streams the next step's prompts (published in the weight-sync
  // store) into the slots its own batch's short responses free, and carries them over to that step's call
  // (workers/rollout_worker.h). Off: one batch per call.
  bool stream_groups = false;
  // Multi-turn, tool-using rollouts (agent_rollout.h's AgentRolloutRuntime reads it): null or enable false:
  // single-turn generation.
  nlohmann::json multi_turn;
  // Router replay R3 (workers/router_replay.h): generation records every token's experts (routed_experts).
  bool record_routing = false;
};
void to_json(nlohmann::json& j, const RolloutSpec& spec);
void from_json(const nlohmann::json& j, RolloutSpec& spec);

// How a role trains, shared by the actor and the critic: its optimizer (verl's <role>.optim block), its
// PPO epochs and batch split per process, and where its state lives between calls.
struct TrainSpec {
  OptimizerOptions optim;
  int64_t mini_batch_rows = 0;   // rows per optimizer step on this process (0: the whole batch)
  int64_t micro_batch_rows = 0;  // rows per forward/backward (0: the whole mini-batch)
  int64_t max_token_len = 0;     // > 0: micro-batches of at most this many tokens instead (use_dynamic_bsz)
  int64_t epochs = 1;
  bool shuffle = true;
  uint64_t seed = 0;  // the mini-batch order's
  bool use_distributed_optimizer = false;
  bool param_offload = false;
  bool optimizer_offload = false;
};
void to_json(nlohmann::json& j, const TrainSpec& spec);
void from_json(const nlohmann::json& j, TrainSpec& spec);

// The actor (actor_rollout_ref.actor): how it trains and its loss.
struct ActorSpec {
  std::string dtype;  // "": the model spec's
  TrainSpec train;
  algo::PolicyLossConfig policy_loss;
  algo::ActorLossTerms loss_terms;  // entropy bonus and KL loss
  // verl's router_replay.mode (workers/router_replay.h): disabled, R2 or R3.
  std::string router_replay = "disabled";
  // verl's calculate_sum_pi_squared: the old log-prob pass also returns sum_pi_squared, each token's sum of p^2
  // over the vocabulary (the optimal token baseline's weights).
  bool calculate_sum_pi_squared = false;
};
void to_json(nlohmann::json& j, const ActorSpec& spec);
void from_json(const nlohmann::json& j, ActorSpec& spec);

// The frozen reference policy in the actor's processes (actor_rollout_ref.ref).
struct RefSpec {
  std::string dtype;  // "": the actor's
  MicroBatching log_prob{16, 0, "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu"};
};
void to_json(nlohmann::json& j, const RefSpec& spec);
void from_json(const nlohmann::json& j, RefSpec& spec);

// The critic (critic): how it trains, its value loss, and its values pass.
struct CriticSpec {
  TrainSpec train;
  double cliprange_value = 0.5;
  algo::LossAggMode loss_agg_mode = algo::LossAggMode::kTokenMean;
  MicroBatching values{16, 0, "critic.forward_max_token_len_per_gpu"};
};
void to_json(nlohmann::json& j, const CriticSpec& spec);
void from_json(const nlohmann::json& j, CriticSpec& spec);

// A scoring model (reward_model, cost_model): a value-head model's forward pass in micro-batches (the
// cost model takes the reward model's token budget, so the error names the reward model's key).
struct ScoringModelSpec {
  MicroBatching forward{16, 0, "reward_model.forward_max_token_len_per_gpu"};
};
void to_json(nlohmann::json& j, const ScoringModelSpec& spec);
void from_json(const nlohmann::json& j, ScoringModelSpec& spec);

// The spec under `key` of a worker group's config JSON; the spec's own values where the key is absent.
template <typename Spec>
Spec decode_spec(const nlohmann::json& config, const char* key) {
  return config.contains(key) ? config.at(key).get<Spec>() : Spec{};
}

}  // namespace hybridflow
