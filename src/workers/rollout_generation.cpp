#include "hybridflow/workers/rollout_generation.h"

#include <algorithm>

#include "hybridflow/core/platform.h"
#include "hybridflow/workers/data_parallel.h"
#include "hybridflow/workers/rl_batch.h"

namespace hybridflow {

GenerationConfig rollout_generation_config(const RolloutSpec& rollout, const ModelSpec& model_spec,
                                           const ModelConfig& model, const DataProto& request, int replica,
                                           const torch::Device& device, std::shared_ptr<DecodeGraphCache> kept) {
  GenerationConfig g;
  g.max_new_tokens = rollout.response_length;
  g.temperature = rollout.temperature;
  g.top_k = rollout.top_k;
  g.top_p = rollout.top_p;
  // A call may ask for other samples than the spec's (a greedy evaluation, a baseline): its meta overrides.
  const nlohmann::json& call = request.meta();
  g.n = call.contains("n") ? call.at("n").get<int64_t>() : rollout.n;
  g.greedy = call.contains("greedy") && call.at("greedy").get<bool>();
  if (call.contains("temperature")) g.temperature = call.at("temperature").get<double>();
  if (call.contains("top_k")) g.top_k = call.at("top_k").get<int64_t>();
  if (call.contains("top_p")) g.top_p = call.at("top_p").get<double>();
  g.max_num_seqs = rollout.max_num_seqs;
  g.admission_rows = rollout.admission_rows;
  g.paged_kv_cache = rollout.paged_kv_cache;
  g.kv_block_size = rollout.kv_block_size;
  g.enable_prefix_caching = rollout.enable_prefix_caching;
  g.max_num_batched_tokens = rollout.max_num_batched_tokens;
  g.gpu_memory_utilization = rollout.gpu_memory_utilization;
  // Unset (the default), a CUDA device decodes as graphs wherever they apply, read back in chunks, as verl's
  // enforce_eager: false does; the CPU decodes eagerly and reads every step (a longer interval would move where
  // rows join and partial-rollout weights switch). Set, each says what it says; graphs asked for by name fail
  // where they cannot replay (GenerationConfig::require_cuda_graphs).
  const bool on_cuda = device.is_cuda();
  g.cuda_graphs = rollout.cuda_graphs.value_or(on_cuda);
  g.require_cuda_graphs = rollout.cuda_graphs.value_or(false);
  g.readback_interval = rollout.readback_interval.value_or(on_cuda ? kCudaReadbackInterval : 1);
  if (!rollout.free_cache_engine) g.decode_graph_cache = std::move(kept);
  // The fraction applies to a GPU's memory; on the CPU the pool holds what the running sequences can hold.
  if (device.is_cuda()) g.memory_budget_bytes = cuda_device_memory_bytes(device.index() < 0 ? 0 : device.index());
  // The tensor-parallel ranks of a replica draw the same tokens.
  const uint64_t seed = call.contains("seed") ? call.at("seed").get<uint64_t>() : rollout.seed;
  g.seed = seed * 1000003ULL + static_cast<uint64_t>(replica);
  if (rollout.ignore_eos)
    g.eos_token_ids.clear();  // no id ends a response: each runs to max_new_tokens
  else if (model_spec.eos_token_ids)
    g.eos_token_ids = *model_spec.eos_token_ids;
  else if (model.eos_token_id >= 0)
    g.eos_token_ids = {model.eos_token_id};
  g.pad_token_id = model.pad_token_id >= 0 ? model.pad_token_id : 0;
  // The spec's vocab_size is the tokenizer's: embedding rows past it (a padded vocabulary) decode to nothing.
  g.sampleable_vocab_size = std::min<int64_t>(model_spec.vocab_size, model.vocab_size);
  g.record_routing = rollout.record_routing && model.num_moe_layers() > 0;
  return g;
}

DataProto rollout_result(const GenerationOutput& out, const GenerationConfig& g, const DataProto& request) {
  DataProto result = rollout_batch(out, g.max_new_tokens, g.pad_token_id);
  if (request.has_tensor("input_ids"))
    result = left_pad_prompts(result, request.tensor("input_ids").size(1), g.pad_token_id);
  // Per-prompt fields follow their samples (prompt text and answer stay with each response).
  if (!request.fields().empty()) {
    DataProto fields;
    for (const auto& [key, values] : request.fields()) fields.set_field(key, values);
    result.update(fields.repeat(g.n, /*interleave=*/true));
  }
  result.meta()["kv_cache"] = {{"peak_bytes", out.kv_cache.peak_bytes},
                               {"pool_blocks", out.kv_cache.pool_blocks},
                               {"peak_blocks", out.kv_cache.peak_blocks},
                               {"sequences_fit", out.kv_cache.sequences_fit},
                               {"kept_pools", out.kv_cache.kept_pools},
                               {"prefix_cached_tokens", out.kv_cache.prefix_cached_tokens},
                               {"decode_graphs", out.decode_graphs},
                               {"decode_graphs_taken", out.decode_graphs_taken},
                               {"graph_steps", out.graph_steps}};
  return result;
}

}  // namespace hybridflow
