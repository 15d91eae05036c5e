#include "hybridflow/workers/router_replay.h"

#include <algorithm>

#include "hybridflow/core/error.h"

namespace hybridflow {
namespace {

constexpr const char* kRowIndexKey = "router_replay_row";

}  // namespace

torch::Tensor recorded_tokens(const torch::Tensor& routed_experts, const torch::Tensor& attention_mask) {
  return routed_experts.select(3, 0).select(2, 0).ge(0).logical_and(attention_mask.to(routed_experts.device()).ne(0));
}

RouterReplayPolicy parse_router_replay_policy(const std::string& mode, const std::string& key) {
  if (mode == "disabled") return RouterReplayPolicy::kDisabled;
  if (mode == "R2") return RouterReplayPolicy::kR2;
  if (mode == "R3") return RouterReplayPolicy::kR3;
  HF_FAIL(key, ": expected disabled | R2 | R3 (verl's router replay modes), got '", mode, "'");
}

ExpertRouting routing_of(const torch::Tensor& routed_experts) {
  HF_CHECK(routed_experts.dim() == 4, "router replay: routed_experts must be [batch, seq, moe_layers, k], got ",
           routed_experts.sizes());
  ExpertRouting routing;
  for (int64_t l = 0; l < routed_experts.size(2); ++l) routing.layers.push_back(routed_experts.select(2, l));
  return routing;
}

torch::Tensor expert_token_counts(const torch::Tensor& routed_experts, const torch::Tensor& attention_mask,
                                  int64_t num_experts) {
  const int64_t rows = routed_experts.size(0), layers = routed_experts.size(2), k = routed_experts.size(3);
  const auto valid = recorded_tokens(routed_experts, attention_mask).to(torch::kFloat32);  // [b, L]
  // [b, layers, L * k]: each (token, slot)'s expert, weighted by whether the token counts.
  const auto ids = routed_experts.clamp_min(0).to(torch::kInt64).permute({0, 2, 1, 3}).reshape({rows, layers, -1});
  const auto weight =
      valid.unsqueeze(1).unsqueeze(-1).expand({rows, layers, valid.size(1), k}).reshape({rows, layers, -1});
  return torch::zeros({rows, layers, num_experts}, weight.options()).scatter_add_(2, ids, weight);
}

RouterReplayPass::RouterReplayPass(CausalLM& model, RouterReplayPolicy policy, const DataProto& batch)
    : model_(model), policy_(model->config().num_moe_layers() > 0 ? policy : RouterReplayPolicy::kDisabled) {
  if (!active()) return;
  HF_CHECK(!model->pipeline_stage().enabled(), "router_replay.mode: router replay needs the whole model in one ",
           "stage (actor pipeline_model_parallel_size = 1)");
  HF_CHECK(policy_ != RouterReplayPolicy::kR3 || batch.has_tensor("routed_experts"),
           "router_replay.mode R3 replays the rollout's routing, but the batch has no tensor routed_experts (the ",
           "rollout records it when the actor's router_replay.mode is R3)");
  const ModelConfig& c = model->config();
  const auto& mask = batch.tensor("attention_mask");
  const int64_t rows = mask.size(0);
  prompt_width_ = batch.has_tensor("prompts") ? batch.tensor("prompts").size(1) : 0;
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(mask.device());
  expert_tokens_ = torch::zeros({rows, c.num_moe_layers(), c.moe.num_experts}, f32);
  if (policy_ == RouterReplayPolicy::kR3) {
    changed_ = torch::zeros({rows}, f32);
    recorded_ = torch::zeros({rows}, f32);
  } else {
    routed_ = torch::full({rows, mask.size(1), c.num_moe_layers(), c.moe.num_experts_per_tok}, -1,
                          f32.dtype(kRoutedExpertsDtype));
  }
}

RouterReplayPass::~RouterReplayPass() {
  if (active()) model_->set_router_replay(RouterReplayMode::kOff);
}

DataProto RouterReplayPass::with_row_index(const DataProto& batch) const {
  DataProto out = batch;
  if (active())
    out.set_tensor(kRowIndexKey, torch::arange(batch.batch_size(), torch::TensorOptions().dtype(torch::kInt64)));
  return out;
}

void RouterReplayPass::begin(const DataProto& micro) {
  if (policy_ == RouterReplayPolicy::kR3)
    model_->set_router_replay(RouterReplayMode::kReplay, routing_of(micro.tensor("routed_experts")));
  else if (policy_ == RouterReplayPolicy::kR2)
    model_->set_router_replay(RouterReplayMode::kRecord);
}

void RouterReplayPass::end(const DataProto& micro) {
  if (!active()) return;
  const auto rows = micro.tensor(kRowIndexKey).to(expert_tokens_.device());
  const auto& mask = micro.tensor("attention_mask");
  torch::Tensor used;  // the routing this forward ran with, [b, L', layers, k]
  if (policy_ == RouterReplayPolicy::kR3) {
    used = micro.tensor("routed_experts");
    const auto recorded = recorded_tokens(used, mask);
    const auto changed = model_->replay_differs().to(recorded.device()).logical_and(recorded);
    changed_.index_copy_(0, rows, changed.sum(1).to(torch::kFloat32).to(changed_.device()));
    recorded_.index_copy_(0, rows, recorded.sum(1).to(torch::kFloat32).to(recorded_.device()));
  } else {
    used = torch::stack(model_->recorded_routing().layers, 2);
    used = used.masked_fill(mask.to(used.device()).eq(0).unsqueeze(-1).unsqueeze(-1), -1);
    // A micro-batch formed by token count is trimmed to its columns [start, start + L') of the batch.
    const int64_t start = micro.has_tensor("prompts") ? prompt_width_ - micro.tensor("prompts").size(1) : 0;
    auto block = routed_.index_select(0, rows);
    block.narrow(1, start, used.size(1)).copy_(used);
    routed_.index_copy_(0, rows, block);
  }
  expert_tokens_.index_copy_(
      0, rows, expert_token_counts(used, mask, expert_tokens_.size(2)).to(expert_tokens_.device()));
  model_->set_router_replay(RouterReplayMode::kOff);
}

void RouterReplayPass::write(DataProto& out) const {
  if (!active()) return;
  out.set_tensor("expert_tokens", expert_tokens_);
  if (policy_ == RouterReplayPolicy::kR3) {
    out.set_tensor("routing_changed", changed_);
    out.set_tensor("routing_recorded", recorded_);
  } else {
    out.set_tensor("routed_experts", routed_);
  }
}

std::map<std::string, double> take_routing_metrics(DataProto& batch) {
  std::map<std::string, double> metrics;
  if (batch.has_tensor("expert_tokens")) {
    const auto per_layer = batch.tensor("expert_tokens").to(torch::kCPU, torch::kFloat64).sum(0);  // [layers, E]
    const auto mean = per_layer.mean(1);
    const auto ratio = torch::where(mean.gt(0), per_layer.amax(1) / mean.clamp_min(1e-12), torch::ones_like(mean));
    metrics["actor/moe_expert_load_max_over_mean"] = ratio.mean().item<double>();
    metrics["actor/moe_expert_load_max_over_mean_worst_layer"] = ratio.max().item<double>();
    batch.erase_tensor("expert_tokens");
  }
  if (batch.has_tensor("routing_changed")) {
    const double recorded = batch.tensor("routing_recorded").sum().item<double>();
    metrics["actor/router_replay_rollout_routing_differs"] =
        recorded > 0 ? batch.tensor("routing_changed").sum().item<double>() / recorded : 0.0;
    batch.erase_tensor("routing_changed");
    batch.erase_tensor("routing_recorded");
  }
  return metrics;
}

}  // namespace hybridflow
