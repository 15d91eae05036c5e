#include "hybridflow/engine/decode_graph_obstacles.h"

#include "hybridflow/core/error.h"
#include "hybridflow/model/batch_invariant.h"

namespace hybridflow {

std::string decode_graph_obstacle(CausalLM& model, const GenerationConfig& cfg) {
  // The same conditions as CausalLM::decodes_on_device() and the continuous generator's, one at a time so
  // that a refusal can say which key to change.
  if (!cfg.use_kv_cache || !cfg.continuous_batching)
    return "the static-batch generation path (graphs replay continuous batching's steps)";
  if (!cfg.paged_kv_cache) return "the slots KV cache (actor_rollout_ref.rollout.kv_cache: slots; graphs need paged)";
  if (model->tensor_parallel().enabled())
    return "tensor-parallel decoding (actor_rollout_ref.rollout.tensor_model_parallel_size " +
           std::to_string(model->tensor_parallel().size()) + "; graphs decode one rank's whole model)";
  if (model->pipeline_stage().enabled())
    return "decoding in pipeline stages (actor_rollout_ref.rollout.pipeline_model_parallel_size " +
           std::to_string(model->pipeline_stage().stages) + ")";
  if (model->config().num_moe_layers() > 0) return "mixture-of-experts layers (graphs cover dense models)";
  if (model->has_lora() && model->lora_enabled() && !model->lora_merged())
    return "unmerged LoRA adapters (actor_rollout_ref.rollout.lora_merge: false)";
  if (model->config().rope_scaling.type == "dynamic")
    return "dynamic RoPE scaling (its frequencies follow the longest position)";
  if (batch_invariant_active()) return "the batch-invariant kernels (actor_rollout_ref.rollout.batch_invariant)";
  if (cfg.record_routing || model->router_replay_mode() != RouterReplayMode::kOff || model->keeps_router_logits())
    return "recording the routing (actor_rollout_ref.actor.router_replay.mode R3)";
  if (cfg.refresh_weights)
    return "weights refreshed mid-generation, each token recording its version "
           "(actor_rollout_ref.rollout.partial_rollout or stream_groups)";
  if (!model->decodes_on_device()) return "this model's decode step (CausalLM::decodes_on_device)";
  return "";
}

void check_required_decode_graphs(CausalLM& model, const GenerationConfig& cfg, const char* path_obstacle) {
  if (!cfg.cuda_graphs || !cfg.require_cuda_graphs) return;
  if (!model->parameters().front().device().is_cuda()) return;  // the CPU decodes eagerly, as documented
  const std::string obstacle = path_obstacle != nullptr ? std::string(path_obstacle) : decode_graph_obstacle(model, cfg);
  HF_CHECK(obstacle.empty(), "actor_rollout_ref.rollout.enforce_eager: false asks for the decode steps as CUDA ",
           "graphs, which do not replay with ", obstacle, "; leave enforce_eager unset (null) to decode such steps ",
           "eagerly without a message, or set it true");
}

}  // namespace hybridflow
