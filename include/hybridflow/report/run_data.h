// What the HTML report reads from a run directory: metrics.jsonl (one record per step), and when present
// samples.jsonl, config.yaml, timeline.jsonl and the profiler's summaries (profile/step_<N>/*.summary.jsonl).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace hybridflow::report {

// One metric over the run: the steps that have a finite value for it, in file order.
struct MetricSeries {
  std::vector<double> steps;
  std::vector<double> values;
};

struct Sample {
  int64_t step = 0;
  std::string prompt, response;
  std::optional<double> reward, advantage;
};

// One call of a worker pool during a step, in seconds since the run's clock origin: a row's start_s and
// end_s, plus its step_start_unix_s when it has one (the trainer's rows are relative to their step).
struct TimelineSpan {
  int64_t step = 0;
  std::string pool, call;
  double start_s = 0, end_s = 0;
};

// One worker call that global_profiler profiled (<run_dir>/profile/step_<N>/<role>_rank<R>.summary.jsonl).
struct ProfiledCall {
  int64_t step = 0, rank = 0, call = 0;
  std::string role, method, device;
  double wall_s = 0, busy_s = 0;
  int64_t operator_calls = 0;
  std::optional<int64_t> kernels;  // on a GPU
  struct Phase {
    std::string name;
    double host_s = 0, calls = 0;
    std::optional<double> device_s;
  };
  std::vector<Phase> phases;  // hybridflow's named phases, by time (device time where there is one), largest first
};

struct RunData {
  std::string run_dir;
  std::vector<int64_t> steps;                    // every step of metrics.jsonl, in file order
  std::map<std::string, MetricSeries> metrics;   // by metric name; NaN, inf and null values are left out
  std::vector<std::string> notes;                // what was skipped and why (a cut-off last line)
  std::vector<Sample> samples;
  std::optional<std::string> config_yaml;
  std::vector<TimelineSpan> timeline;
  std::vector<ProfiledCall> profile;  // by step, role, rank, then file order

  const MetricSeries* metric(const std::string& name) const;
};

// Throws hybridflow::Error naming the file and line of anything unreadable: a missing metrics.jsonl, a
// line that is not a JSON object, a record without an integer "step". A last line that is not JSON is
// ignored (and noted): a run killed mid-write leaves one, and the trainer's resume drops it too.
RunData load_run(const std::string& run_dir);

}  // namespace hybridflow::report
