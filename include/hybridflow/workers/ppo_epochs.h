// The loop shared by actor and critic updates: epochs over a batch, each a (optionally shuffled) pass
// in mini-batches, one optimizer step per mini-batch through TrainEngine's micro-batch accumulation.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "hybridflow/algo/masked.h"
#include "hybridflow/engine/train_engine.h"
#include "hybridflow/workers/role_specs.h"

namespace hybridflow {

struct MiniBatchPlan {
  // Rows per optimizer step on this rank (0 = the whole batch); with data parallelism this rank's share
  // of the global mini-batch, and every rank must hold as many rows as the others.
  int64_t mini_batch_rows = 0;
  int64_t micro_batch_rows = 0;  // rows per forward/backward (0 = the whole mini-batch)
  // > 0: micro-batches by token count instead (verl's use_dynamic_bsz): at most this many padded tokens
  // each, trimmed of padding (engine/token_micro_batches.h); micro_batch_rows is then unused.
  int64_t max_token_len = 0;
  std::string max_token_len_key = "max_token_len";  // the config key named in errors
  int64_t epochs = 1;
  bool shuffle = true;
  uint64_t seed = 0;             // permutation seed; combined with the engine's step so each call differs
  LossWeighting weighting = LossWeighting::kAuto;  // from the loss_agg_mode (loss_weighting_for)
  // The LR schedule's position for this call's optimizer steps (the RL step); < 0: the optimizer step count.
  int64_t schedule_step = -1;
  // With max_token_len: given this rank's count of micro-batches for a mini-batch, the count it runs (a
  // collective: expert-parallel ranks agree on their group's largest, since every forward and backward
  // exchanges tokens between them). Unset: its own count.
  std::function<int64_t(int64_t)> agree_micro_batches;
};

// The micro-batch (and data-parallel rank) weighting under which a split mini-batch gives the same
// gradient as the loss aggregated over the whole mini-batch in this mode.
LossWeighting loss_weighting_for(algo::LossAggMode mode);

// Averages named scalars over the micro-batches that reported them.
class MetricAverager {
 public:
  void add(const std::string& name, double value);
  nlohmann::json to_json() const;  // name -> mean
  // name -> (sum, count): data-parallel ranks combine these into one mean over all their micro-batches.
  const std::map<std::string, std::pair<double, int64_t>>& sums() const { return sums_; }

 private:
  std::map<std::string, std::pair<double, int64_t>> sums_;
};

// Runs the plan; adds grad_norm / lr / loss per optimizer step to `metrics` under `prefix`.
void run_ppo_epochs(TrainEngine& engine, const DataProto& batch, const MiniBatchPlan& plan,
                    const MicroLossFn& loss_fn, const std::string& token_mask_key, const std::string& prefix,
                    MetricAverager& metrics);

// A role's batch split and epochs (its TrainSpec), and the update call's schedule_step (the RL step the
// trainer names in the call's meta: the LR schedule advances once per update call, as in verl).
MiniBatchPlan mini_batch_plan(const TrainSpec& train, const nlohmann::json& call_meta);

}  // namespace hybridflow
