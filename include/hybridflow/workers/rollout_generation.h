// What a generate_sequences call does around the generation engine, shared by the actor (which generates
// itself when colocated) and the standalone rollout worker, so that both sample the same tokens from the
// same weights and seed: the sampling settings of a request and the rollout batch made of its output.
#pragma once

#include <nlohmann/json.hpp>

#include "hybridflow/core/data_proto.h"
#include "hybridflow/engine/generation.h"
#include "hybridflow/model/model_config.h"
#include "hybridflow/workers/role_specs.h"

namespace hybridflow {

// Decode steps between two reads of the device on a CUDA device when actor_rollout_ref.rollout.readback_interval
// is unset: the host queues this many steps ahead (a read waits for all queued work) at the price of up to
// this many - 1 steps decoded past a row's stop token. The interval the GPU benchmark measured graphs with.
inline constexpr int64_t kCudaReadbackInterval = 8;

// From the worker's rollout spec (response_length, temperature, top_k, top_p, n, seed, max_num_seqs), its
// model spec (eos_token_ids, vocab_size) and the request's meta (n, greedy, seed: the call's overrides). Each generation replica draws from
// its own stream (`replica`), so replicas do not repeat each other's samples.
// On a CUDA `device` the paged KV cache's pool is the spec's gpu_memory_utilization of that device's memory,
// and unset cuda_graphs / readback_interval mean graphs where they apply and kCudaReadbackInterval; elsewhere
// eager steps read back one at a time. `kept` is the worker's store of KV pools and decode graphs between
// calls, used where rollout.free_cache_engine is false (the KV cache stays between rollouts: its graphs are
// captured once).
GenerationConfig rollout_generation_config(const RolloutSpec& rollout, const ModelSpec& model_spec,
                                           const ModelConfig& model, const DataProto& request, int replica,
                                           const torch::Device& device,
                                           std::shared_ptr<DecodeGraphCache> kept = nullptr);

// The rollout batch of `out` (rl_batch.h's rollout_batch) with its prompts left-padded to the request's
// width, and the request's per-prompt fields repeated for each of its samples; the KV cache's report in the
// meta ("kv_cache": peak_bytes, pool_blocks, peak_blocks, sequences_fit, kept_pools, and the decode graphs
// held, taken from earlier calls and the steps replayed: decode_graphs, decode_graphs_taken, graph_steps).
DataProto rollout_result(const GenerationOutput& out, const GenerationConfig& g, const DataProto& request);

}  // namespace hybridflow
