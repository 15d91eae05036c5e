#include "hybridflow/trainer/metrics_log.h"

#include <cmath>
#include <cstdio>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/core/jsonl.h"
#include "hybridflow/core/progress.h"
#include "hybridflow/report/tensorboard_writer.h"

namespace hybridflow {

StageTimer::Scope::Scope(StageTimer& timer, std::string stage)
    : timer_(timer), stage_(std::move(stage)), start_(std::chrono::steady_clock::now()) {}

StageTimer::Scope::~Scope() {
  timer_.add(stage_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
}

void StageTimer::add(const std::string& stage, double seconds) {
  for (auto& entry : stages_) {
    if (entry.first == stage) {
      entry.second += seconds;
      return;
    }
  }
  stages_.emplace_back(stage, seconds);
}

double StageTimer::seconds(const std::string& stage) const {
  for (const auto& entry : stages_)
    if (entry.first == stage) return entry.second;
  return 0.0;
}

double StageTimer::total_seconds() const {
  double total = 0.0;
  for (const auto& entry : stages_) total += entry.second;
  return total;
}

void StageTimer::reset() { stages_.clear(); }

MetricsLog::MetricsLog(const std::string& run_dir, MetricsSinks sinks) {
  if (run_dir.empty()) return;
  make_dirs(run_dir);
  if (sinks.jsonl) {
    path_ = run_dir + "/metrics.jsonl";
    samples_path_ = run_dir + "/samples.jsonl";
    timeline_path_ = run_dir + "/timeline.jsonl";
    val_generations_path_ = run_dir + "/val_generations.jsonl";
  }
  // A new event file per process start, as TensorBoard expects: a resumed run appends steps to the view.
  if (sinks.tensorboard) tensorboard_ = std::make_unique<report::TensorBoardWriter>(run_dir + "/tensorboard");
}

MetricsLog::~MetricsLog() = default;

std::string MetricsLog::tensorboard_path() const { return tensorboard_ ? tensorboard_->path() : std::string(); }

void MetricsLog::set(const std::string& name, double value) {
  HF_CHECK(!name.empty() && name != "step", "metrics: invalid metric name '", name, "' (\"step\" is reserved)");
  current_[name] = value;
}

void MetricsLog::add_timings(const StageTimer& timer) {
  for (const auto& [stage, seconds] : timer.stages()) set("timing/" + stage + "_s", seconds);
  set("timing/step_s", timer.total_seconds());
}

nlohmann::json MetricsLog::end_step(int64_t step) {
  nlohmann::json record = nlohmann::json::object();
  record["step"] = step;
  for (const auto& [name, value] : current_) {
    // JSON has no NaN/inf; null keeps the line parseable and shows the value was not finite.
    record[name] = std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(nullptr);
  }
  if (!path_.empty()) append_jsonl(path_, record);
  if (tensorboard_) tensorboard_->add_scalars(current_, step);
  current_.clear();
  return record;
}

void MetricsLog::add_samples(int64_t step, const std::vector<nlohmann::json>& rows, const std::string& markdown) {
  if (rows.empty()) return;
  if (!samples_path_.empty()) append_jsonl(samples_path_, rows);
  if (tensorboard_) tensorboard_->add_text("samples", markdown, step);
}

void MetricsLog::add_val_generations(int64_t step, const std::vector<nlohmann::json>& rows,
                                     const std::string& markdown) {
  if (rows.empty()) return;
  if (!val_generations_path_.empty()) append_jsonl(val_generations_path_, rows);
  if (tensorboard_) tensorboard_->add_text("val_generations", markdown, step);
}

void MetricsLog::add_timeline(const std::vector<nlohmann::json>& rows) {
  if (!timeline_path_.empty() && !rows.empty()) append_jsonl(timeline_path_, rows);
}

namespace {

// Rewrites a JSON Lines file of step records without those after `step` (and without unreadable lines).
int64_t drop_records_after(const std::string& path, int64_t step) {
  if (path.empty() || !file_exists(path)) return 0;
  const std::string text = read_file(path);
  std::vector<nlohmann::json> kept;
  int64_t dropped = 0;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const bool keep = record.is_object() && record.contains("step") && record["step"].is_number_integer() &&
                      record["step"].get<int64_t>() <= step;
    if (keep)
      kept.push_back(std::move(record));
    else
      ++dropped;
  }
  if (dropped > 0) write_jsonl(path, kept);
  return dropped;
}

}  // namespace

int64_t MetricsLog::drop_steps_after(int64_t step) {
  drop_records_after(samples_path_, step);
  drop_records_after(timeline_path_, step);
  drop_records_after(val_generations_path_, step);
  return drop_records_after(path_, step);
}

namespace {

std::string format_value(const nlohmann::json& value) {
  if (!value.is_number()) return value.is_null() ? "nan" : value.dump();
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", value.get<double>());
  return buf;
}

}  // namespace

std::string MetricsLog::format_progress(const nlohmann::json& record, int64_t total_steps,
                                        const std::vector<std::string>& keys, double eta_s) {
  std::string line = "step " + (record.contains("step") ? record["step"].dump() : std::string("?"));
  if (total_steps > 0) line += "/" + std::to_string(total_steps);
  auto show = [&](const std::string& key) { line += " | " + key + " " + format_value(record[key]); };
  if (keys.empty()) {
    for (const auto& [key, value] : record.items())
      if (key != "step") show(key);
  } else {
    for (const auto& key : keys)
      if (key != "step" && record.contains(key)) show(key);
  }
  if (!(eta_s < 0)) line += " | ETA " + ProgressLine::format_duration(eta_s);
  return line;
}

}  // namespace hybridflow
