#include "hybridflow/workers/rollout_worker.h"

#include <ATen/Parallel.h>

#include "hybridflow/core/error.h"
#include "hybridflow/core/process_memory.h"
#include "hybridflow/engine/generation.h"
#include "hybridflow/model/batch_invariant.h"
#include "hybridflow/runtime/protocol.h"
#include "hybridflow/workers/agent_rollout.h"
#include "hybridflow/workers/lora_scopes.h"
#include "hybridflow/workers/model_spec.h"
#include "hybridflow/workers/partial_rollout_state.h"
#include "hybridflow/workers/rl_batch.h"
#include "hybridflow/workers/role_memory.h"
#include "hybridflow/workers/rollout_generation.h"
#include "hybridflow/workers/weight_sync_link.h"

namespace hybridflow {

void RolloutWorker::register_methods(MethodTable& table) {
  const nlohmann::json& config = context().config;
  at::set_num_threads(config.value("threads", 1));
  rollout_spec_ = decode_spec<RolloutSpec>(config, "rollout");
  ModelSpec spec = config.at("model").get<ModelSpec>();
  if (!rollout_spec_.dtype.empty()) spec.dtype = rollout_spec_.dtype;
  model_spec_ = spec;
  set_device(model_device(spec));
  HF_CHECK(coord().pp_size == 1, "role '", context().role, "': a standalone rollout generates unstaged (pipeline size 1, got ",
           coord().pp_size, ")");
  if (world_size() > 1) groups_ = RoleProcessGroups::connect(context(), device());
  model_ = build_model(spec, HeadKind::kLanguageModel, groups_ ? groups_->tensor_parallel() : TensorParallelGroup());
  model_->eval();
  for (auto& p : model_->parameters()) p.set_requires_grad(false);
  if (rollout_spec_.multi_turn.is_object() && rollout_spec_.multi_turn.value("enable", false))
    agent_ = std::make_unique<AgentRolloutRuntime>(rollout_spec_.multi_turn);
  using W = RolloutWorker;
  table.add("generate_sequences", rollout_protocol(coord()), this, &W::generate_sequences);
  table.add("join_weight_sync", protocols::kOneToAll, this, &W::join_weight_sync);
  table.add("receive_weights", protocols::kOneToAll, this, &W::receive_weights);
  table.add("parameter_norm", protocols::kOneToAll, this, &W::parameter_norm);
  table.add("memory_stats", protocols::kOneToAll, this, &W::memory_stats);
}

DataProto RolloutWorker::generate_sequences(const DataProto& in) {
  GenerationConfig g = rollout_generation_config(rollout_spec_, model_spec_, model_->config(), in, coord().micro_dp,
                                                 device(), kept_decode_graphs_);
  // Partial rollouts: a sampled generation joins each weight sync the controller announces between two
  // tokens (a greedy evaluation runs between syncs, never beside one).
  if (rollout_spec_.stream_groups && in.meta().contains("stream_step") && !agent_ && !g.greedy)
    return generate_streaming(in, std::move(g));
  const bool partial = rollout_spec_.partial_rollout && weight_sync_ && !agent_ && !g.greedy;
  PartialSequences saved;
  if (partial) {
    g.refresh_weights = [this] { return take_announced_weights(); };
    // A checkpoint stops the generation between two tokens and saves what it drew; a request that holds
    // such partial responses continues them.
    g.stop_requested = [this] { return weight_sync_->pause_requested(); };
    if (holds_partial_responses(in)) {
      saved = partial_sequences_of(in, g.n, g.max_new_tokens, policy_version_, "generate_sequences");
      g.resume = &saved;
    }
  } else {
    HF_CHECK(!holds_partial_responses(in), "generate_sequences: the request continues partial responses, which ",
             "need actor_rollout_ref.rollout.partial_rollout: true on a standalone rollout");
  }
  DataProto result;
  GenerationOutput out;
  {
    BatchInvariantGuard batch_invariant(rollout_spec_.batch_invariant);
    MergedLoraScope merged(model_, rollout_spec_.lora_merge);
    if (agent_) {
      result = agent_generate_sequences(model_, g, in, agent_->context());
    } else {
      out = generate(model_, prompt_token_lists(in), g, nullptr);
      result = out.stopped ? partial_rollout_state(out, in.batch_size(), g.n, g.max_new_tokens, g.pad_token_id)
                           : rollout_result(out, g, in);
    }
  }
  if (rollout_spec_.free_cache_engine) release_cached_device_memory();
  if (out.stopped) return result;
  if (partial)
    set_versions(result, out);
  else
    result.set_tensor("policy_version", torch::full({result.batch_size()}, policy_version_, torch::kLong));
  return result;
}

void RolloutWorker::set_versions(DataProto& result, const GenerationOutput& out) const {
  // Each row is as old as the version that began it; its tokens' versions ride along, padded to the
  // response length with the newest.
  const int64_t width = result.tensor("responses").size(1);
  auto versions = torch::full({result.batch_size(), width}, policy_version_, torch::kLong);
  const auto drawn = out.token_versions.to(torch::kCPU);
  versions.narrow(1, 0, drawn.size(1)).copy_(drawn);
  const auto mask = result.tensor("response_mask").to(torch::kCPU) > 0;
  result.set_tensor("policy_version", std::get<0>(versions.masked_fill(~mask, policy_version_).min(1)));
  result.set_tensor("token_policy_version", versions);
}

int64_t RolloutWorker::take_announced_weights() {
  const int64_t announced = weight_sync_->announced_version();
  if (announced > policy_version_) {
    early_stats_ = weight_sync_->receive(model_);
    policy_version_ = announced;
    taken_early_ = announced;
  }
  return policy_version_;
}

DataProto RolloutWorker::join_weight_sync(const DataProto& in) {
  HF_CHECK(in.meta().contains("weight_sync"), "join_weight_sync: meta 'weight_sync' is required");
  weight_sync_ = hybridflow::join_weight_sync(in.meta().at("weight_sync"), rank(), device());
  return DataProto();
}

DataProto RolloutWorker::receive_weights(const DataProto& in) {
  HF_CHECK(weight_sync_, "receive_weights: call join_weight_sync first");
  const int64_t version = in.meta().value("policy_version", policy_version_ + 1);
  // A partial rollout queued before this call took these weights between two of its tokens.
  if (taken_early_ >= 0 && version == taken_early_) return weight_sync_reply(early_stats_, rank());
  const WeightSyncStats stats = weight_sync_->receive(model_);
  policy_version_ = version;
  return weight_sync_reply(stats, rank());
}

DataProto RolloutWorker::parameter_norm(const DataProto&) {
  DataProto out;
  out.set_tensor("param_sq_norm", torch::full({1}, hybridflow::parameter_sq_norm(model_), torch::kDouble));
  return out;
}

DataProto RolloutWorker::memory_stats(const DataProto&) { return memory_stats_row(); }

}  // namespace hybridflow
