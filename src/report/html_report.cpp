#include "hybridflow/report/html_report.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include "hybridflow/core/error.h"
#include "hybridflow/report/chart_scale.h"
#include "hybridflow/report/html_escape.h"
#include "hybridflow/report/run_data.h"
#include "hybridflow/report/svg_charts.h"

namespace hybridflow::report {
namespace {

// The line charts, in page order: a chart shows those of its metrics the run has, and is skipped when it
// has none. A name ending in '/' stands for every metric under that prefix (validation per source, resharding,
// memory).
struct ChartSpec {
  const char* title;
  const char* y_label;
  std::vector<std::string> metrics;
  bool smooth = true;  // off for schedules, whose exact shape (warmup, decay) is the point
};

const std::vector<ChartSpec>& line_chart_specs() {
  static const std::vector<ChartSpec> specs = {
      {"Reward and score", "mean per step", {"reward/mean", "score/mean", "val/score"}},
      {"Held-out score by data source", "mean score", {"val-core/"}},
      {"KL divergence", "nats", {"actor/ppo_kl", "actor/kl_loss", "actor/reward_kl_penalty"}},
      {"Entropy", "nats per token", {"actor/entropy"}},
      {"Response length", "tokens", {"response_length/mean", "response_length/max"}},
      {"Losses", "loss", {"actor/pg_loss", "critic/vf_loss"}},
      {"Gradient norm", "norm", {"actor/grad_norm", "critic/grad_norm"}},
      {"Learning rate", "lr", {"actor/lr", "critic/lr"}, false},
      {"Throughput", "tokens/s", {"perf/throughput_tokens_per_s"}},
      {"Resharding", "bytes", {"reshard/"}},
      {"Memory", "bytes", {"memory/"}},
  };
  return specs;
}

// The trainer's stages in dataflow order; other timing/<stage>_s keys follow alphabetically.
const std::vector<std::string>& stage_order() {
  static const std::vector<std::string> order = {"generate", "reward", "old_log_prob", "ref", "values",
                                                 "advantage", "update_critic", "update_actor"};
  return order;
}

std::vector<std::string> expand(const RunData& run, const std::string& name) {
  if (name.empty() || name.back() != '/') return run.metric(name) ? std::vector<std::string>{name} : std::vector<std::string>{};
  std::vector<std::string> out;
  for (const auto& [key, series] : run.metrics)
    if (key.rfind(name, 0) == 0 && !series.values.empty()) out.push_back(key);
  return out;
}

// "timing/generate_s" -> "generate"; empty for timing/step_s (the total) and non-stage keys.
std::string stage_of(const std::string& key) {
  const std::string prefix = "timing/", suffix = "_s";
  if (key.rfind(prefix, 0) != 0 || key.size() <= prefix.size() + suffix.size() ||
      key.compare(key.size() - suffix.size(), suffix.size(), suffix) != 0)
    return "";
  const std::string stage = key.substr(prefix.size(), key.size() - prefix.size() - suffix.size());
  return stage == "step" ? "" : stage;
}

std::string figure(const std::string& svg) { return "<figure>" + svg + "</figure>\n"; }

// Per-stage seconds per step as stacked bars; steps are averaged in groups when there are too many to see.
std::string stage_time_chart(const RunData& run, size_t& charts) {
  std::vector<std::string> stages;
  std::set<std::string> seen;
  for (const auto& s : stage_order())
    if (run.metric("timing/" + s + "_s")) stages.push_back(s), seen.insert(s);
  for (const auto& [key, series] : run.metrics) {
    const std::string s = stage_of(key);
    if (!s.empty() && !series.values.empty() && seen.insert(s).second) stages.push_back(s);
  }
  if (stages.empty()) return "";
  constexpr size_t kMaxBars = 150;
  const size_t n = run.steps.size(), groups = std::min(n, kMaxBars);
  std::map<int64_t, size_t> index_of_step;
  for (size_t i = 0; i < n; ++i) index_of_step[run.steps[i]] = i;
  StackedBarChart chart;
  chart.title = n > kMaxBars ? "Time per stage (mean over groups of steps)" : "Time per stage";
  chart.y_label = "seconds";
  chart.layer_names = stages;
  chart.layers.assign(stages.size(), std::vector<double>(groups, 0.0));
  std::vector<double> group_x(groups, 0.0), group_n(groups, 0.0);
  for (size_t i = 0; i < n; ++i) {
    const size_t g = i * groups / n;
    group_x[g] += static_cast<double>(run.steps[i]);
    group_n[g] += 1;
  }
  for (size_t l = 0; l < stages.size(); ++l) {
    const MetricSeries& s = *run.metric("timing/" + stages[l] + "_s");
    for (size_t k = 0; k < s.steps.size(); ++k) {
      auto it = index_of_step.find(static_cast<int64_t>(s.steps[k]));
      if (it == index_of_step.end()) continue;
      chart.layers[l][it->second * groups / n] += s.values[k];
    }
  }
  for (size_t g = 0; g < groups; ++g) {
    chart.x.push_back(group_n[g] > 0 ? group_x[g] / group_n[g] : 0);
    for (auto& layer : chart.layers) layer[g] = group_n[g] > 0 ? layer[g] / group_n[g] : 0;
  }
  ++charts;
  return figure(stacked_bar_chart_svg(chart));
}

// The last few steps of timeline.jsonl as a Gantt chart, one row per pool.
std::string timeline_chart(const RunData& run, size_t& charts) {
  if (run.timeline.empty()) return "";
  constexpr size_t kSteps = 3;
  std::set<int64_t> steps;
  for (const auto& span : run.timeline) steps.insert(span.step);
  std::set<int64_t> shown;
  for (auto it = steps.rbegin(); it != steps.rend() && shown.size() < kSteps; ++it) shown.insert(*it);
  GanttChart chart;
  chart.title = "Timeline of the last " + std::to_string(shown.size()) + " step" + (shown.size() > 1 ? "s" : "") +
                " (seconds from the first call shown)";
  double origin = INFINITY;
  std::map<int64_t, double> step_start;
  for (const auto& span : run.timeline) {
    if (!shown.count(span.step)) continue;
    origin = std::min(origin, span.start_s);
    auto [it, inserted] = step_start.emplace(span.step, span.start_s);
    if (!inserted) it->second = std::min(it->second, span.start_s);
  }
  for (const auto& span : run.timeline) {
    if (shown.count(span.step)) chart.spans.push_back({span.pool, span.call, span.start_s - origin, span.end_s - origin});
  }
  for (const auto& [step, start] : step_start) chart.markers.push_back({start - origin, "step " + std::to_string(step)});
  ++charts;
  return "<section><h2>Timeline</h2>\n" + figure(gantt_chart_svg(chart)) + "</section>\n";
}

std::string summary_row(const std::string& name, const std::string& value) {
  return "<tr><th>" + html_escape(name) + "</th><td>" + html_escape(value) + "</td></tr>\n";
}

std::string first_last(const MetricSeries* s) {
  if (s == nullptr) return "";
  return format_number(s->values.front()) + " \xe2\x86\x92 " + format_number(s->values.back());
}

std::string format_duration(double seconds) {
  const auto total = static_cast<int64_t>(std::llround(seconds));
  if (total < 120) return format_number(seconds) + " s";
  const int64_t h = total / 3600, m = total / 60 % 60, s = total % 60;
  return (h ? std::to_string(h) + " h " : "") + std::to_string(m) + " min " + std::to_string(s) + " s";
}

std::string summary_section(const RunData& run) {
  // Step 0 is the validation before training (trainer.val_before_train), not a step that trained.
  std::vector<int64_t> trained;
  std::copy_if(run.steps.begin(), run.steps.end(), std::back_inserter(trained), [](int64_t s) { return s > 0; });
  std::string rows = summary_row("run directory", run.run_dir);
  if (trained.empty()) {
    rows += summary_row("steps", "0 (a validation only)");
  } else {
    const auto [lo, hi] = std::minmax_element(trained.begin(), trained.end());
    rows += summary_row("steps", std::to_string(trained.size()) + " (" + std::to_string(*lo) + " to " +
                                     std::to_string(*hi) + ")" +
                                     (trained.size() < run.steps.size() ? ", and the validation before training" : ""));
  }
  for (const char* key : {"reward/mean", "score/mean", "val/score"}) {
    if (const MetricSeries* s = run.metric(key)) rows += summary_row(std::string(key) + " (first \xe2\x86\x92 last)", first_last(s));
  }
  if (const MetricSeries* t = run.metric("timing/step_s")) {
    double total = 0;
    for (double v : t->values) total += v;
    rows += summary_row("total step time", format_duration(total));
    rows += summary_row("mean step time", format_number(total / static_cast<double>(t->values.size())) + " s");
  }
  if (const MetricSeries* t = run.metric("perf/throughput_tokens_per_s"))
    rows += summary_row("throughput (last step)", format_number(t->values.back()) + " tokens/s");
  for (const auto& note : run.notes) rows += summary_row("note", note);
  return "<section><h2>Summary</h2>\n<table class=\"summary\">\n" + rows + "</table></section>\n";
}

// Every metric of the run with its last, minimum and maximum value: nothing is lost by having no chart.
std::string metrics_table(const RunData& run) {
  std::string rows;
  for (const auto& [name, s] : run.metrics) {
    if (s.values.empty()) continue;
    const auto [lo, hi] = std::minmax_element(s.values.begin(), s.values.end());
    rows += "<tr><td>" + html_escape(name) + "</td><td>" + format_number(s.values.back()) + "</td><td>" +
            format_number(*lo) + "</td><td>" + format_number(*hi) + "</td><td>" + std::to_string(s.values.size()) +
            "</td></tr>\n";
  }
  return "<section><details><summary>All metrics (" + std::to_string(run.metrics.size()) +
         ")</summary>\n<table class=\"data\">\n<tr><th>metric</th><th>last</th><th>min</th><th>max</th><th>steps</th></tr>\n" +
         rows + "</table></details></section>\n";
}

// Rollout samples of the last few steps that have any (most recent first), escaped: they are model output.
std::string samples_section(const RunData& run, size_t& shown) {
  shown = 0;
  if (run.samples.empty()) return "";
  constexpr size_t kSteps = 3, kRows = 48, kMaxChars = 2000;
  std::set<int64_t> steps;
  for (const auto& s : run.samples) steps.insert(s.step);
  std::set<int64_t> wanted;
  for (auto it = steps.rbegin(); it != steps.rend() && wanted.size() < kSteps; ++it) wanted.insert(*it);
  auto clip = [&](const std::string& text) {
    if (text.size() <= kMaxChars) return html_escape(text);
    size_t cut = kMaxChars;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 character
    return html_escape(text.substr(0, cut)) + "<span class=\"clip\"> [" + std::to_string(text.size() - cut) +
           " more bytes]</span>";
  };
  std::string rows;
  for (auto it = run.samples.rbegin(); it != run.samples.rend() && shown < kRows; ++it) {
    if (!wanted.count(it->step)) continue;
    rows += "<tr><td class=\"num\">" + std::to_string(it->step) + "</td><td class=\"num\">" +
            (it->reward ? format_number(*it->reward) : "") + "</td><td class=\"num\">" +
            (it->advantage ? format_number(*it->advantage) : "") + "</td><td class=\"text\">" +
            clip(it->prompt) + "</td><td class=\"text\">" + clip(it->response) + "</td></tr>\n";
    ++shown;
  }
  return "<section><h2>Rollout samples (last " + std::to_string(wanted.size()) + " steps with samples, " +
         std::to_string(shown) + " rows)</h2>\n<table class=\"data samples\">\n<tr><th>step</th><th>reward</th>"
         "<th>advantage</th><th>prompt</th><th>response</th></tr>\n" +
         rows + "</table></section>\n";
}

// The calls global_profiler profiled: wall and busy time, operators (kernels on a GPU) and the named phases.
std::string profile_section(const RunData& run) {
  if (run.profile.empty()) return "";
  std::string rows;
  for (const auto& c : run.profile) {
    std::string phases;
    for (const auto& p : c.phases) {
      if (p.name == "hf::train_step") continue;  // the whole update
      phases += (phases.empty() ? "" : "; ") + html_escape(p.name.rfind("hf::", 0) == 0 ? p.name.substr(4) : p.name) +
                " " + format_number(p.host_s) + " s" + (p.device_s ? " (device " + format_number(*p.device_s) + " s)" : "");
    }
    rows += "<tr><td class=\"num\">" + std::to_string(c.step) + "</td><td>" + html_escape(c.role) + "</td><td class=\"num\">" +
            std::to_string(c.rank) + "</td><td>" + html_escape(c.method) + (c.call > 1 ? " #" + std::to_string(c.call) : "") +
            "</td><td class=\"num\">" + format_number(c.wall_s) + "</td><td class=\"num\">" + format_number(c.busy_s) +
            "</td><td class=\"num\">" + std::to_string(c.operator_calls) + "</td><td class=\"num\">" +
            (c.kernels ? std::to_string(*c.kernels) : "") + "</td><td class=\"text\">" + phases + "</td></tr>\n";
  }
  return "<section><h2>Profiled calls (global_profiler)</h2>\n<table class=\"data\">\n<tr><th>step</th><th>role</th>"
         "<th>rank</th><th>call</th><th>wall s</th><th>busy s</th><th>operators</th><th>kernels</th><th>phases</th></tr>\n" +
         rows + "</table></section>\n";
}

constexpr const char* kStyle = R"(
body { font: 14px/1.45 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 24px 32px; color: #222; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 10px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.sub { color: #666; margin-bottom: 12px; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
figure { margin: 0; border: 1px solid #e3e3e3; border-radius: 6px; padding: 6px; background: #fff; }
svg.chart { display: block; max-width: 100%; height: auto; font-family: inherit; }
svg .title { font-size: 14px; font-weight: 600; fill: #222; }
svg .legend { font-size: 11px; fill: #333; }
svg .xtick { font-size: 11px; fill: #555; text-anchor: middle; }
svg .ytick { font-size: 11px; fill: #555; text-anchor: end; }
svg .xlabel, svg .ylabel { font-size: 11px; fill: #777; text-anchor: middle; }
svg .barlabel { font-size: 11px; fill: #fff; }
svg .grid { stroke: #eee; stroke-width: 1; }
svg .axis { stroke: #888; stroke-width: 1; }
svg .marker { stroke: #999; stroke-width: 1; stroke-dasharray: 4 3; }
svg polyline { fill: none; stroke-linejoin: round; }
svg polyline.line { stroke-width: 1.8; }
svg polyline.raw { stroke-width: 1; opacity: 0.3; }
table { border-collapse: collapse; }
table.summary th { text-align: left; font-weight: 500; color: #555; padding: 2px 18px 2px 0; }
table.data { width: 100%; font-size: 13px; }
table.data th, table.data td { border: 1px solid #e3e3e3; padding: 4px 8px; vertical-align: top; text-align: left; }
table.data th { background: #f6f6f6; }
td.text { white-space: pre-wrap; word-break: break-word; font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; max-width: 560px; }
table.data td.num { width: 1%; white-space: nowrap; text-align: right; }
.clip { color: #999; }
pre.config { background: #f6f6f6; padding: 12px; border-radius: 6px; overflow-x: auto; font-size: 12px; }
summary { cursor: pointer; font-weight: 600; }
)";

}  // namespace

std::string ReportSummary::describe() const {
  std::string line = "report: " + std::to_string(steps) + " step" + (steps == 1 ? "" : "s") + " (" +
                     std::to_string(first_step) + ".." + std::to_string(last_step) + "), " + std::to_string(charts) +
                     " chart" + (charts == 1 ? "" : "s") + ", " + std::to_string(samples) + " sample" +
                     (samples == 1 ? "" : "s") + " -> " + out_path;
  for (const auto& note : notes) line += "\n  note: " + note;
  return line;
}

std::string render_html_report(const std::string& run_dir, ReportSummary* summary) {
  const RunData run = load_run(run_dir);
  size_t charts = 0;
  std::string curves;
  for (const auto& spec : line_chart_specs()) {
    std::vector<LineSeries> series;
    for (const auto& name : spec.metrics)
      for (const auto& key : expand(run, name)) series.push_back({key, run.metrics.at(key).steps, run.metrics.at(key).values});
    if (series.empty()) continue;
    LineChartOptions options;
    options.title = spec.title;
    options.y_label = spec.y_label;
    if (!spec.smooth) options.smoothing = 0;
    curves += figure(line_chart_svg(series, options));
    ++charts;
  }
  const std::string stages = stage_time_chart(run, charts);
  const std::string timeline = timeline_chart(run, charts);
  size_t samples = 0;
  const std::string samples_html = samples_section(run, samples);
  const std::string title = std::filesystem::path(run_dir).lexically_normal().filename().string();

  std::string html = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>hybridflow run: " +
                     html_escape(title) + "</title>\n<style>" + kStyle + "</style>\n</head>\n<body>\n";
  html += "<h1>hybridflow run report: " + html_escape(title) + "</h1>\n";
  html += summary_section(run);
  if (!curves.empty() || !stages.empty()) {
    html += "<section><h2>Training curves</h2>\n<div class=\"charts\">\n" + curves + stages + "</div></section>\n";
  }
  html += timeline + samples_html + profile_section(run);
  if (run.config_yaml) {
    html += "<section><h2>Config</h2>\n<details><summary>config.yaml</summary>\n<pre class=\"config\">" +
            html_escape(*run.config_yaml) + "</pre></details></section>\n";
  }
  html += metrics_table(run);
  html += "</body>\n</html>\n";

  if (summary != nullptr) {
    summary->steps = static_cast<int64_t>(run.steps.size());
    summary->first_step = *std::min_element(run.steps.begin(), run.steps.end());
    summary->last_step = *std::max_element(run.steps.begin(), run.steps.end());
    summary->charts = charts;
    summary->samples = samples;
    summary->notes = run.notes;
  }
  return html;
}

ReportSummary write_html_report(const std::string& run_dir, const std::string& out_path) {
  ReportSummary summary;
  summary.out_path = out_path;
  const std::string html = render_html_report(run_dir, &summary);
  const std::filesystem::path out(out_path);
  if (out.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(out.parent_path(), ec);
  }
  const std::string tmp = out_path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    HF_CHECK(f.is_open(), "report: cannot write ", tmp);
    f.write(html.data(), static_cast<std::streamsize>(html.size()));
    f.flush();
    if (!f.good()) {
      std::filesystem::remove(tmp);
      HF_FAIL("report: cannot write ", tmp);
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, out_path, ec);
  if (ec) {
    std::filesystem::remove(tmp);
    HF_FAIL("report: cannot rename ", tmp, " to ", out_path, ": ", ec.message());
  }
  return summary;
}

}  // namespace hybridflow::report
