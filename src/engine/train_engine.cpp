#include "hybridflow/engine/train_engine.h"

#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/record_function.h>

#include <cmath>
#include <sstream>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/core/logging.h"
#include "hybridflow/engine/fused_adamw.h"
#include "hybridflow/engine/pipeline.h"
#include "hybridflow/engine/zero_optimizer.h"
#include "hybridflow/model/transformer.h"
#include "hybridflow/parallel/pipeline_parallel.h"

namespace hybridflow {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

torch::optim::AdamWOptions adamw_options(const OptimizerOptions& o, double weight_decay) {
  return torch::optim::AdamWOptions(o.schedule.lr)
      .betas({o.beta1, o.beta2})
      .eps(o.eps)
      .weight_decay(weight_decay);
}

// Mixture of experts: while a model whose config weighs the load-balancing loss (router_aux_loss_coef > 0)
// trains, it keeps its router logits, and each micro-batch's loss gains the coefficient times that loss of its
// last forward, as transformers adds it to the language-model loss. Not under pipeline parallelism (a stage
// sees only its layers' routers).
class MoeAuxLoss {
 public:
  explicit MoeAuxLoss(torch::nn::Module& module) : model_(dynamic_cast<CausalLMImpl*>(&module)) {
    if (model_ != nullptr && (model_->config().num_moe_layers() == 0 || model_->config().moe.router_aux_loss_coef <= 0 ||
                              model_->pipeline_stage().enabled()))
      model_ = nullptr;
    if (model_ != nullptr) model_->set_keep_router_logits(true);
  }
  ~MoeAuxLoss() {
    if (model_ != nullptr) model_->set_keep_router_logits(false);
  }
  MoeAuxLoss(const MoeAuxLoss&) = delete;
  MoeAuxLoss& operator=(const MoeAuxLoss&) = delete;
  torch::Tensor add_to(const torch::Tensor& loss, double weight, StepStats& stats) {
    if (model_ == nullptr || !model_->has_router_logits()) return loss;
    torch::Tensor aux = model_->load_balancing_loss();
    model_->set_keep_router_logits(true);  // drops this forward's logits and their graph
    stats.moe_aux_loss += aux.item<double>() * weight;
    stats.has_moe_aux_loss = true;
    return loss + model_->config().moe.router_aux_loss_coef * aux.to(loss.scalar_type());
  }

 private:
  CausalLMImpl* model_;
};

torch::Tensor scalar_loss(const MicroLossFn& loss_fn, const DataProto& micro) {
  torch::Tensor loss = loss_fn(micro);
  HF_CHECK(loss.defined() && loss.numel() == 1, "train_step: the loss function must return a scalar, got ",
           loss.defined() ? loss.sizes() : torch::IntArrayRef{});
  return loss;
}

}  // namespace

void set_adam_betas(OptimizerOptions& options, const std::vector<double>& betas, const std::string& key) {
  HF_CHECK(betas.size() == 2, key, ": expected [beta1, beta2], got ", betas.size(), " value(s)");
  for (double b : betas)
    HF_CHECK(b >= 0 && b < 1, key, ": each beta must be in [0, 1), got [", betas[0], ", ", betas[1], "]");
  options.beta1 = betas[0];
  options.beta2 = betas[1];
}

bool excluded_from_weight_decay(const std::string& name, const torch::Tensor& param) {
  return param.dim() < 2 || ends_with(name, "bias") || name.find("norm") != std::string::npos;
}

TrainEngine::TrainEngine(std::shared_ptr<torch::nn::Module> module, OptimizerOptions options)
    : module_(std::move(module)), options_(std::move(options)) {
  HF_CHECK(module_ != nullptr, "TrainEngine: module is null");
  lr_at_step(options_.schedule, 0);  // validates the schedule before any training
  std::vector<torch::Tensor> decay, no_decay;
  bool low_precision = false;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (item.value().requires_grad()) low_precision |= item.value().scalar_type() != torch::kFloat;
  }
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    params_.push_back(item.value());
    names_.push_back(item.key());
    split_.push_back(false);
    expert_.push_back(false);
    torch::Tensor optimized = item.value();
    if (low_precision) {
      optimized = item.value().detach().to(torch::kFloat).clone().set_requires_grad(true);
      masters_.push_back(optimized);
    }
    (excluded_from_weight_decay(item.key(), item.value()) ? no_decay : decay).push_back(optimized);
  }
  HF_CHECK(!params_.empty(), "TrainEngine: the module has no trainable parameters");
  std::vector<torch::optim::OptimizerParamGroup> groups;
  // Both groups always exist (possibly empty) so that saved states line up across runs.
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                 adamw_options(options_, options_.weight_decay)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(adamw_options(options_, 0.0)));
  optimizer_ = std::make_unique<torch::optim::AdamW>(groups, adamw_options(options_, options_.weight_decay));
}

TrainEngine::~TrainEngine() = default;

void TrainEngine::set_sharded_optimizer(Communicator& dp) {
  HF_CHECK(step_ == 0, "set_sharded_optimizer: the engine has already taken ", step_, " steps");
  HF_CHECK(!reducer_, "set_sharded_optimizer: a gradient reducer is set; ZeRO reduces the gradients itself");
  zero_dp_ = &dp;
  make_sharded_optimizer();
}

void TrainEngine::make_sharded_optimizer() {
  std::vector<bool> decay, counted;
  for (size_t i = 0; i < names_.size(); ++i) {
    decay.push_back(!excluded_from_weight_decay(names_[i], params_[i]));
    counted.push_back(!pipeline_ || !pipeline_->is_tied_copy(names_[i]));
  }
  zero_ = std::make_unique<ZeroOptimizer>(optimized(), decay, split_, options_, *zero_dp_, tp_, counted,
                                          pipeline_ ? &pipeline_->stages() : nullptr, expert_, expert_dp_);
}

int64_t TrainEngine::optimizer_state_numel() const {
  int64_t n = 0;
  // Mixed precision keeps whole fp32 masters beside ZeRO's partition (the module's copy-back reads them).
  for (const auto& m : masters_) n += m.numel();
  if (zero_) return n + zero_->state_numel();
  for (const auto& [key, state] : optimizer_->state()) {
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*state);
    n += s.exp_avg().numel() + s.exp_avg_sq().numel();
  }
  return n;
}

void TrainEngine::sharded_step(double local_norm, bool mean, StepStats& stats) {
  double units = static_cast<double>(stats.tokens), loss_sum = stats.loss * local_norm;
  stats.grad_norm = zero_->step(lr_for_next_step(), options_.grad_clip, local_norm, mean, units,
                                loss_sum);
  stats.tokens = static_cast<int64_t>(std::llround(units));
  stats.loss = loss_sum / (mean ? units : 1.0);
  if (!std::isfinite(stats.grad_norm)) {
    log_warn("train_step: gradient norm is ", stats.grad_norm, " at step ", step_, "; skipping the update");
    zero_grad();
    stats.skipped = true;
  } else {
    if (!masters_.empty()) {
      torch::NoGradGuard no_grad;
      at::_foreach_copy_(params_, masters_);  // one multi-tensor copy back to the weights' dtype
    }
    ++step_;
  }
  stats.step = step_;
}

void TrainEngine::move_optimizer_state(const torch::Device& device) {
  HF_CHECK(!zero_, "optimizer offload: the ZeRO optimizer (use_distributed_optimizer) keeps its own partitions; ",
           "offloading them is not supported");
  torch::NoGradGuard no_grad;
  auto move = [&](torch::Tensor& t) {
    if (t.defined() && t.device() != device) t.set_data(t.to(device));
  };
  for (auto& master : masters_) {
    move(master);
    if (master.grad().defined()) master.mutable_grad() = master.grad().to(device);
  }
  for (auto& entry : optimizer_->state()) {
    auto& adam = static_cast<torch::optim::AdamWParamState&>(*entry.second);
    torch::Tensor avg = adam.exp_avg(), avg_sq = adam.exp_avg_sq();
    if (avg.defined() && avg.device() != device) adam.exp_avg(avg.to(device));
    if (avg_sq.defined() && avg_sq.device() != device) adam.exp_avg_sq(avg_sq.to(device));
    torch::Tensor max_sq = adam.max_exp_avg_sq();
    if (max_sq.defined() && max_sq.device() != device) adam.max_exp_avg_sq(max_sq.to(device));
  }
}

void TrainEngine::zero_grad() {
  for (auto* group : {&params_, &masters_}) {
    for (auto& p : *group) {
      if (p.grad().defined()) {
        p.grad().detach_();
        p.grad().zero_();
      }
    }
  }
}

void TrainEngine::release_grads() {
  for (auto* group : {&params_, &masters_})
    for (auto& p : *group) p.mutable_grad() = torch::Tensor();
}

void TrainEngine::give_back_zero_grads() {
  std::vector<torch::Tensor>& tensors = optimized();
  had_grad_.resize(tensors.size(), false);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].grad().defined())
      had_grad_[i] = true;
    else if (had_grad_[i])
      tensors[i].mutable_grad() = torch::zeros_like(tensors[i]);
  }
}

void TrainEngine::accumulate_into_masters() {
  if (masters_.empty()) return;
  torch::NoGradGuard no_grad;
  // Multi-tensor copies: on a GPU the first micro-batch's conversions are a few launches instead of one per
  // parameter. Later micro-batches add with one mixed-dtype kernel a parameter (the float32 sum of the same
  // values as adding a converted copy).
  std::vector<torch::Tensor> fresh, fresh_from, summed, summed_from;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& g = params_[i].mutable_grad();
    if (!g.defined()) continue;
    auto& master_grad = masters_[i].mutable_grad();
    if (master_grad.defined()) {
      summed.push_back(master_grad);
      summed_from.push_back(g);
    } else {
      master_grad = torch::empty(g.sizes(), g.options().dtype(torch::kFloat));
      fresh.push_back(master_grad);
      fresh_from.push_back(g);
    }
    g = torch::Tensor();  // undefined, so the next call adds nothing twice (the lists keep it alive)
  }
  if (!fresh.empty()) at::_foreach_copy_(fresh, fresh_from);
  for (size_t i = 0; i < summed.size(); ++i) summed[i].add_(summed_from[i]);
}

void TrainEngine::set_tensor_parallel(const TensorParallelGroup& tp,
                                      const std::function<bool(const std::string&)>& is_split) {
  tp_ = tp;
  for (size_t i = 0; i < names_.size(); ++i) split_[i] = tp.enabled() && is_split(names_[i]);
}

void TrainEngine::set_expert_parallel(const ExpertParallelGroup& ep, Communicator* expert_data_parallel,
                                      const std::function<bool(const std::string&)>& is_expert) {
  if (!ep.enabled()) return;
  HF_CHECK(!(zero_ && pipeline_), "expert_model_parallel_size ", ep.size(), ": expert parallelism is not combined ",
           "with pipeline stages and the distributed optimizer (use_distributed_optimizer) together yet");
  HF_CHECK(data_parallel(), "set_expert_parallel: set the data-parallel gradient reducer or the sharded optimizer ",
                            "first (the expert-parallel ranks are data-parallel ranks)");
  HF_CHECK(step_ == 0, "set_expert_parallel: the engine has already taken ", step_, " steps");
  ep_ = ep;
  expert_dp_ = expert_data_parallel;
  for (size_t i = 0; i < names_.size(); ++i) expert_[i] = is_expert(names_[i]);
  // No step yet, so no state to keep: the experts move to partitions of their own.
  if (zero_) make_sharded_optimizer();
}

void TrainEngine::set_pipeline(std::shared_ptr<PipelineStageRunner> pipeline) {
  HF_CHECK(!zero_, "set_pipeline: call it before set_sharded_optimizer (the ZeRO optimizer's gradient norm spans "
                   "the stages)");
  HF_CHECK(step_ == 0, "set_pipeline: the engine has already taken ", step_, " steps");
  pipeline_ = std::move(pipeline);
}

double TrainEngine::model_parallel_norm(const std::vector<torch::Tensor>& with_grad, const std::vector<bool>& split,
                                        const std::vector<bool>& expert, const std::vector<bool>& counted) const {
  torch::NoGradGuard no_grad;
  // [split squares, replicated squares, expert squares] in float64, so the sum over ranks does not depend on
  // their order.
  auto squares = torch::zeros({3}, torch::TensorOptions().dtype(torch::kDouble).device(params_.front().device()));
  for (size_t i = 0; i < with_grad.size(); ++i)
    if (counted[i]) squares[split[i] ? 0 : expert[i] ? 2 : 1] += with_grad[i].grad().to(torch::kDouble).pow(2).sum();
  auto split_part = squares.narrow(0, 0, 1).clone();
  if (tp_.enabled()) tp_.comm()->all_reduce(split_part, ReduceOp::kSum);
  // The expert-parallel ranks hold different experts: their squares add up.
  auto expert_part = squares.narrow(0, 2, 1).clone();
  if (ep_.enabled()) ep_.comm()->all_reduce(expert_part, ReduceOp::kSum);
  // Stages hold different parameters: their squares add up.
  auto total = (split_part + squares.narrow(0, 1, 1) + expert_part).contiguous();
  if (pipeline_) pipeline_->stages().all_reduce(total, ReduceOp::kSum);
  return std::sqrt(total.item<double>());
}

double TrainEngine::clip_grad_norm() {
  accumulate_into_masters();
  std::vector<torch::Tensor> with_grad;
  std::vector<bool> split, expert, counted;
  for (size_t i = 0; i < optimized().size(); ++i) {
    if (!optimized()[i].grad().defined()) continue;
    with_grad.push_back(optimized()[i]);
    split.push_back(split_[i]);
    expert.push_back(expert_[i]);
    counted.push_back(!pipeline_ || !pipeline_->is_tied_copy(names_[i]));
  }
  const double max_norm = options_.grad_clip > 0 ? options_.grad_clip : std::numeric_limits<double>::infinity();
  pending_grad_scale_ = 1;
  if (!tp_.enabled() && !pipeline_ && !ep_.enabled()) {
    if (with_grad.empty()) return 0.0;
    return clip_factor_for_next_step(with_grad, max_norm);
  }
  // Every rank of the groups joins the norm's all-reduces, even one whose parameters got no gradient.
  const double norm = model_parallel_norm(with_grad, split, expert, counted);
  // The same factor as torch::nn::utils::clip_grad_norm_ (max_norm / (norm + 1e-6), applied when < 1).
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) {
    torch::NoGradGuard no_grad;
    for (auto& p : with_grad) p.mutable_grad().mul_(coef);
  }
  return norm;
}

double TrainEngine::clip_factor_for_next_step(const std::vector<torch::Tensor>& with_grad, double max_norm) {
  torch::NoGradGuard no_grad;
  // torch::nn::utils::clip_grad_norm_'s norm and clamped factor, the same tensor operations, so the same
  // float; its grad.mul_(factor) happens in fused_adamw_step's pass instead of one of its own.
  // One multi-tensor norm, as PyTorch's clip_grad_norm_(foreach=True) takes: on a GPU a few launches instead of
  // one per parameter (~310 at Qwen3's shapes); on a CPU the same per-tensor norms.
  std::vector<torch::Tensor> grads;
  grads.reserve(with_grad.size());
  for (const auto& p : with_grad) grads.push_back(p.grad());
  const std::vector<torch::Tensor> norms = at::_foreach_norm(grads, 2.0);
  const torch::Tensor total = norms.size() == 1 ? norms[0] : torch::stack(norms).norm(2.0);
  const torch::Tensor factor = torch::clamp(max_norm / (total + 1e-6), std::nullopt, 1.0);
  pending_grad_scale_ = factor.item<float>();
  return total.item<double>();
}

void TrainEngine::pipelined_backward(const std::vector<DataProto>& micro_batches, const std::vector<double>& weights,
                                     const MicroLossFn& loss_fn, StepStats& stats) {
  std::vector<StagePass> in_flight(micro_batches.size());
  double loss_sum = 0;
  const auto schedule =
      one_forward_one_backward(pipeline_->stage(), static_cast<int64_t>(micro_batches.size()));
  for (const PipelineOp& op : schedule) {
    const auto i = static_cast<size_t>(op.micro_batch);
    if (op.kind == PipelineOp::kForward) {
      in_flight[i] = pipeline_->forward(micro_batches[i], /*training=*/true, [&](const DataProto& m) {
        torch::Tensor loss = scalar_loss(loss_fn, m);
        loss_sum += loss.item<double>() * weights[i];
        return loss * weights[i];
      });
    } else {
      pipeline_->backward(in_flight[i]);
      in_flight[i] = StagePass{};  // frees the micro-batch's activations
      accumulate_into_masters();
    }
  }
  pipeline_->wait_sends();
  // Only the last stage computed the loss; every stage reports it.
  auto loss = torch::tensor({loss_sum}, torch::TensorOptions().dtype(torch::kDouble).device(params_.front().device()));
  pipeline_->stages().all_reduce(loss, ReduceOp::kSum);
  stats.loss = loss.item<double>();
  reduce_tied_gradients();
}

void TrainEngine::reduce_tied_gradients() {
  if (!pipeline_->has_tied_embedding()) return;
  torch::NoGradGuard no_grad;
  torch::Tensor* tied = nullptr;
  for (size_t i = 0; i < names_.size(); ++i)
    if (pipeline_->is_tied(names_[i])) tied = &optimized()[i];
  // The stages between the first and the last hold no copy and add zeros.
  torch::Tensor flat;
  if (tied != nullptr && tied->grad().defined())
    flat = tied->grad().reshape({-1}).contiguous();
  else
    flat = torch::zeros({pipeline_->tied_embedding_numel()}, optimized().front().options().requires_grad(false));
  pipeline_->stages().all_reduce(flat, ReduceOp::kSum);
  if (tied == nullptr) return;
  if (tied->grad().defined())
    tied->mutable_grad().copy_(flat.view(tied->sizes()));
  else
    tied->mutable_grad() = flat.view(tied->sizes()).clone();
}

void TrainEngine::apply_step() {
  RECORD_USER_SCOPE("hf::optimizer_step");
  const double lr = lr_for_next_step();
  for (auto& group : optimizer_->param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
  fused_adamw_step(*optimizer_, pending_grad_scale_);
  pending_grad_scale_ = 1;
  if (!masters_.empty()) {
    torch::NoGradGuard no_grad;
    at::_foreach_copy_(params_, masters_);  // one multi-tensor copy back to the weights' dtype
  }
  ++step_;
}

StepStats TrainEngine::train_step(const DataProto& mini_batch, int64_t micro_batch_size, const MicroLossFn& loss_fn,
                                  const std::string& token_mask_key, LossWeighting weighting) {
  const int64_t rows = mini_batch.batch_size();
  HF_CHECK(rows > 0, "train_step: empty mini-batch");
  HF_CHECK(micro_batch_size > 0, "train_step: micro_batch_size must be > 0, got ", micro_batch_size);
  std::vector<DataProto> micro_batches;
  for (int64_t begin = 0; begin < rows; begin += micro_batch_size)
    micro_batches.push_back(mini_batch.slice(begin, std::min(rows, begin + micro_batch_size)));
  return train_step(micro_batches, loss_fn, token_mask_key, weighting);
}

StepStats TrainEngine::train_step(const std::vector<DataProto>& micro_batches, const MicroLossFn& loss_fn,
                                  const std::string& token_mask_key, LossWeighting weighting) {
  HF_CHECK(!micro_batches.empty() && micro_batches.front().batch_size() > 0, "train_step: empty mini-batch");
  const bool has_mask = micro_batches.front().has_tensor(token_mask_key);
  if (weighting == LossWeighting::kAuto) weighting = has_mask ? LossWeighting::kTokenMean : LossWeighting::kRowMean;
  HF_CHECK(weighting != LossWeighting::kTokenMean || has_mask, "train_step: token-mean weighting needs tensor '",
           token_mask_key, "' in the mini-batch");
  // Tokens decide whether a micro-batch has anything to learn from; units are what its loss averages over.
  auto tokens = [&](const DataProto& b) -> int64_t {
    return has_mask ? b.tensor(token_mask_key).sum().item<int64_t>() : b.batch_size();
  };
  // kRowMean counts the rows with a valid token: the seq-mean losses average over those only (an
  // all-padding row is in neither their sum nor their count), so that is each micro-batch's share.
  auto units = [&](const DataProto& b) -> int64_t {
    if (weighting != LossWeighting::kRowMean) return tokens(b);
    if (!has_mask) return b.batch_size();
    return b.tensor(token_mask_key).reshape({b.batch_size(), -1}).ne(0).any(1).sum().item<int64_t>();
  };
  const bool mean = weighting != LossWeighting::kSum;
  StepStats stats;
  // The mini-batch's units are its micro-batches' (they partition its rows).
  std::vector<int64_t> micro_units;
  RECORD_USER_SCOPE("hf::train_step");
  for (const DataProto& micro : micro_batches) {
    HF_CHECK(micro.has_tensor(token_mask_key) == has_mask, "train_step: micro-batches disagree on tensor '",
             token_mask_key, "'");
    micro_units.push_back(units(micro));
    stats.tokens += micro_units.back();
  }
  stats.lr = lr_for_next_step();
  // A mini-batch whose mask selects no token (rollout rejection may drop all of it) has nothing to learn
  // from: the step is skipped. A data-parallel rank may hold none while others do: decided after the reduce.
  if (stats.tokens == 0 && !data_parallel() && !zero_) {
    log_warn("train_step: the mini-batch's '", token_mask_key, "' selects no tokens; skipping the update");
    stats.empty = true;
    stats.step = step_;
    return stats;
  }
  HF_CHECK(stats.tokens > 0 || data_parallel(), "train_step: the mini-batch's '", token_mask_key,
           "' selects no tokens");
  double local_norm = mean ? static_cast<double>(stats.tokens) : 1.0;
  if (ep_.enabled()) {
    // Each expert's gradient mixes every rank's tokens: the losses are weighted by their share of the global
    // mini-batch from the start, and the reduce below sums (local_norm = norm = the global units).
    auto units = torch::tensor({static_cast<float>(stats.tokens)},
                               torch::TensorOptions().dtype(torch::kFloat).device(optimized().front().device()));
    if (zero_)
      zero_dp_->all_reduce(units, ReduceOp::kSum);
    else
      reducer_(units);
    if (mean) local_norm = units.item<double>();
    for (size_t i = 0; i < micro_batches.size(); ++i)
      HF_CHECK(tokens(micro_batches[i]) > 0, "train_step: under expert parallelism (expert_model_parallel_size ",
               ep_.size(), ") every micro-batch runs collectively with the group, but micro-batch ", i, " has no token ",
               "in '", token_mask_key, "'");
  }

  release_grads();
  std::vector<DataProto> with_tokens;
  std::vector<double> weights;  // of each micro-batch's loss in the mini-batch's
  for (size_t i = 0; i < micro_batches.size(); ++i) {
    ++stats.micro_batches;
    if (tokens(micro_batches[i]) == 0) continue;  // its mean loss would be NaN; it contributes nothing anyway
    weights.push_back(mean ? static_cast<double>(micro_units[i]) / local_norm : 1.0);
    with_tokens.push_back(micro_batches[i]);
  }
  if (pipeline_) {
    RECORD_USER_SCOPE("hf::pipeline_forward_backward");
    pipelined_backward(with_tokens, weights, loss_fn, stats);
  } else {
    MoeAuxLoss moe_aux(*module_);
    // Named phases for the profiler (global_profiler; core/kineto_profile.h sums each one's time).
    for (size_t i = 0; i < with_tokens.size(); ++i) {
      torch::Tensor loss;
      {
        RECORD_USER_SCOPE("hf::forward_and_loss");
        loss = moe_aux.add_to(scalar_loss(loss_fn, with_tokens[i]), weights[i], stats);
      }
      {
        RECORD_USER_SCOPE("hf::backward");
        (loss * weights[i]).backward();
      }
      {
        RECORD_USER_SCOPE("hf::accumulate_into_masters");
        accumulate_into_masters();
      }
      RECORD_USER_SCOPE("hf::loss_readback");
      stats.loss += loss.item<double>() * weights[i];
    }
  }
  give_back_zero_grads();
  if (zero_) {
    RECORD_USER_SCOPE("hf::sharded_step");
    sharded_step(local_norm, mean, stats);
    return stats;
  }
  if (data_parallel() && !reduce_gradients(local_norm, mean, stats)) {
    log_warn("train_step: no data-parallel rank's mini-batch has any tokens; skipping the update");
    zero_grad();
    stats.empty = true;
    stats.step = step_;
    return stats;
  }
  {
    RECORD_USER_SCOPE("hf::clip_grad_norm");
    stats.grad_norm = clip_grad_norm();
  }
  if (!std::isfinite(stats.grad_norm)) {
    log_warn("train_step: gradient norm is ", stats.grad_norm, " at step ", step_, "; skipping the update");
    zero_grad();
    stats.skipped = true;
    stats.step = step_;
    return stats;
  }
  apply_step();
  stats.step = step_;
  return stats;
}

int64_t TrainEngine::reduced_numel() const {
  int64_t n = 2;
  for (const auto& p : params_) n += p.numel();
  return n;
}

bool TrainEngine::reduce_gradients(double local_norm, bool mean, StepStats& stats) {
  torch::NoGradGuard no_grad;
  // One flat fp32 buffer: a single collective per step, and parameters without a gradient on this rank
  // still line up with the ranks where they have one.
  // On the parameters' device: the reducer's collective (NCCL for CUDA) moves tensors where they live.
  const auto fp32 = torch::TensorOptions().dtype(torch::kFloat).device(optimized().front().device());
  std::vector<torch::Tensor> parts;
  parts.reserve(optimized().size() + 1);
  for (size_t i = 0; i < optimized().size(); ++i) {
    const auto& p = optimized()[i];
    // Experts differ between the ranks of the data-parallel group: their slots stay zero (summed below).
    parts.push_back(p.grad().defined() && !expert_[i] ? p.grad().reshape({-1}).to(torch::kFloat) * local_norm
                                                      : torch::zeros({p.numel()}, fp32));
  }
  parts.push_back(torch::tensor({static_cast<float>(stats.tokens), static_cast<float>(stats.loss * local_norm)},
                                fp32));
  torch::Tensor flat = torch::cat(parts);
  const int64_t n = flat.numel() - 2;
  reducer_(flat);
  HF_CHECK(flat.numel() == n + 2, "train_step: the gradient reducer changed the buffer size from ", n + 2, " to ",
           flat.numel());
  const double global_units = flat[n].item<double>();
  if (global_units <= 0) return false;
  const double norm = mean ? global_units : 1.0;
  stats.tokens = static_cast<int64_t>(std::llround(global_units));
  stats.loss = flat[n + 1].item<double>() / norm;
  int64_t offset = 0;
  for (size_t i = 0; i < optimized().size(); ++i) {
    auto& p = optimized()[i];
    torch::Tensor g = (flat.narrow(0, offset, p.numel()) / norm).view(p.sizes()).to(p.scalar_type());
    offset += p.numel();
    if (expert_[i]) {
      g = p.grad().defined() ? p.grad() * (local_norm / norm) : torch::zeros_like(p);
      if (expert_dp_ != nullptr) expert_dp_->all_reduce(g, ReduceOp::kSum);
    }
    if (p.grad().defined())
      p.mutable_grad().copy_(g);
    else
      p.mutable_grad() = g;
  }
  return true;
}

void TrainEngine::save_state(const std::string& path) const {
  HF_CHECK(!zero_, "optimizer state '", path, "': a ZeRO-partitioned optimizer state cannot be saved yet");
  torch::serialize::OutputArchive archive;
  optimizer_->save(archive);
  archive.write("hybridflow.step", torch::tensor(step_, torch::kLong));
  for (size_t i = 0; i < masters_.size(); ++i)
    archive.write("hybridflow.master." + std::to_string(i), masters_[i].detach().to(torch::kCPU));
  std::ostringstream bytes;
  archive.save_to(bytes);
  write_file_atomic(path, bytes.str());
}

void TrainEngine::load_state(const std::string& path) {
  HF_CHECK(!zero_, "optimizer state '", path, "': a ZeRO-partitioned optimizer state cannot be loaded yet");
  HF_CHECK(file_exists(path), "optimizer state '", path, "' does not exist");
  try {
    std::istringstream bytes(read_file(path));
    torch::serialize::InputArchive archive;
    archive.load_from(bytes);
    optimizer_->load(archive);
    had_grad_.assign(optimized().size(), false);
    for (size_t i = 0; i < optimized().size(); ++i)
      had_grad_[i] = optimizer_->state().count(optimized()[i].unsafeGetTensorImpl()) > 0;
    torch::Tensor step;
    archive.read("hybridflow.step", step);
    step_ = step.item<int64_t>();
    // Mixed precision resumes from the fp32 masters (the module's bf16 weights are their rounding). A state
    // saved by an fp32 engine has none: the masters then start from the loaded module weights.
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < masters_.size(); ++i) {
      torch::Tensor master;
      if (archive.try_read("hybridflow.master." + std::to_string(i), master)) {
        HF_CHECK(master.sizes() == masters_[i].sizes(), "optimizer state '", path, "': master weight ", i,
                 " has shape ", master.sizes(), ", the model expects ", masters_[i].sizes());
        masters_[i].copy_(master);
      } else {
        masters_[i].copy_(params_[i]);
      }
      params_[i].copy_(masters_[i]);
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    HF_FAIL("optimizer state '", path, "' could not be loaded into this model's optimizer: ", e.what());
  }
}

TrainEngine::NamedState TrainEngine::named_state() const {
  torch::NoGradGuard no_grad;
  std::vector<ZeroOptimizer::Moments> moments(params_.size());
  if (zero_) {
    moments = zero_->gather_moments();
  } else {
    for (size_t i = 0; i < optimized().size(); ++i) {
      auto it = optimizer_->state().find(optimized()[i].unsafeGetTensorImpl());
      if (it == optimizer_->state().end()) continue;
      const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
      moments[i] = {s.exp_avg(), s.exp_avg_sq(), s.step()};
    }
  }
  auto cpu_fp32 = [](const torch::Tensor& t) { return t.defined() ? t.detach().to(torch::kCPU, torch::kFloat).clone() : t; };
  NamedState out;
  out.step = step_;
  for (size_t i = 0; i < params_.size(); ++i) {
    ParameterState& p = out.parameters[names_[i]];
    p.exp_avg = cpu_fp32(moments[i].exp_avg);
    p.exp_avg_sq = cpu_fp32(moments[i].exp_avg_sq);
    p.adam_step = moments[i].step;
    if (!masters_.empty()) p.master = cpu_fp32(masters_[i]);
  }
  return out;
}

void TrainEngine::load_named_state(const NamedState& state) {
  torch::NoGradGuard no_grad;
  auto check_shape = [&](const torch::Tensor& t, size_t i, const char* what) {
    HF_CHECK(!t.defined() || t.sizes() == params_[i].sizes(), "optimizer state: ", what, " of parameter '", names_[i],
             "' has shape ", t.sizes(), ", the model expects ", params_[i].sizes(),
             split_[i] ? " on this tensor-parallel rank" : "");
  };
  // Everything is checked before anything changes, so a refused state leaves the engine as it was.
  std::vector<const ParameterState*> saved_of(params_.size(), nullptr);
  for (size_t i = 0; i < params_.size(); ++i) {
    auto it = state.parameters.find(names_[i]);
    if (it == state.parameters.end()) continue;
    const ParameterState& saved = it->second;
    check_shape(saved.exp_avg, i, "exp_avg");
    check_shape(saved.exp_avg_sq, i, "exp_avg_sq");
    check_shape(saved.master, i, "the master weight");
    HF_CHECK(saved.exp_avg.defined() == saved.exp_avg_sq.defined(), "optimizer state: parameter '", names_[i],
             "' has only one of Adam's two moments");
    saved_of[i] = &saved;
  }
  std::vector<ZeroOptimizer::Moments> moments(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParameterState* saved = saved_of[i];
    if (saved != nullptr && saved->exp_avg.defined())
      moments[i] = {saved->exp_avg, saved->exp_avg_sq, saved->adam_step};
    // Mixed precision resumes from the fp32 masters (the module's weights are their rounding); a state
    // without them (saved by an fp32 engine) starts the masters from the module's weights.
    if (!masters_.empty()) {
      masters_[i].copy_(saved != nullptr && saved->master.defined() ? saved->master : params_[i]);
      params_[i].copy_(masters_[i]);
    }
  }
  if (zero_) {
    zero_->set_moments(moments);
  } else {
    // A parameter with moments has had a gradient: a step that gives it none hands it zeros, as the run that
    // saved the state would (give_back_zero_grads), so a resumed run takes the same steps.
    had_grad_.assign(optimized().size(), false);
    for (size_t i = 0; i < optimized().size(); ++i) {
      const torch::Tensor& p = optimized()[i];
      optimizer_->state().erase(p.unsafeGetTensorImpl());
      if (!moments[i].exp_avg.defined()) continue;
      had_grad_[i] = true;
      auto s = std::make_unique<torch::optim::AdamWParamState>();
      s->step(moments[i].step);
      s->exp_avg(moments[i].exp_avg.to(p.device(), torch::kFloat).clone());
      s->exp_avg_sq(moments[i].exp_avg_sq.to(p.device(), torch::kFloat).clone());
      optimizer_->state()[p.unsafeGetTensorImpl()] = std::move(s);
    }
  }
  step_ = state.step;
}

}  // namespace hybridflow
