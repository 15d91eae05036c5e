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

RouterReplayPass::RouterReplayPass(CausalLM& model, RouterReplayPolicy policy, const DataProto& batch,
                                   PipelineStageRunner* pipeline)
    : model_(model), policy_(model->config().num_moe_layers() > 0 ? policy : RouterReplayPolicy::kDisabled) {
  if (!active()) return;
  const PipelineStage& stage = model->pipeline_stage();
  HF_CHECK(!stage.enabled() || pipeline != nullptr, "router_replay.mode: the model is pipeline stage ", stage.stage,
           " of ", stage.stages, " and the pass needs the runner over its stages");
  HF_CHECK(policy_ != RouterReplayPolicy::kR3 || batch.has_tensor("routed_experts"),
           "router_replay.mode R3 replays the rollout's routing, but the batch has no tensor routed_experts (the ",
           "rollout records it when the actor's router_replay.mode is R3)");
  const ModelConfig& c = model->config();
  const auto& mask = batch.tensor("attention_mask");
  const int64_t rows = mask.size(0);
  moe_ = model->stage_moe_layers();
  prompt_width_ = batch.has_tensor("prompts") ? batch.tensor("prompts").size(1) : 0;
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(mask.device());
  expert_tokens_ = torch::zeros({rows, c.num_moe_layers(), c.moe.num_experts}, f32);
  if (policy_ == RouterReplayPolicy::kR3) {
    changed_ = torch::zeros({rows, mask.size(1)}, f32);
    recorded_ = torch::zeros({rows}, f32);
  } else {
    routed_ = torch::full({rows, mask.size(1), c.num_moe_layers(), c.moe.num_experts_per_tok}, -1,
                          f32.dtype(kRoutedExpertsDtype));
  }
  if (stage.enabled()) {
    pipeline_ = pipeline;
    pipeline_->set_micro_batch_hooks([this](const DataProto& micro) { begin(micro); },
                                     [this](const DataProto& micro) { end(micro); });
  }
}

RouterReplayPass::~RouterReplayPass() {
  if (!active()) return;
  model_->set_router_replay(RouterReplayMode::kOff);
  if (pipeline_ != nullptr) pipeline_->set_micro_batch_hooks(nullptr, nullptr);
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
  // A micro-batch formed by token count is trimmed to its columns [start, start + L') of the batch.
  const int64_t start = micro.has_tensor("prompts") ? prompt_width_ - micro.tensor("prompts").size(1) : 0;
  // Copies `part` into rows `rows`, columns [start, ...) and (dim 2 given) this stage's MoE layers of `whole`.
  auto place = [&](torch::Tensor& whole, const torch::Tensor& part, bool stage_layers) {
    auto block = whole.index_select(0, rows);
    auto target = block.narrow(1, start, part.size(1));
    if (stage_layers) target = target.narrow(2, moe_.start, moe_.length);
    target.copy_(part);
    whole.index_copy_(0, rows, block);
  };
  if (policy_ == RouterReplayPolicy::kR3) {
    const auto& used = micro.tensor("routed_experts");  // every layer's, on every stage
    const auto recorded = recorded_tokens(used, mask);
    const auto changed = model_->replay_differs().to(recorded.device()).logical_and(recorded);
    place(changed_, changed.to(torch::kFloat32).to(changed_.device()), false);
    recorded_.index_copy_(0, rows, recorded.sum(1).to(torch::kFloat32).to(recorded_.device()));
    expert_tokens_.index_copy_(
        0, rows, expert_token_counts(used, mask, expert_tokens_.size(2)).to(expert_tokens_.device()));
  } else if (moe_.length > 0) {
    // The routing this forward ran with in this stage's layers, [b, L', layers, k].
    auto used = torch::stack(model_->recorded_routing().layers, 2);
    used = used.masked_fill(mask.to(used.device()).eq(0).unsqueeze(-1).unsqueeze(-1), -1);
    place(routed_, used.to(routed_.device()), true);
    auto tokens = expert_tokens_.index_select(0, rows);
    tokens.narrow(1, moe_.start, moe_.length)
        .copy_(expert_token_counts(used, mask, expert_tokens_.size(2)).to(tokens.device()));
    expert_tokens_.index_copy_(0, rows, tokens);
  }
  model_->set_router_replay(RouterReplayMode::kOff);
}

void RouterReplayPass::write(DataProto& out) {
  if (!active()) return;
  if (pipeline_ != nullptr) {
    // Each stage filled its own layers (R2: the routing and its token counts, -1 and 0 elsewhere) or the tokens
    // its layers would route otherwise (R3): every stage's, on every stage, on the model's device.
    Communicator& stages = pipeline_->stages();
    const torch::Device device = model_->parameters().front().device();
    auto combine = [&](torch::Tensor& t, ReduceOp op) {
      auto on_device = t.to(device, torch::kFloat32);
      stages.all_reduce(on_device, op);
      t = on_device.to(t.device(), t.scalar_type());
    };
    if (policy_ == RouterReplayPolicy::kR3) {
      combine(changed_, ReduceOp::kMax);
    } else {
      combine(routed_, ReduceOp::kMax);
      combine(expert_tokens_, ReduceOp::kSum);
    }
  }
  out.set_tensor("expert_tokens", expert_tokens_);
  if (policy_ == RouterReplayPolicy::kR3) {
    out.set_tensor("routing_changed", changed_.sum(1));
    out.set_tensor("routing_recorded", recorded_);
  } else {
    out.set_tensor("routed_experts", routed_);
  }
}

StagedRouterReplay::StagedRouterReplay(PipelineStageRunner* pipeline, CausalLM& model) : pipeline_(pipeline) {
  if (pipeline_ == nullptr) return;
  pipeline_->set_micro_batch_hooks(
      [&model](const DataProto& micro) {
        model->set_router_replay(RouterReplayMode::kReplay, routing_of(micro.tensor("routed_experts")));
      },
      [&model](const DataProto&) { model->set_router_replay(RouterReplayMode::kOff); });
}

StagedRouterReplay::~StagedRouterReplay() {
  if (pipeline_ != nullptr) pipeline_->set_micro_batch_hooks(nullptr, nullptr);
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
