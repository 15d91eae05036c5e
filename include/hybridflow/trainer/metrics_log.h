// Per-step metrics of an RL run: wall time per stage (generate, reward, old_log_prob, ref, values,
// advantage, update_critic, update_actor, ...) and named scalars, written as one JSON line per step to
// <run_dir>/metrics.jsonl, optionally as TensorBoard scalars under <run_dir>/tensorboard, and
// summarised on one console line.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace hybridflow {
namespace report {
class TensorBoardWriter;
}

// Accumulates seconds per named stage; a stage timed twice in one step adds up.
class StageTimer {
 public:
  class Scope {
   public:
    Scope(StageTimer& timer, std::string stage);
    ~Scope();  // adds the elapsed time, also when the stage throws
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    StageTimer& timer_;
    std::string stage_;
    std::chrono::steady_clock::time_point start_;
  };

  // Usage: { auto t = timer.scope("generate"); ... }
  Scope scope(const std::string& stage) { return Scope(*this, stage); }
  void add(const std::string& stage, double seconds);
  // Stages in the order they were first timed.
  const std::vector<std::pair<std::string, double>>& stages() const { return stages_; }
  double seconds(const std::string& stage) const;  // 0 for a stage never timed
  double total_seconds() const;
  void reset();

 private:
  std::vector<std::pair<std::string, double>> stages_;
};

// Which sinks a run's metrics go to (verl's trainer.logger list): console, jsonl, tensorboard.
struct MetricsSinks {
  bool jsonl = true;
  bool tensorboard = false;
};

class MetricsLog {
 public:
  // run_dir is created if needed; "" keeps metrics in memory only (no file).
  explicit MetricsLog(const std::string& run_dir, MetricsSinks sinks = {});
  ~MetricsLog();

  void set(const std::string& name, double value);
  // Adds "timing/<stage>_s" per stage and "timing/step_s" (their sum).
  void add_timings(const StageTimer& timer);
  // Current step's values so far (name -> value).
  const std::map<std::string, double>& current() const { return current_; }

  // Writes {"step": step, <name>: value, ...} as one line (append_jsonl), clears the step, returns the record.
  nlohmann::json end_step(int64_t step);

  // Rollout samples of `step` (rows of trainer/step_records.h) appended to <run_dir>/samples.jsonl, and
  // `markdown` as the TensorBoard text "samples" at that step; each sink only when it is on.
  void add_samples(int64_t step, const std::vector<nlohmann::json>& rows, const std::string& markdown);
  // The first held-out responses of the validation at `step` (trainer.log_val_generations; rows of
  // trainer/step_records.h's generation_record) appended to <run_dir>/val_generations.jsonl, and `markdown` as
  // the TensorBoard text "val_generations" at that step (step 0: before the first step).
  void add_val_generations(int64_t step, const std::vector<nlohmann::json>& rows, const std::string& markdown);
  // A step's calls per pool (rows of trainer/step_records.h) appended to <run_dir>/timeline.jsonl.
  void add_timeline(const std::vector<nlohmann::json>& rows);

  // One console line: "step 3/100 | reward/mean 0.512 | timing/step_s 1.23 | ETA 4m05s". Only `keys`
  // present in `record` are shown, in the given order; empty `keys` shows every metric. total_steps <= 0
  // omits "/N"; eta_s < 0 omits the ETA (NaN shows "ETA ?").
  static std::string format_progress(const nlohmann::json& record, int64_t total_steps,
                                     const std::vector<std::string>& keys = {}, double eta_s = -1);

  // For a run resumed at `step`: rewrites the file (atomically) without the records of later steps, which
  // the interrupted run wrote after its checkpoint and the resumed run will write again, and without a
  // line cut off by the crash; samples.jsonl, timeline.jsonl and val_generations.jsonl likewise. Returns how many metrics lines
  // were dropped.
  int64_t drop_steps_after(int64_t step);

  // "" when in-memory only (or jsonl is off).
  const std::string& path() const { return path_; }
  // The TensorBoard event file, "" when that sink is off.
  std::string tensorboard_path() const;

 private:
  std::string path_;
  std::string samples_path_, timeline_path_, val_generations_path_;  // "" when jsonl is off
  std::unique_ptr<report::TensorBoardWriter> tensorboard_;
  std::map<std::string, double> current_;
};

}  // namespace hybridflow
