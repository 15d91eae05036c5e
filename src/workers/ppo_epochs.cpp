#include "hybridflow/workers/ppo_epochs.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/record_function.h>

#include <algorithm>

#include "hybridflow/core/error.h"
#include "hybridflow/engine/token_micro_batches.h"

namespace hybridflow {

void MetricAverager::add(const std::string& name, double value) {
  auto& s = sums_[name];
  s.first += value;
  s.second += 1;
}

nlohmann::json MetricAverager::to_json() const {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, s] : sums_) out[name] = s.first / static_cast<double>(s.second);
  return out;
}

void run_ppo_epochs(TrainEngine& engine, const DataProto& batch, const MiniBatchPlan& plan,
                    const MicroLossFn& loss_fn, const std::string& token_mask_key, const std::string& prefix,
                    MetricAverager& metrics) {
  const int64_t rows = batch.batch_size();
  HF_CHECK(rows > 0, prefix, "update: empty batch");
  HF_CHECK(plan.epochs > 0, prefix, "update: ppo_epochs must be > 0, got ", plan.epochs);
  if (plan.schedule_step >= 0) engine.set_schedule_step(plan.schedule_step);
  const int64_t mini = plan.mini_batch_rows > 0 ? std::min(plan.mini_batch_rows, rows) : rows;
  const int64_t micro = plan.micro_batch_rows > 0 ? std::min(plan.micro_batch_rows, mini) : mini;
  for (int64_t epoch = 0; epoch < plan.epochs; ++epoch) {
    DataProto order = batch;
    if (plan.shuffle) {
      // A local generator: shuffling must not disturb the global RNG that sampling seeds rely on.
      auto gen = at::detail::createCPUGenerator(plan.seed * 1000003ULL + static_cast<uint64_t>(engine.step()) * 7919ULL +
                                                static_cast<uint64_t>(epoch));
      order = batch.index_select(torch::randperm(rows, gen, torch::kLong));
    }
    for (int64_t begin = 0; begin < rows; begin += mini) {
      const DataProto mini_batch = order.slice(begin, std::min(rows, begin + mini));
      StepStats stats;
      int64_t micro_count = (mini_batch.batch_size() + micro - 1) / micro;
      if (plan.max_token_len > 0) {
        std::vector<DataProto> micro_batches;
        {
          RECORD_USER_SCOPE("hf::split_micro_batches");
          const MicroBatching how{micro, plan.max_token_len, plan.max_token_len_key, plan.agree_micro_batches};
          for (MicroBatch& m : split_micro_batches(mini_batch, how)) micro_batches.push_back(std::move(m.data));
        }
        micro_count = static_cast<int64_t>(micro_batches.size());
        stats = engine.train_step(micro_batches, loss_fn, token_mask_key, plan.weighting);
      } else {
        stats = engine.train_step(mini_batch, micro, loss_fn, token_mask_key, plan.weighting);
      }
      metrics.add(prefix + "grad_norm", stats.grad_norm);
      metrics.add(prefix + "lr", stats.lr);
      metrics.add(prefix + "loss", stats.loss);
      metrics.add(prefix + "micro_batches", static_cast<double>(micro_count));
      if (stats.has_moe_aux_loss) metrics.add(prefix + "moe_aux_loss", stats.moe_aux_loss);
      if (stats.skipped) metrics.add(prefix + "skipped_steps", 1.0);
      if (stats.empty) metrics.add(prefix + "empty_steps", 1.0);
    }
  }
}

LossWeighting loss_weighting_for(algo::LossAggMode mode) {
  switch (mode) {
    case algo::LossAggMode::kTokenMean: return LossWeighting::kTokenMean;
    // Each is a mean over the micro-batch's non-empty rows (seq-mean-token-sum-norm too: its constant
    // loss_scale_factor does not depend on the split), so rows weigh them back into the mini-batch's mean.
    case algo::LossAggMode::kSeqMeanTokenSum:
    case algo::LossAggMode::kSeqMeanTokenMean:
    case algo::LossAggMode::kSeqMeanTokenSumNorm: return LossWeighting::kRowMean;
    case algo::LossAggMode::kTokenSum: return LossWeighting::kSum;
  }
  HF_FAIL("ppo update: unhandled loss aggregation mode ", static_cast<int>(mode));
}

MiniBatchPlan mini_batch_plan(const TrainSpec& train, const nlohmann::json& call_meta) {
  MiniBatchPlan plan;
  plan.mini_batch_rows = train.mini_batch_rows;
  plan.micro_batch_rows = train.micro_batch_rows;
  plan.max_token_len = train.max_token_len;
  plan.epochs = train.epochs;
  plan.shuffle = train.shuffle;
  plan.seed = train.seed;
  plan.schedule_step = call_meta.value("schedule_step", plan.schedule_step);
  return plan;
}

}  // namespace hybridflow
