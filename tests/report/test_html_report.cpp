// The HTML run report on run directories written here: the expected charts and no others, escaped model
// output, the right number of points, robustness (NaN, missing keys, a cut-off last line, 1 and 10,000
// steps), errors naming file and line, and well-formedness checked by Python's html.parser and xml.etree
// (tests/report/check_html.py).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "hybridflow/core/error.h"
#include "hybridflow/report/html_escape.h"
#include "hybridflow/report/html_report.h"
#include "python_oracle.h"
#include "support/temp_dir.h"

namespace hybridflow::report {
namespace {

using hybridflow::testing::TempDir;

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

void write(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// The <svg>...</svg> whose <title> is `title`; empty when there is none.
std::string svg_titled(const std::string& html, const std::string& title) {
  const size_t t = html.find("<title>" + html_escape(title));
  if (t == std::string::npos) return "";
  const size_t begin = html.rfind("<svg", t), end = html.find("</svg>", t);
  return html.substr(begin, end - begin + 6);
}

// The value of attribute `name` in the first element starting with `element_start` at or after `from`;
// plain string search, because libstdc++'s recursive std::regex overflows the stack on long point lists.
std::string attribute(const std::string& svg, const std::string& element_start, const std::string& name, size_t& from) {
  const size_t element = svg.find(element_start, from);
  if (element == std::string::npos) return from = std::string::npos, "";
  const size_t end_of_element = svg.find('>', element);
  const size_t attr = svg.find(" " + name + "=\"", element);
  from = end_of_element;
  if (attr == std::string::npos || attr > end_of_element) return "";
  const size_t begin = attr + name.size() + 3;
  return svg.substr(begin, svg.find('"', begin) - begin);
}

// The (x, y) pairs of a polyline's points attribute.
std::vector<std::pair<double, double>> parse_points(const std::string& points) {
  std::vector<std::pair<double, double>> out;
  std::istringstream in(points);
  std::string pair;
  while (in >> pair) out.emplace_back(std::stod(pair), std::stod(pair.substr(pair.find(',') + 1)));
  return out;
}

// Point counts of each polyline in an SVG fragment, in order.
std::vector<size_t> polyline_points(const std::string& svg) {
  std::vector<size_t> counts;
  for (size_t from = 0;;) {
    const std::string points = attribute(svg, "<polyline", "points", from);
    if (from == std::string::npos) break;
    counts.push_back(parse_points(points).size());
  }
  return counts;
}

nlohmann::json check_html(const std::string& path, const std::string& scratch) {
  const auto r = hybridflow::testing::run_report_script("check_html.py", hybridflow::testing::shell_quote(path), scratch);
  if (r.exit_code != 0) return {};
  return nlohmann::json::parse(r.output);
}

// A small PPO-like run: 5 steps, entropy NaN (null, as the trainer writes it) at step 3, critic/vf_loss
// missing at step 4, and a sixth line cut off mid-write.
std::string small_metrics() {
  std::string text;
  for (int step = 1; step <= 5; ++step) {
    nlohmann::json row = {{"step", step},
                          {"reward/mean", 0.1 * step},
                          {"score/mean", 0.1 * step},
                          {"actor/entropy", step == 3 ? nlohmann::json(nullptr) : nlohmann::json(1.0 / step)},
                          {"actor/pg_loss", 0.01 * step},
                          {"actor/ppo_kl", 0.001 * step},
                          {"actor/lr", 1e-6},
                          {"response_length/mean", 10.0 + step},
                          {"perf/throughput_tokens_per_s", 1000.0 + step},
                          {"timing/generate_s", 1.5},
                          {"timing/update_actor_s", 0.5},
                          {"timing/step_s", 2.0}};
    if (step != 4) row["critic/vf_loss"] = 0.5 / step;
    if (step == 5) row["val/score"] = 0.75;
    text += row.dump() + "\n";
  }
  return text + "{\"step\": 6, \"reward/me";
}

class HtmlReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    run_ = dir_.file("run");
    std::filesystem::create_directories(run_);
    write(run_ + "/metrics.jsonl", small_metrics());
    write(run_ + "/samples.jsonl",
          nlohmann::json({{"step", 5}, {"prompt", "1 < 2 & 3 > 2?"}, {"response", "<script>alert(1)</script>yes"},
                          {"reward", 1.0}, {"advantage", 0.5}}).dump() + "\n" +
              nlohmann::json({{"step", 5}, {"prompt", "7+5="}, {"response", "12"}, {"reward", 0.0}}).dump() + "\n");
    write(run_ + "/config.yaml", "trainer:\n  total_steps: 5  # <b>not bold</b>\n");
    write(run_ + "/timeline.jsonl",
          nlohmann::json({{"step", 5}, {"pool", "actor_rollout"}, {"call", "generate"}, {"start_s", 10.0}, {"end_s", 11.5}}).dump() + "\n" +
          nlohmann::json({{"step", 5}, {"pool", "critic"}, {"call", "values"}, {"start_s", 11.5}, {"end_s", 11.7}}).dump() + "\n");
  }

  TempDir dir_;
  std::string run_;
};

TEST_F(HtmlReportTest, HasTheChartsOfTheMetricsPresent) {
  const ReportSummary s = write_html_report(run_, dir_.file("out/report.html"));
  const std::string html = read_all(dir_.file("out/report.html"));
  for (const char* title : {"Reward and score", "KL divergence", "Entropy", "Response length", "Losses", "Learning rate",
                            "Throughput", "Time per stage", "Timeline of the last 1 step"}) {
    EXPECT_NE(html.find("<title>" + std::string(title)), std::string::npos) << title;
  }
  // No resharding, memory or gradient metrics in this run: no empty charts for them.
  for (const char* title : {"Resharding", "Memory", "Gradient norm", "Held-out score by data source"})
    EXPECT_EQ(html.find("<title>" + std::string(title)), std::string::npos) << title;
  EXPECT_EQ(s.charts, 9u);
  EXPECT_EQ(s.steps, 5);
  EXPECT_EQ(s.first_step, 1);
  EXPECT_EQ(s.last_step, 5);
  EXPECT_EQ(s.samples, 2u);
  ASSERT_EQ(s.notes.size(), 1u);
  EXPECT_EQ(s.notes[0], "metrics.jsonl line 6 is cut off; ignored");
  EXPECT_NE(s.describe().find("5 steps (1..5), 9 charts, 2 samples"), std::string::npos) << s.describe();
  EXPECT_NE(html.find("<title>hybridflow run: run</title>"), std::string::npos);
}

// The profiler's summaries under <run_dir>/profile: each call a row, its phases by device time where it has
// one, the whole update's phase left out, names escaped; a cut-off last line noted.
TEST_F(HtmlReportTest, ListsTheProfiledCallsWithTheirPhases) {
  std::filesystem::create_directories(run_ + "/profile/step_2");
  const nlohmann::json update = {
      {"step", 2}, {"role", "actor"}, {"rank", 0}, {"method", "update_actor"}, {"call", 1}, {"device", "cuda"},
      {"wall_s", 4.18}, {"busy_s", 1.5}, {"operator_calls", 280000}, {"kernels", 190000},
      {"scopes",
       {{"hf::train_step", {{"host_s", 4.1}, {"calls", 1}, {"device_s", 1.5}}},
        {"hf::backward", {{"host_s", 2.5}, {"calls", 8}, {"device_s", 0.9}}},
        {"hf::optimizer_step", {{"host_s", 0.02}, {"calls", 1}, {"device_s", 0.015}}},
        {"hf::forward_and_loss", {{"host_s", 1.2}, {"calls", 8}, {"device_s", 0.45}}}}}};
  const nlohmann::json log_probs = {{"step", 2},        {"role", "actor"},  {"rank", 0},
                                    {"method", "<b>x"}, {"call", 2},        {"device", "cpu"},
                                    {"wall_s", 0.5},    {"busy_s", 0.45},   {"operator_calls", 9000}};
  write(run_ + "/profile/step_2/actor_rank0.summary.jsonl",
        update.dump() + "\n" + log_probs.dump() + "\n{\"step\": 2, \"ro");
  const ReportSummary s = write_html_report(run_, dir_.file("out/report.html"));
  const std::string html = read_all(dir_.file("out/report.html"));
  const size_t section = html.find("<h2>Profiled calls (global_profiler)</h2>");
  ASSERT_NE(section, std::string::npos);
  const std::string rows = html.substr(section, html.find("</section>", section) - section);
  EXPECT_NE(rows.find("<td>update_actor</td><td class=\"num\">4.18</td><td class=\"num\">1.5</td>"
                      "<td class=\"num\">280000</td><td class=\"num\">190000</td>"),
            std::string::npos)
      << rows;
  // By device time: backward, then forward_and_loss, then optimizer_step; not train_step.
  const size_t backward = rows.find("backward 2.5 s (device 0.9 s)"), forward = rows.find("forward_and_loss 1.2 s"),
               optimizer = rows.find("optimizer_step 0.02 s");
  ASSERT_NE(backward, std::string::npos) << rows;
  EXPECT_LT(backward, forward);
  EXPECT_LT(forward, optimizer);
  EXPECT_EQ(rows.find("train_step"), std::string::npos);
  EXPECT_NE(rows.find("&lt;b&gt;x #2"), std::string::npos) << rows;
  bool noted = false;
  for (const auto& note : s.notes) noted = noted || note == "step_2/actor_rank0.summary.jsonl line 3 is cut off; ignored";
  EXPECT_TRUE(noted);
}

// A run whose validations score two data sources (trainer.test_freq; val-core/<source>/reward/mean@<n>):
// one series per source in a chart of their own, at the validated steps.
TEST(HtmlReport, HeldOutScoresOfEachDataSourceShareAChart) {
  TempDir dir;
  const std::string run = dir.file("run");
  std::filesystem::create_directories(run);
  std::string text;
  for (int step = 1; step <= 4; ++step) {
    nlohmann::json row = {{"step", step}, {"reward/mean", 0.1 * step}};
    if (step % 2 == 0) {
      row["val/score"] = 0.2 * step;
      row["val-core/gsm8k/reward/mean@4"] = 0.1 * step;
      row["val-core/math/reward/mean@4"] = 0.05 * step;
    }
    text += row.dump() + "\n";
  }
  write(run + "/metrics.jsonl", text);
  const std::string html = render_html_report(run);
  const std::string chart = svg_titled(html, "Held-out score by data source");
  EXPECT_EQ(polyline_points(chart), (std::vector<size_t>{2, 2}));
  for (const char* name : {">val-core/gsm8k/reward/mean@4</text>", ">val-core/math/reward/mean@4</text>"})
    EXPECT_NE(chart.find(name), std::string::npos) << name;
}

TEST_F(HtmlReportTest, PolylinesHaveOnePointPerFiniteValue) {
  const std::string html = render_html_report(run_);
  // 5 steps (the cut-off 6th ignored); entropy is NaN at step 3; vf_loss is missing at step 4.
  EXPECT_EQ(polyline_points(svg_titled(html, "Reward and score")), (std::vector<size_t>{5, 5, 1}));
  EXPECT_EQ(polyline_points(svg_titled(html, "Entropy")), (std::vector<size_t>{4}));
  EXPECT_EQ(polyline_points(svg_titled(html, "Losses")), (std::vector<size_t>{5, 4}));
  // Legends only where there are several series.
  EXPECT_NE(svg_titled(html, "Losses").find(">critic/vf_loss</text>"), std::string::npos);
  EXPECT_EQ(svg_titled(html, "Entropy").find("class=\"legend\""), std::string::npos);
}

TEST_F(HtmlReportTest, ModelOutputAndConfigAreEscaped) {
  const std::string html = render_html_report(run_);
  EXPECT_NE(html.find("&lt;script&gt;alert(1)&lt;/script&gt;yes"), std::string::npos);
  EXPECT_NE(html.find("1 &lt; 2 &amp; 3 &gt; 2?"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_NE(html.find("# &lt;b&gt;not bold&lt;/b&gt;"), std::string::npos);
  EXPECT_EQ(html.find("<b>"), std::string::npos);
  // Self-contained: nothing fetched from anywhere.
  EXPECT_EQ(html.find("http://"), html.find("http://www.w3.org/2000/svg"));
  EXPECT_EQ(html.find("https://"), std::string::npos);
}

TEST_F(HtmlReportTest, PythonHtmlParserAndXmlFindItWellFormed) {
  const std::string out = dir_.file("report.html");
  const ReportSummary s = write_html_report(run_, out);
  const nlohmann::json got = check_html(out, dir_.path());
  ASSERT_FALSE(got.is_null());
  EXPECT_EQ(got["errors"], nlohmann::json::array()) << got["errors"].dump(2);
  EXPECT_EQ(got["svg_count"].get<size_t>(), s.charts);
  EXPECT_EQ(got["script_tags"], 0);
  EXPECT_GE(got["table_count"].get<int>(), 3);  // summary, samples, all metrics
}

TEST_F(HtmlReportTest, WriteIsAtomicAndReplacesAnOldReport) {
  const std::string out = dir_.file("report.html");
  write(out, "old");
  write_html_report(run_, out);
  EXPECT_EQ(read_all(out).rfind("<!DOCTYPE html>", 0), 0u);
  for (const auto& entry : std::filesystem::directory_iterator(dir_.path()))
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos) << entry.path();
}

TEST(HtmlReport, ErrorsNameTheFileAndLine) {
  TempDir dir;
  try {
    render_html_report(dir.path());
    FAIL() << "no error";
  } catch (const hybridflow::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no metrics.jsonl"), std::string::npos) << e.what();
  }
  write(dir.file("metrics.jsonl"), "{\"step\": 1}\n{\"step\": 2}\n\n{\"step\": 3}\n{\"step\": 4\n{\"step\": 5}\n{\"step\": 6}\n");
  try {
    render_html_report(dir.path());
    FAIL() << "no error";
  } catch (const hybridflow::Error& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl line 5 is not JSON"), std::string::npos) << e.what();
  }
  write(dir.file("metrics.jsonl"), "{\"step\": 1}\n{\"loss\": 2}\n");
  try {
    render_html_report(dir.path());
    FAIL() << "no error";
  } catch (const hybridflow::Error& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl line 2 has no integer \"step\""), std::string::npos) << e.what();
  }
  EXPECT_THROW(write_html_report(dir.path(), dir.file("metrics.jsonl/x.html")), hybridflow::Error);
}

// trainer.val_before_train's record is step 0: it starts the held-out curve and is not counted as a step.
TEST(HtmlReport, StepZeroIsTheValidationBeforeTraining) {
  TempDir dir;
  write(dir.file("metrics.jsonl"), "{\"step\": 0, \"val/score\": 0.25}\n"
                                   "{\"step\": 1, \"reward/mean\": 0.5}\n"
                                   "{\"step\": 2, \"reward/mean\": 0.75, \"val/score\": 0.5}\n");
  const std::string html = render_html_report(dir.path());
  EXPECT_NE(html.find("<td>2 (1 to 2), and the validation before training</td>"), std::string::npos);
  EXPECT_NE(html.find("0.25 \xe2\x86\x92 0.5"), std::string::npos);  // val/score, first (before training) to last
  EXPECT_EQ(polyline_points(svg_titled(html, "Reward and score")), (std::vector<size_t>{2, 2}));
  write(dir.file("metrics.jsonl"), "{\"step\": 0, \"val/score\": 0.25}\n");  // trainer.val_only
  EXPECT_NE(render_html_report(dir.path()).find("<td>0 (a validation only)</td>"), std::string::npos);
}

TEST(HtmlReport, OneStepRun) {
  TempDir dir;
  write(dir.file("metrics.jsonl"), "{\"step\": 1, \"score/mean\": 0.5, \"timing/generate_s\": 1.0}\n");
  const ReportSummary s = write_html_report(dir.path(), dir.file("r.html"));
  EXPECT_EQ(s.steps, 1);
  EXPECT_EQ(s.charts, 2u);
  const std::string html = read_all(dir.file("r.html"));
  EXPECT_EQ(polyline_points(svg_titled(html, "Reward and score")), (std::vector<size_t>{1}));
  EXPECT_NE(svg_titled(html, "Reward and score").find("<circle"), std::string::npos);  // one point is still visible
  EXPECT_EQ(html.find("nan"), std::string::npos);
  EXPECT_EQ(html.find("inf"), std::string::npos);
}

TEST(HtmlReport, TenThousandStepsAreDownsampled) {
  TempDir dir;
  std::string text;
  for (int step = 1; step <= 10000; ++step) {
    nlohmann::json row = {{"step", step},
                          {"score/mean", std::sin(step * 0.01)},
                          {"actor/entropy", step == 5000 ? 100.0 : 1.0},  // a spike must survive thinning
                          {"timing/generate_s", 1.0},
                          {"timing/update_actor_s", 2.0},
                          {"memory/actor_peak_bytes", 1e9 + step}};
    text += row.dump() + "\n";
  }
  write(dir.file("metrics.jsonl"), text);
  const std::string out = dir.file("r.html");
  const ReportSummary s = write_html_report(dir.path(), out);
  EXPECT_EQ(s.steps, 10000);
  const std::string html = read_all(out);
  for (size_t n : polyline_points(html)) EXPECT_LE(n, 600u);
  const std::string entropy = svg_titled(html, "Entropy");
  EXPECT_NE(entropy.find("<title>Entropy"), std::string::npos);
  EXPECT_NE(html.find("<title>Memory"), std::string::npos);
  EXPECT_NE(html.find("Time per stage (mean over groups of steps)"), std::string::npos);
  EXPECT_LT(html.size(), 2'000'000u);
  const std::vector<size_t> counts = polyline_points(entropy);
  ASSERT_EQ(counts.size(), 2u);  // raw (faint) and smoothed
  // The one-step spike to 100 survives thinning: the raw line reaches the height of the "100" tick.
  const size_t label = entropy.find("\" class=\"ytick\">100<");
  ASSERT_NE(label, std::string::npos);
  const size_t y_begin = entropy.rfind("y=\"", label) + 3;
  const double tick_label_y = std::stod(entropy.substr(y_begin, label - y_begin));
  size_t from = 0;
  const auto raw = parse_points(attribute(entropy, "<polyline class=\"raw\"", "points", from));
  ASSERT_FALSE(raw.empty());
  double min_y = 1e9;
  for (const auto& [x, y] : raw) min_y = std::min(min_y, y);
  EXPECT_NEAR(min_y, tick_label_y - 4, 0.11);  // tick labels sit 4 px below their line
  const nlohmann::json got = check_html(out, dir.path());
  ASSERT_FALSE(got.is_null());
  EXPECT_EQ(got["errors"], nlohmann::json::array()) << got["errors"].dump(2);
}

TEST(HtmlEscape, EscapesMarkupAndControlCharacters) {
  EXPECT_EQ(html_escape("<a href=\"x\">'&'</a>"), "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
  EXPECT_EQ(html_escape(std::string("a\x01" "b\n\tc", 6)), "a\xEF\xBF\xBD" "b\n\tc");
  EXPECT_EQ(html_escape("ünï ✓"), "ünï ✓");
}

}  // namespace
}  // namespace hybridflow::report
