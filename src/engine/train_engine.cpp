#include "hybridflow/engine/train_engine.h"

#include <cmath>
#include <sstream>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/core/logging.h"

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

}  // namespace

bool excluded_from_weight_decay(const std::string& name, const torch::Tensor& param) {
  return param.dim() < 2 || ends_with(name, "bias") || name.find("norm") != std::string::npos;
}

TrainEngine::TrainEngine(std::shared_ptr<torch::nn::Module> module, OptimizerOptions options)
    : module_(std::move(module)), options_(std::move(options)) {
  HF_CHECK(module_ != nullptr, "TrainEngine: module is null");
  lr_at_step(options_.schedule, 0);  // validates the schedule before any training
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    (excluded_from_weight_decay(item.key(), item.value()) ? no_decay : decay).push_back(item.value());
    params_.push_back(item.value());
  }
  HF_CHECK(!params_.empty(), "TrainEngine: the module has no trainable parameters");
  std::vector<torch::optim::OptimizerParamGroup> groups;
  // Both groups always exist (possibly empty) so that saved states line up across runs.
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                 adamw_options(options_, options_.weight_decay)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(adamw_options(options_, 0.0)));
  optimizer_ = std::make_unique<torch::optim::AdamW>(groups, adamw_options(options_, options_.weight_decay));
}

void TrainEngine::zero_grad() {
  for (auto& p : params_) {
    if (p.grad().defined()) {
      p.grad().detach_();
      p.grad().zero_();
    }
  }
}

double TrainEngine::clip_grad_norm() {
  std::vector<torch::Tensor> with_grad;
  for (auto& p : params_) {
    if (p.grad().defined()) with_grad.push_back(p);
  }
  if (with_grad.empty()) return 0.0;
  const double max_norm = options_.grad_clip > 0 ? options_.grad_clip : std::numeric_limits<double>::infinity();
  return torch::nn::utils::clip_grad_norm_(with_grad, max_norm);
}

void TrainEngine::apply_step() {
  const double lr = lr_at_step(options_.schedule, step_);
  for (auto& group : optimizer_->param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
  optimizer_->step();
  ++step_;
}

StepStats TrainEngine::train_step(const DataProto& mini_batch, int64_t micro_batch_size, const MicroLossFn& loss_fn,
                                  const std::string& token_mask_key) {
  const int64_t rows = mini_batch.batch_size();
  HF_CHECK(rows > 0, "train_step: empty mini-batch");
  HF_CHECK(micro_batch_size > 0, "train_step: micro_batch_size must be > 0, got ", micro_batch_size);
  const bool by_tokens = mini_batch.has_tensor(token_mask_key);
  auto count = [&](const DataProto& b) -> int64_t {
    return by_tokens ? b.tensor(token_mask_key).sum().item<int64_t>() : b.batch_size();
  };
  StepStats stats;
  stats.tokens = count(mini_batch);
  HF_CHECK(stats.tokens > 0, "train_step: the mini-batch's '", token_mask_key, "' selects no tokens");
  stats.lr = lr_at_step(options_.schedule, step_);

  zero_grad();
  for (int64_t begin = 0; begin < rows; begin += micro_batch_size) {
    DataProto micro = mini_batch.slice(begin, std::min(rows, begin + micro_batch_size));
    const int64_t micro_tokens = count(micro);
    ++stats.micro_batches;
    if (micro_tokens == 0) continue;  // its mean loss would be NaN; it contributes nothing anyway
    torch::Tensor loss = loss_fn(micro);
    HF_CHECK(loss.defined() && loss.numel() == 1, "train_step: the loss function must return a scalar, got ",
             loss.defined() ? loss.sizes() : torch::IntArrayRef{});
    const double share = static_cast<double>(micro_tokens) / static_cast<double>(stats.tokens);
    (loss * share).backward();
    stats.loss += loss.item<double>() * share;
  }
  stats.grad_norm = clip_grad_norm();
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

void TrainEngine::save_state(const std::string& path) const {
  torch::serialize::OutputArchive archive;
  optimizer_->save(archive);
  archive.write("hybridflow.step", torch::tensor(step_, torch::kLong));
  std::ostringstream bytes;
  archive.save_to(bytes);
  write_file_atomic(path, bytes.str());
}

void TrainEngine::load_state(const std::string& path) {
  HF_CHECK(file_exists(path), "optimizer state '", path, "' does not exist");
  try {
    std::istringstream bytes(read_file(path));
    torch::serialize::InputArchive archive;
    archive.load_from(bytes);
    optimizer_->load(archive);
    torch::Tensor step;
    archive.read("hybridflow.step", step);
    step_ = step.item<int64_t>();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    HF_FAIL("optimizer state '", path, "' could not be loaded into this model's optimizer: ", e.what());
  }
}

}  // namespace hybridflow
