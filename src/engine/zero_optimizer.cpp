#include "hybridflow/engine/zero_optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "hybridflow/core/error.h"
#include "hybridflow/engine/fused_adamw.h"
#include "hybridflow/engine/train_engine.h"

namespace hybridflow {

struct ZeroOptimizer::Group {
  Communicator* comm = nullptr;  // the ranks partitioning it (null: this rank alone)
  std::vector<size_t> members;  // indices into params_
  int64_t numel = 0;            // unpadded
  int64_t partition = 0;        // padded numel / d
  torch::Tensor master;         // this rank's fp32 partition (what AdamW steps)
  torch::Tensor split_mask;       // 1 where the partition's element belongs to a tensor-parallel shard
  torch::Tensor replicated_mask;  // 1 where it belongs to a replicated parameter that this stage counts

  int ranks() const { return comm == nullptr ? 1 : comm->size(); }
  int64_t begin() const { return comm == nullptr ? 0 : comm->rank() * partition; }
  // This rank's partition of the sum of the ranks' padded flat buffers.
  torch::Tensor reduce_scatter(const torch::Tensor& flat) const {
    return comm == nullptr ? flat : comm->reduce_scatter(flat);
  }
  torch::Tensor all_gather(const torch::Tensor& mine) const {
    return comm == nullptr ? mine : comm->all_gather_cat(mine, 0);
  }
};

namespace {

// The members' tensors (or zeros where undefined) flattened into one fp32 buffer padded to d partitions.
torch::Tensor flat_padded(const std::vector<torch::Tensor>& parts, int64_t padded, const torch::TensorOptions& fp32) {
  std::vector<torch::Tensor> flat;
  int64_t n = 0;
  for (const auto& p : parts) {
    flat.push_back(p.reshape({-1}).to(torch::kFloat));
    n += p.numel();
  }
  if (padded > n) flat.push_back(torch::zeros({padded - n}, fp32));
  return torch::cat(flat);
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(std::vector<torch::Tensor> params, const std::vector<bool>& decay,
                             const std::vector<bool>& split, const OptimizerOptions& options, Communicator& dp,
                             TensorParallelGroup tp, std::vector<bool> counted, Communicator* stages,
                             std::vector<bool> expert, Communicator* expert_dp)
    : params_(std::move(params)), dp_(dp), tp_(tp), stages_(stages) {
  if (counted.empty()) counted.assign(params_.size(), true);
  if (expert.empty()) expert.assign(params_.size(), false);
  HF_CHECK(decay.size() == params_.size() && split.size() == params_.size() && counted.size() == params_.size() &&
               expert.size() == params_.size(),
           "ZeroOptimizer: ", params_.size(), " parameters but ", decay.size(), " decay flags, ", split.size(),
           " split flags, ", counted.size(), " counted flags and ", expert.size(), " expert flags");
  torch::NoGradGuard no_grad;
  const auto fp32 = torch::TensorOptions().dtype(torch::kFloat).device(params_.front().device());
  std::vector<torch::optim::OptimizerParamGroup> adam_groups;
  // The replicated parameters' groups first: without experts the layout is the one of plain ZeRO.
  const std::pair<bool, bool> kinds[] = {{false, true}, {false, false}, {true, true}, {true, false}};
  for (const auto& [experts, decayed] : kinds) {
    auto group = std::make_unique<Group>();
    group->comm = experts ? expert_dp : &dp_;
    std::vector<torch::Tensor> values, split_masks, replicated_masks;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (decay[i] != decayed || expert[i] != experts) continue;
      group->members.push_back(i);
      group->numel += params_[i].numel();
      values.push_back(params_[i].detach());
      split_masks.push_back(torch::full({params_[i].numel()}, split[i] ? 1.0 : 0.0, fp32));
      replicated_masks.push_back(torch::full({params_[i].numel()}, !split[i] && counted[i] ? 1.0 : 0.0, fp32));
    }
    if (group->members.empty()) continue;
    const int d = group->ranks();
    group->partition = (group->numel + d - 1) / d;
    const int64_t padded = group->partition * d;
    const int64_t begin = group->begin();
    group->master = flat_padded(values, padded, fp32).narrow(0, begin, group->partition).clone();
    group->master.set_requires_grad(true);
    group->split_mask = flat_padded(split_masks, padded, fp32).narrow(0, begin, group->partition).clone();
    group->replicated_mask = flat_padded(replicated_masks, padded, fp32).narrow(0, begin, group->partition).clone();
    auto adam = torch::optim::AdamWOptions(options.schedule.lr)
                    .betas({options.beta1, options.beta2})
                    .eps(options.eps)
                    .weight_decay(decayed ? options.weight_decay : 0.0);
    adam_groups.emplace_back(std::vector<torch::Tensor>{group->master},
                             std::make_unique<torch::optim::AdamWOptions>(adam));
    groups_.push_back(std::move(group));
  }
  adam_ = std::make_unique<torch::optim::AdamW>(adam_groups, torch::optim::AdamWOptions(options.schedule.lr));
}

ZeroOptimizer::~ZeroOptimizer() = default;

double ZeroOptimizer::step(double lr, double max_norm, double local_norm, bool mean, double& units,
                           double& loss_sum) {
  torch::NoGradGuard no_grad;
  const auto fp32 = torch::TensorOptions().dtype(torch::kFloat).device(params_.front().device());
  std::vector<torch::Tensor> shards;
  for (auto& group : groups_) {
    std::vector<torch::Tensor> grads;
    for (size_t i : group->members) {
      const auto& g = params_[i].grad();
      grads.push_back(g.defined() ? g * local_norm : torch::zeros({params_[i].numel()}, fp32));
    }
    shards.push_back(group->reduce_scatter(flat_padded(grads, group->partition * group->ranks(), fp32)));
  }
  auto totals = torch::tensor({units, loss_sum}, torch::TensorOptions().dtype(torch::kDouble).device(fp32.device()));
  dp_.all_reduce(totals);
  units = totals[0].item<double>();
  loss_sum = totals[1].item<double>();
  HF_CHECK(units > 0, "train_step: no data-parallel rank's mini-batch has any tokens");
  const double norm = mean ? units : 1.0;

  // Squared norms of the tensor-parallel-split and replicated parts: the partitions cover every element
  // once over dp (an expert's once over the ranks owning it, which hold no other rank's experts); split
  // elements are summed over tp as well, and every stage's over the stages.
  auto squares = torch::zeros({2}, totals.options());
  for (size_t g = 0; g < shards.size(); ++g) {
    shards[g].div_(norm);
    auto sq = shards[g].to(torch::kDouble).pow(2);
    squares[0] += (sq * groups_[g]->split_mask.to(torch::kDouble)).sum();
    squares[1] += (sq * groups_[g]->replicated_mask.to(torch::kDouble)).sum();
  }
  dp_.all_reduce(squares);
  auto split_part = squares.narrow(0, 0, 1).clone();
  if (tp_.enabled()) tp_.comm()->all_reduce(split_part);
  auto stage_total = (split_part + squares.narrow(0, 1, 1)).contiguous();
  if (stages_ != nullptr) stages_->all_reduce(stage_total);
  const double total = std::sqrt(stage_total.item<double>());
  if (!std::isfinite(total)) return total;
  const double coef = max_norm > 0 ? max_norm / (total + 1e-6) : std::numeric_limits<double>::infinity();
  for (size_t g = 0; g < shards.size(); ++g) {
    if (coef < 1.0) shards[g].mul_(coef);
    groups_[g]->master.mutable_grad() = shards[g];
  }
  for (auto& group : adam_->param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  fused_adamw_step(*adam_);
  for (auto& group : groups_) {
    auto flat = group->all_gather(group->master.detach());
    int64_t offset = 0;
    for (size_t i : group->members) {
      auto& p = params_[i];
      p.copy_(flat.narrow(0, offset, p.numel()).view(p.sizes()));
      offset += p.numel();
    }
  }
  return total;
}

std::vector<ZeroOptimizer::Moments> ZeroOptimizer::gather_moments() const {
  torch::NoGradGuard no_grad;
  std::vector<Moments> out(params_.size());
  for (const auto& group : groups_) {
    auto it = adam_->state().find(group->master.unsafeGetTensorImpl());
    if (it == adam_->state().end()) continue;  // no step yet: the same on every rank
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
    const torch::Tensor exp_avg = group->all_gather(s.exp_avg().contiguous());
    const torch::Tensor exp_avg_sq = group->all_gather(s.exp_avg_sq().contiguous());
    int64_t offset = 0;
    for (size_t i : group->members) {
      const int64_t n = params_[i].numel();
      out[i].exp_avg = exp_avg.narrow(0, offset, n).view(params_[i].sizes()).clone();
      out[i].exp_avg_sq = exp_avg_sq.narrow(0, offset, n).view(params_[i].sizes()).clone();
      out[i].step = s.step();
      offset += n;
    }
  }
  return out;
}

void ZeroOptimizer::set_moments(const std::vector<Moments>& moments) {
  HF_CHECK(moments.size() == params_.size(), "ZeroOptimizer::set_moments: ", moments.size(), " parameters' moments for ",
           params_.size(), " parameters");
  torch::NoGradGuard no_grad;
  const auto fp32 = torch::TensorOptions().dtype(torch::kFloat).device(params_.front().device());
  for (auto& group : groups_) {
    const int64_t padded = group->partition * group->ranks();
    const int64_t begin = group->begin();
    auto partition_of = [&](auto&& part) {
      std::vector<torch::Tensor> parts;
      for (size_t i : group->members) parts.push_back(part(i));
      return flat_padded(parts, padded, fp32).narrow(0, begin, group->partition).clone();
    };
    group->master.copy_(partition_of([&](size_t i) { return params_[i].detach(); }));
    int64_t step = 0;
    for (size_t i : group->members) step = std::max(step, moments[i].step);
    adam_->state().erase(group->master.unsafeGetTensorImpl());
    if (step == 0) continue;
    auto moment = [&](size_t i, bool squared) {
      const torch::Tensor& t = squared ? moments[i].exp_avg_sq : moments[i].exp_avg;
      if (!t.defined()) return torch::zeros({params_[i].numel()}, fp32);
      HF_CHECK(t.numel() == params_[i].numel(), "ZeroOptimizer::set_moments: parameter ", i, " has ",
               params_[i].numel(), " elements but its moments ", t.numel());
      return t.to(fp32.device(), torch::kFloat);
    };
    auto state = std::make_unique<torch::optim::AdamWParamState>();
    state->step(step);
    state->exp_avg(partition_of([&](size_t i) { return moment(i, false); }));
    state->exp_avg_sq(partition_of([&](size_t i) { return moment(i, true); }));
    adam_->state()[group->master.unsafeGetTensorImpl()] = std::move(state);
  }
}

int64_t ZeroOptimizer::partition_numel() const {
  int64_t n = 0;
  for (const auto& g : groups_) n += g->partition;
  return n;
}

int64_t ZeroOptimizer::state_numel() const {
  int64_t n = 0;
  for (const auto& group : adam_->param_groups())
    for (const auto& p : group.params()) {
      auto it = adam_->state().find(p.unsafeGetTensorImpl());
      if (it == adam_->state().end()) continue;
      const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
      n += s.exp_avg().numel() + s.exp_avg_sq().numel();
    }
  return n + partition_numel();
}

}  // namespace hybridflow
