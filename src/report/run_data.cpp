#include "hybridflow/report/run_data.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

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

void load_profile(RunData& run) {
  const std::filesystem::path root = std::filesystem::path(run.run_dir) / "profile";
  std::error_code ec;
  if (!std::filesystem::is_directory(root, ec)) return;
  std::vector<std::filesystem::path> files;
  for (const auto& step : std::filesystem::directory_iterator(root, ec)) {
    if (!step.is_directory() || step.path().filename().string().rfind("step_", 0) != 0) continue;
    for (const auto& f : std::filesystem::directory_iterator(step.path(), ec)) {
      const std::string name = f.path().filename().string();
      if (name.size() > 14 && name.compare(name.size() - 14, 14, ".summary.jsonl") == 0) files.push_back(f.path());
    }
  }
  std::sort(files.begin(), files.end());
  for (const auto& path : files) {
    const std::string shown = path.parent_path().filename().string() + "/" + path.filename().string();
    for_each_row(
        path.string(),
        [&](const nlohmann::json& row, size_t line) {
          ProfiledCall c;
          c.step = step_of(row, shown, line);
          c.role = string_of(row, "role");
          c.method = string_of(row, "method");
          c.device = string_of(row, "device");
          c.rank = static_cast<int64_t>(number_of(row, "rank").value_or(0));
          c.call = static_cast<int64_t>(number_of(row, "call").value_or(1));
          c.wall_s = number_of(row, "wall_s").value_or(0);
          c.busy_s = number_of(row, "busy_s").value_or(0);
          c.operator_calls = static_cast<int64_t>(number_of(row, "operator_calls").value_or(0));
          if (const auto k = number_of(row, "kernels")) c.kernels = static_cast<int64_t>(*k);
          if (row.contains("scopes") && row["scopes"].is_object())
            for (const auto& [name, s] : row["scopes"].items()) {
              if (!s.is_object()) continue;
              ProfiledCall::Phase p;
              p.name = name;
              p.host_s = number_of(s, "host_s").value_or(0);
              p.calls = number_of(s, "calls").value_or(0);
              p.device_s = number_of(s, "device_s");
              c.phases.push_back(std::move(p));
            }
          std::sort(c.phases.begin(), c.phases.end(), [](const auto& a, const auto& b) {
            return a.device_s.value_or(a.host_s) > b.device_s.value_or(b.host_s);
          });
          run.profile.push_back(std::move(c));
        },
        [&](size_t line) { run.notes.push_back(shown + " line " + std::to_string(line) + " is cut off; ignored"); });
  }
  std::stable_sort(run.profile.begin(), run.profile.end(), [](const ProfiledCall& a, const ProfiledCall& b) {
    return std::tie(a.step, a.role, a.rank) < std::tie(b.step, b.role, b.rank);
  });
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
  load_profile(run);
  const std::string config = run_dir + "/config.yaml";
  if (std::filesystem::exists(config)) run.config_yaml = read_text(config);
  return run;
}

}  // namespace hybridflow::report
