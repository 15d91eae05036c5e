#include "hybridflow/report/run_data.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "hybridflow/core/error.h"

namespace hybridflow::report {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  HF_CHECK(in.is_open(), "report: cannot read ", path);
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

bool blank(const std::string& line) { return line.find_first_not_of(" \t\r") == std::string::npos; }

// Calls `row` with each JSON object of a JSON Lines file and its 1-based line number. A last line that is
// not JSON is reported through `cut_off` instead of failing.
void for_each_row(const std::string& path, const std::function<void(const nlohmann::json&, size_t)>& row,
                  const std::function<void(size_t)>& cut_off) {
  const std::string text = read_text(path);
  const std::string name = std::filesystem::path(path).filename().string();
  std::vector<std::string> lines;
  std::string line;
  std::istringstream in(text);
  while (std::getline(in, line)) lines.push_back(line);
  size_t last = lines.size();
  while (last > 0 && blank(lines[last - 1])) --last;
  for (size_t i = 0; i < last; ++i) {
    if (blank(lines[i])) continue;
    nlohmann::json value = nlohmann::json::parse(lines[i], nullptr, /*allow_exceptions=*/false);
    if (value.is_discarded()) {
      if (i + 1 == last) {
        cut_off(i + 1);
        continue;
      }
      HF_FAIL(name, " line ", i + 1, " is not JSON (in ", path, ")");
    }
    HF_CHECK(value.is_object(), name, " line ", i + 1, " is not a JSON object (in ", path, ")");
    row(value, i + 1);
  }
}

int64_t step_of(const nlohmann::json& row, const std::string& file, size_t line) {
  HF_CHECK(row.contains("step") && row["step"].is_number_integer(), file, " line ", line,
           " has no integer \"step\"");
  return row["step"].get<int64_t>();
}

std::optional<double> number_of(const nlohmann::json& row, const char* key) {
  if (!row.contains(key) || !row[key].is_number()) return std::nullopt;
  return row[key].get<double>();
}

std::string string_of(const nlohmann::json& row, const char* key) {
  if (!row.contains(key)) return "";
  return row[key].is_string() ? row[key].get<std::string>() : row[key].dump();
}

void load_metrics(RunData& run) {
  const std::string path = run.run_dir + "/metrics.jsonl";
  HF_CHECK(std::filesystem::exists(path), "report: no metrics.jsonl in ", run.run_dir);
  for_each_row(
      path,
      [&](const nlohmann::json& row, size_t line) {
        const int64_t step = step_of(row, "metrics.jsonl", line);
        run.steps.push_back(step);
        for (const auto& [name, value] : row.items()) {
          // null is how the trainer writes NaN/inf (JSON has neither); strings and objects are not scalars.
          if (name == "step" || !value.is_number()) continue;
          const double v = value.get<double>();
          if (!std::isfinite(v)) continue;
          MetricSeries& series = run.metrics[name];
          series.steps.push_back(static_cast<double>(step));
          series.values.push_back(v);
        }
      },
      [&](size_t line) { run.notes.push_back("metrics.jsonl line " + std::to_string(line) + " is cut off; ignored"); });
  HF_CHECK(!run.steps.empty(), "report: ", path, " has no steps");
}

void load_samples(RunData& run) {
  const std::string path = run.run_dir + "/samples.jsonl";
  if (!std::filesystem::exists(path)) return;
  for_each_row(
      path,
      [&](const nlohmann::json& row, size_t line) {
        Sample s;
        s.step = step_of(row, "samples.jsonl", line);
        s.prompt = string_of(row, "prompt");
        s.response = string_of(row, "response");
        s.reward = number_of(row, "reward");
        s.advantage = number_of(row, "advantage");
        run.samples.push_back(std::move(s));
      },
      [&](size_t line) { run.notes.push_back("samples.jsonl line " + std::to_string(line) + " is cut off; ignored"); });
}

void load_timeline(RunData& run) {
  const std::string path = run.run_dir + "/timeline.jsonl";
  if (!std::filesystem::exists(path)) return;
  for_each_row(
      path,
      [&](const nlohmann::json& row, size_t line) {
        TimelineSpan span;
        span.step = step_of(row, "timeline.jsonl", line);
        span.pool = string_of(row, "pool");
        span.call = string_of(row, "call");
        const auto start = number_of(row, "start_s"), end = number_of(row, "end_s");
        HF_CHECK(start && end && std::isfinite(*start) && std::isfinite(*end) && *end >= *start, "timeline.jsonl line ",
                 line, " needs numbers start_s <= end_s");
        // The trainer writes times from the step's start plus where the step starts on the wall clock.
        const double base = number_of(row, "step_start_unix_s").value_or(0.0);
        span.start_s = base + *start;
        span.end_s = base + *end;
        run.timeline.push_back(std::move(span));
      },
      [&](size_t line) { run.notes.push_back("timeline.jsonl line " + std::to_string(line) + " is cut off; ignored"); });
}

}  // namespace

const MetricSeries* RunData::metric(const std::string& name) const {
  auto it = metrics.find(name);
  return it == metrics.end() || it->second.values.empty() ? nullptr : &it->second;
}

RunData load_run(const std::string& run_dir) {
  RunData run;
  run.run_dir = run_dir;
  load_metrics(run);
  load_samples(run);
  load_timeline(run);
  const std::string config = run_dir + "/config.yaml";
  if (std::filesystem::exists(config)) run.config_yaml = read_text(config);
  return run;
}

}  // namespace hybridflow::report
