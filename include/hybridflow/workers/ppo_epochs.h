// The loop shared by actor and critic updates: epochs over a batch, each a (optionally shuffled) pass
// in mini-batches, one optimizer step per mini-batch through TrainEngine's micro-batch accumulation.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "hybridflow/engine/train_engine.h"

namespace hybridflow {

struct MiniBatchPlan {
  int64_t mini_batch_rows = 0;   // rows per optimizer step on this rank (0 = the whole batch)
  int64_t micro_batch_rows = 0;  // rows per forward/backward (0 = the whole mini-batch)
  int64_t epochs = 1;
  bool shuffle = true;
  uint64_t seed = 0;             // permutation seed; combined with the engine's step so each call differs
};

// Averages named scalars over the micro-batches that reported them.
class MetricAverager {
 public:
  void add(const std::string& name, double value);
  nlohmann::json to_json() const;  // name -> mean

 private:
  std::map<std::string, std::pair<double, int64_t>> sums_;
};

// Runs the plan; adds grad_norm / lr / loss per optimizer step to `metrics` under `prefix`.
void run_ppo_epochs(TrainEngine& engine, const DataProto& batch, const MiniBatchPlan& plan,
                    const MicroLossFn& loss_fn, const std::string& token_mask_key, const std::string& prefix,
                    MetricAverager& metrics);

// Reads {mini_batch_rows, micro_batch_rows, epochs, shuffle, seed} keys of a worker's JSON config.
MiniBatchPlan mini_batch_plan_from_json(const nlohmann::json& j);
// {lr, weight_decay, grad_clip, warmup_steps, total_steps, lr_schedule} -> OptimizerOptions.
OptimizerOptions optimizer_options_from_json(const nlohmann::json& j);

}  // namespace hybridflow
