// This machine as a cluster of one-core devices, measured by `hybridflow plan --calibrate`: one thread's
// matmul FLOP/s and memory bandwidth, a Gloo all-reduce between two local processes, and the fixed costs
// that dominate small models on a CPU (per worker-group call, per layer pass, per decode step, the
// controller's work per step), fitted to the per-call timeline of small PPO runs. The constants and the
// prediction checks (measured against predicted seconds per step for each placement run) are kept as JSON
// in default_calibration_path(): `--gpu this-machine` plans with them and prints the last checks' error.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "hybridflow/placement/hardware.h"

namespace hybridflow::placement {

struct CalibrationCheck {
  std::string placement;  // "colocate", "split", ...
  std::string layout;     // Plan::describe()
  // "fit" (its calls fitted the overheads), "check" (predicted with the fitted constants) or "async" (a
  // standalone rollout at a staleness, for the async speed-up)
  std::string use;
  int staleness = 0;
  double measured_s = 0;  // seconds per RL step: the best of the measured steps ("async": their mean)
  double predicted_s = 0;
  // Each pool's calls of one stage ("pool 0 preparation (compute_log_prob+...)"): measured and predicted seconds.
  std::map<std::string, std::pair<double, double>> calls;
  double error() const { return measured_s > 0 ? (predicted_s - measured_s) / measured_s : 0.0; }
};

struct Calibration {
  std::string created;           // UTC, ISO 8601
  std::string host;
  double load_average = 0;       // /proc/loadavg's 1-minute figure when the runs ended
  int cores = 1;
  double memory_bytes = 0;       // the machine's available memory
  double matmul_flops = 0;       // one thread, fp32, at the calibration model's shapes
  double memory_bandwidth = 0;   // one thread, STREAM triad, bytes/s
  double allreduce_bandwidth = 0;  // Gloo between two local processes, ring bus bandwidth, bytes/s
  double allreduce_latency_s = 0;  // a small all-reduce, per ring step
  double compute_efficiency = 1;   // fitted: the share of matmul FLOP/s a whole pass reaches
  Overheads overheads;             // fitted
  std::vector<CalibrationCheck> checks;

  nlohmann::json to_json() const;
  // Error naming `where` and the first missing or mistyped field.
  static Calibration from_json(const nlohmann::json& j, const std::string& where);
  // One device of this machine (a core), with the measured peaks and the fitted overheads.
  ClusterSpec device() const;
};

// The async speed-up the checks measured: each "async" check at staleness k > 0 against the "async" check
// at staleness 0 of the same layout (speed-up = seconds per step at 0 / at k), measured and predicted.
struct SpeedupCheck {
  std::string layout;
  int staleness = 0;
  double measured = 0, predicted = 0;
  double error() const { return measured > 0 ? (predicted - measured) / measured : 0.0; }
};
std::vector<SpeedupCheck> async_speedups(const Calibration& c);

// $HF_CALIBRATION if set, else $XDG_CACHE_HOME/hybridflow/calibration.json, else
// ~/.cache/hybridflow/calibration.json.
std::string default_calibration_path();
// Error naming the file and how to make one (`hybridflow plan --calibrate`) when it is missing.
Calibration load_calibration(const std::string& path);
void save_calibration(const std::string& path, const Calibration& c);

// A least-squares fit of measured call seconds: measured ~ a * compute + fixed + sum_i x_i * count_i with
// a >= 1 (no pass beats the matmul peak) and every x_i >= 0, each row weighted by 1 / measured (relative
// errors). `counts` are {calls, micro-batch passes, layer passes, decode steps}: the overheads' coefficients.
struct FitRow {
  double measured_s = 0;
  double compute_s = 0;  // at efficiency 1
  double fixed_s = 0;    // memory and communication time, taken as costed
  double counts[4] = {0, 0, 0, 0};
};
struct FitResult {
  double compute_scale = 1;  // a: 1 / compute efficiency
  double call_s = 0, micro_batch_s = 0, layer_pass_s = 0, decode_step_s = 0;
  double rms_relative_error = 0;
};
FitResult fit_overheads(const std::vector<FitRow>& rows);

}  // namespace hybridflow::placement
